"""Does compress's pick rank shapes as recovery does? For every compress run of a results folder, the calibration
NLL after shrink's closed-form fits (choice.reconstructed_nll: what the pick compares the timed shapes by),
recomputed for every run's shape on one calibration, beside the run's valid loss after its recovery epochs;
Spearman's rank correlation between the two at each epoch count that several runs reached.

  python benchmarks/nll_vs_recovery.py DATA --path UNPRUNED.pt --runs RESULTS_DIR [--skip NAME,...] \
      [fairseq options: -s de -t en]

Runs with a recovery other than compress's default (a hidden-state term, --distill other than logits) and repeats
of a shape already read (the same run at another budget: the longest kept) are left out. Writes
RESULTS_DIR/nll-vs-recovery.json and .md.
"""
from __future__ import annotations

import glob
import json
import os
import sys
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)  # a PYTHONPATH snapshot of the package, when given, stays first


def add_args(parser) -> None:
    group = parser.add_argument_group("nll_vs_recovery")
    group.add_argument("--runs", required=True, metavar="RESULTS_DIR", help="a folder of compress runs' folders")


def default_recovery(record) -> bool:
    recovered = record["stages"]["recover"]
    return bool(recovered.get("recovered")) and not recovered.get("distill_hidden") and \
        recovered.get("distill", "logits") == "logits"


def shape_key(chosen) -> tuple:
    return (chosen["heads"], json.dumps(chosen.get("layers_kept"), sort_keys=True), chosen.get("ffn_percent"))


def distinct_runs(folder: str):
    """(name, chosen shape, valid losses by epoch) of each run with the default recovery, one per shape: the run
    that trained it longest."""
    best = {}
    for path in sorted(glob.glob(os.path.join(folder, "*", "compress.json"))):
        with open(path) as f:
            record = json.load(f)
        if not default_recovery(record):
            continue
        chosen = record["stages"]["choice"]["chosen"]
        losses = [e["valid_loss"] for e in record["stages"]["recover"]["epochs"]]
        key = shape_key(chosen)
        if key not in best or len(losses) > len(best[key][2]):
            best[key] = (os.path.basename(os.path.dirname(path)), chosen, losses)
    return sorted(best.values())


def rank_correlations(rows, epochs=(1, 4, 8)):
    """Spearman's rho (and its p) of the NLL after the fits against the valid loss at each epoch count, over the
    runs that reached it."""
    from scipy.stats import spearmanr

    out = {}
    for epoch in epochs:
        pairs = [(r["reconstructed_nll"], r["valid_loss"][epoch - 1]) for r in rows if len(r["valid_loss"]) >= epoch]
        if len(pairs) >= 3:
            rho, p = spearmanr(*zip(*pairs))
            out[epoch] = {"runs": len(pairs), "rho": round(float(rho), 3), "p": round(float(p), 3)}
    return out


def markdown(rows, correlations, calibration) -> str:
    lines = ["# Does the pick's measure rank shapes as recovery does? (benchmarks/nll_vs_recovery.py)", "",
             f"The calibration NLL after shrink's closed-form fits (what compress's pick compares; {calibration}), "
             "recomputed for each run's shape, beside the valid loss after recovery (compress's default: the KL to "
             "the unpruned model on the references; early stopping on valid).", "",
             "| run | shape | NLL after the fits | valid loss, epoch 1 | epoch 4 | epoch 8 |",
             "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["reconstructed_nll"]):
        losses = r["valid_loss"]
        cells = [f"{losses[e - 1]:.3f}" if len(losses) >= e else "" for e in (1, 4, 8)]
        lines.append(f"| {r['run']} | {r['shape']} | {r['reconstructed_nll']:.4f} | " + " | ".join(cells) + " |")
    lines += ["", "| valid loss after | runs | Spearman's rho | p (two-sided) |", "|---|---|---|---|"]
    lines += [f"| {e} epoch(s) | {c['runs']} | {c['rho']:+.3f} | {c['p']:.3f} |" for e, c in correlations.items()]
    return "\n".join(lines) + "\n"


def main(argv) -> int:
    from fairseq_headprune.cli import _quiet_dependencies, parse
    from fairseq_headprune.compress.options import CompressOptions
    from fairseq_headprune.compress.stages.choice import nll_after_fits
    from fairseq_headprune.compress.stages.common import max_tokens
    from fairseq_headprune.compress.stages.shrink_recipe import calibration_only_options
    from fairseq_headprune.core.shape import shape_words
    from fairseq_headprune.fairseq_io.loading import load, trust_fairseq_checkpoints
    from fairseq_headprune.records.log import atomic_output, write_json_atomic

    trust_fairseq_checkpoints()
    _quiet_dependencies()
    cfg, args = parse("nll_vs_recovery", SimpleNamespace(add_args=add_args), argv)
    loaded = load(cfg)
    from fairseq_headprune.prune.shrink import calibrate

    options = CompressOptions(out=args.runs, speedup=2.0)  # compress's defaults: its calibration
    with max_tokens(loaded, options.calibration_max_tokens):  # the same sentences and batches
        calibration = calibrate(loaded, calibration_only_options(options))
    pad = loaded.task.target_dictionary.pad()
    rows = []
    for name, chosen, losses in distinct_runs(args.runs):
        nll = nll_after_fits(loaded, options, chosen, calibration, pad)
        rows.append({"run": name, "shape": shape_words(chosen), "reconstructed_nll": nll, "valid_loss": losses})
        print(f"{name}: {rows[-1]['shape']}: NLL after the fits {nll:.4f}; valid loss {losses}", flush=True)
    correlations = rank_correlations(rows)
    words = f"{calibration.sentences} sentences of '{calibration.subset}'"
    write_json_atomic(os.path.join(args.runs, "nll-vs-recovery.json"),
                      {"calibration": calibration.provenance(), "runs": rows,
                       "spearman": {str(k): v for k, v in correlations.items()}})
    with atomic_output(os.path.join(args.runs, "nll-vs-recovery.md")) as f:
        f.write(markdown(rows, correlations, words))
    print(markdown(rows, correlations, words))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
