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
    ct2_decoding(cfg.generation)  # decoding options CTranslate2 cannot apply: refused before loading
    with results_folder(args.results_dir):
        table, paths = deploy.run(load(cfg), options, args.results_dir)
    print("\n".join(deploy.target_lines(table["targets"])))
    for path in paths:
        print(f"wrote {path}")
