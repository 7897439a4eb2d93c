"""`fairseq-headprune deploy DATA --path CKPT --results-dir DIR`: the deployment table, BLEU and decoding speed of the
unpruned model, its own per-stack shrink and any --compare checkpoints in fairseq and CTranslate2 (float32, int8).

  fairseq-headprune deploy DATA --path CKPT --results-dir DIR --gen-subset test --beam 5 --batch-size 64 \\
      [--shrink-percent 50 --shape per-stack --calibration-subset valid] [--compare NAME=CKPT ...] [--runs 3] \\
      [--candidate NAME] [--ceilings 8/4 8/3 8/4:ffn=75% ...] [--references REF] [fairseq decoding options]

Writes DIR/deploy.json, DIR/deploy.md, DIR/deploy.png (BLEU against speed, the frontier drawn) and, with
--shrink-percent, DIR/models/shrink-ps50.pt (its record beside it; reused by a rerun with the same options).
"""
from __future__ import annotations

from fairseq_headprune.cli.common import options_from, results_folder
from fairseq_headprune.errors import UserError
from fairseq_headprune.studies import deploy


def add_args(parser) -> None:
    g = parser.add_argument_group("deploy")
    g.add_argument("--results-dir", required=True, help="folder of the table, its figure and the shrunk model")
    g.add_argument("--references", help="raw reference file of --gen-subset for BLEU (default: the binarised targets)")
    g.add_argument("--compare", nargs="+", default=(), metavar="NAME=CKPT",
                   help="pruned or recovered checkpoints to put beside the unpruned one")
    g.add_argument("--shrink-percent", type=float, default=deploy.DeployOptions.shrink_percent,
                   help="shrink the model itself, removing this share of its heads (0: no shrink of its own)")
    g.add_argument("--shape", choices=("free", "per-stack"),
                   help="the shrink's shape (default per-stack: what CTranslate2 runs without padding)")
    g.add_argument("--calibration-subset", help="the shrink's calibration subset (default valid)")
    g.add_argument("--calibration-sentences", type=int, help="the shrink's calibration sentences (default 1000)")
    g.add_argument("--runs", type=int, default=deploy.DeployOptions.runs, help="interleaved timing rounds")
    g.add_argument("--candidate", metavar="NAME",
                   help="the per-stack model the targets judge, chosen beforehand on held-out data (default: the "
                        "best of the table on this set, which flatters it when several are compared)")
    g.add_argument("--batch1-sentences", type=int, default=deploy.DeployOptions.batch1_sentences,
                   help="sentences timed one at a time (latency)")
    g.add_argument("--ceilings", nargs="+", default=(), metavar="ENC/DEC[:ffn=P%,vocab=P%]",
                   help="shapes timed in CTranslate2 int8 at equal work as crude slices of the unpruned model (the "
                        "first heads per layer, FFN units, target words): what each shape would run at")


def heads_per_layer(model_cfg) -> dict:
    """{stack: {heads per attention sublayer}} of a checkpoint's model config (its kept_heads over the
    architecture's counts), read without building the model."""
    import json

    get = (lambda k: model_cfg.get(k)) if hasattr(model_cfg, "get") else (lambda k: getattr(model_cfg, k, None))
    kept = json.loads(get("kept_heads") or "{}")
    counts = {"encoder": set(), "decoder": set()}
    for attn_type, stack, layers, heads in (
            ("enc-self", "encoder", get("encoder_layers"), get("encoder_attention_heads")),
            ("dec-self", "decoder", get("decoder_layers"), get("decoder_attention_heads")),
            ("enc-dec", "decoder", get("decoder_layers"), get("decoder_attention_heads"))):
        for layer in range(1, int(layers or 0) + 1):
            ids = kept.get(attn_type, {}).get(str(layer))
            counts[stack].add(len(ids) if ids is not None else int(heads or 0))
    return counts


def check_candidate(options) -> None:
    """--candidate names the per-stack model the targets judge: a free-shape one is refused before any timing
    (the table would time every model, then give it no verdict)."""
    import torch

    if options.candidate is None:
        return
    if options.candidate == options.shrunk_name():
        if options.shape != "per-stack":
            raise UserError(f"--candidate {options.candidate} is deploy's own --shape {options.shape} shrink: the "
                            "targets judge a per-stack model")
        return
    path = dict(options.named_checkpoints())[options.candidate]
    state = torch.load(path, map_location="cpu", weights_only=False)
    model_cfg = (state.get("cfg") or {}).get("model") or state.get("args")
    counts = heads_per_layer(model_cfg) if model_cfg is not None else {}
    if any(len(c) > 1 for c in counts.values()):
        shown = ", ".join(f"{stack} {sorted(c)}" for stack, c in counts.items())
        raise UserError(f"--candidate {options.candidate} has a free shape (heads per layer: {shown}): the targets "
                        "judge a per-stack model (shrink --shape per-stack)")


def run(cfg, args) -> None:
    from fairseq_headprune.fairseq_io.loading import load

    from fairseq_headprune.compress.export import ct2_decoding

    shrink_options = ("shape", "calibration_subset", "calibration_sentences")
    given = [name for name in shrink_options if getattr(args, name) is not None]
    if not args.shrink_percent and given:
        raise UserError(f"--{given[0].replace('_', '-')} sets deploy's own shrink, which --shrink-percent 0 turns off")
    defaults = {name: getattr(deploy.DeployOptions, name) for name in shrink_options if name not in given}
    options = options_from(deploy.DeployOptions, args, subset=cfg.dataset.gen_subset, compare=tuple(args.compare),
                           ceilings=tuple(args.ceilings), **defaults)
    options.check()
    check_candidate(options)
    ct2_decoding(cfg.generation)  # decoding options CTranslate2 cannot apply: refused before loading
    with results_folder(args.results_dir):
        table, paths = deploy.run(load(cfg), options, args.results_dir)
    print("\n".join(deploy.target_lines(table["targets"])))
    for path in paths:
        print(f"wrote {path}")
