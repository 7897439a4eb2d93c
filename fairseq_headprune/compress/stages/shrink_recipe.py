"""The one place compress builds shrink's options: the choice's probes and fits, the shrink stage and the export's
vocabulary trim read them alike (window fit 1000 steps, lr 3e-4, train calibration: the recipe the recover study
measured best); and a shape shrunk with them."""
from __future__ import annotations

import os
from typing import Dict, Optional

from fairseq_headprune.prune.reconstruct import ReconstructionOptions
from fairseq_headprune.prune.shrink import shrink, write_checkpoint
from fairseq_headprune.prune.shrink_options import ShrinkOptions
from fairseq_headprune.compress.stages.common import data_sha, max_tokens
from fairseq_headprune.prune.window_fit import WindowOptions
from fairseq_headprune.records.identity import file_sha256


def keep_layers_spec(dec_layers: Optional[int] = None, enc_layers: Optional[int] = None) -> Optional[str]:
    """shrink's --keep-layers for a shape's depths (the choice's layer search reads the same counts)."""
    parts = [f"{s}:{n}" for s, n in (("dec", dec_layers), ("enc", enc_layers)) if n]
    return ",".join(parts) or None


def shrink_options(options, heads: str, dec_layers: Optional[int] = None,
                   ffn_percent: float = 100.0, enc_layers: Optional[int] = None):
    """The one place compress builds shrink's options (the removed heads given: the choice made them; with a
    decoder depth, the layers shrink's importance selection keeps, the heads naming the kept layers renumbered;
    with an FFN share, the units shrink's mask Fisher keeps in every FFN, after the heads)."""
    fitted = bool(heads or dec_layers or enc_layers)  # the window fit refits sublayers that lost heads or inputs
    return ShrinkOptions(heads=heads or None, keep_layers=keep_layers_spec(dec_layers, enc_layers),
                         layer_selection="importance", ffn_keep=ffn_percent,
                         calibration_subset=options.calibration_subset,
                         calibration_sentences=options.calibration_sentences, calibration_seed=options.sample_seed,
                         check_sentences=options.check_sentences,
                         reconstruction=ReconstructionOptions(window=options.window if fitted else WindowOptions()))


def trim_options(options):
    """shrink's options for the export's vocabulary trim (--keep-vocab): the trim checked on --check-sentences of
    the calibration subset, as `shrink --keep-vocab` alone checks it."""
    return ShrinkOptions(calibration_subset=options.calibration_subset,
                         calibration_sentences=options.calibration_sentences, calibration_seed=options.sample_seed,
                         check_sentences=options.check_sentences, vocabulary=options.vocabulary)


def calibration_only_options(options):
    """shrink's options for the choice's calibration (the same sentences and batches as the shrink's)."""
    return ShrinkOptions(remove="1", calibration_subset=options.calibration_subset,
                         calibration_sentences=options.calibration_sentences, calibration_seed=options.sample_seed)


def settings(loaded, options) -> Dict:
    """What every shrink of this run reads (the choice's probes and the stage alike)."""
    o = options
    return {"calibration": [o.calibration_subset, o.calibration_sentences, o.calibration_max_tokens,
                            {"seed": o.sample_seed}],
            "window": [o.window.steps, o.window.lr], "check_sentences": o.check_sentences,
            "data": data_sha(loaded, o.calibration_subset)}


def shrink_heads(folder: str, loaded, options, heads: str, layers_kept: Optional[Dict] = None,
                 ffn_percent: float = 100.0) -> Dict:
    """shrink with these heads removed (and these layers kept: shrink's importance selection, checked to keep
    the very layers the choice recorded, the heads naming them renumbered 1..N; and every FFN at this share of
    its units)."""
    kept = {s: len(v) for s, v in (layers_kept or {}).items()}
    opts = shrink_options(options, heads, kept.get("dec"), ffn_percent, kept.get("enc"))
    path = os.path.join(folder, "model.pt")
    with max_tokens(loaded, options.calibration_max_tokens), \
            open(os.path.join(folder, "shrink.log"), "a", encoding="utf-8") as log_file:
        def log(line: str) -> None:  # every sublayer's fit, in the stage's own log
            log_file.write(line + "\n")
            log_file.flush()

        result, calibration = shrink(loaded, opts, log)
        if layers_kept and {s: list(v) for s, v in result.layers.kept.items()} != layers_kept:
            raise RuntimeError(f"shrink kept the layers {dict(result.layers.kept)}, the choice {layers_kept}: "
                               "the layer selection differs on the same sentences")
        record = write_checkpoint(loaded, result, calibration, opts, path, os.path.join(folder, "model.json"),
                                  log)

    return {"checkpoint": path, "checkpoint_sha256": file_sha256(path), "heads_kept": record["heads_kept"],
            "heads_total": record["heads_total"], "params_before": record["params_before"],
            "params_after": record["params_after"], "calibration": record["calibration"],
            "layers": record["layers"], "shrink_options": record["options"]}
