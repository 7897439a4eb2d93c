"""`fairseq-headprune deploy DATA --path CKPT --results-dir DIR`: the deployment table, BLEU and decoding speed of the
unpruned model, its own per-stack shrink and any --compare checkpoints in fairseq and CTranslate2 (float32, int8).

  fairseq-headprune deploy DATA --path CKPT --results-dir DIR --gen-subset test --beam 5 --batch-size 64 \\
      [--shrink-percent 50 --shape per-stack --calibration-subset valid] [--compare NAME=CKPT ...] [--runs 3] \\
      [--candidate NAME] [--ceilings 8/4 8/3 8/4:ffn=75% ...] [--references REF] [fairseq decoding options]

Writes DIR/deploy.json, DIR/deploy.md, DIR/deploy.png (BLEU against speed, the frontier drawn) and, with
--shrink-percent, DIR/models/shrink-ps50.pt (its record beside it; reused by a rerun with the same options).
"""
from __future__ import annotations

from fairseq_headprune.cli.common import ResultsDir, results_folder
from fairseq_headprune.options import add_arguments, from_arguments
from fairseq_headprune.errors import UserError
from fairseq_headprune.studies import deploy
from fairseq_headprune.engines.ct2 import ct2_decoding
from fairseq_headprune.fairseq_io.loading import load


def add_args(parser) -> None:
    g = parser.add_argument_group("deploy")
    add_arguments(g, ResultsDir)
    add_arguments(g, deploy.DeployOptions)  # the table's own options, declared on DeployOptions


def run(cfg, args) -> None:

    options = from_arguments(deploy.DeployOptions, args, subset=cfg.dataset.gen_subset)
    shrink_only = ("shape", "calibration_subset", "calibration_sentences")
    given = [name for name in shrink_only if getattr(args, name) is not None]
    if not options.shrink_percent and given:
        raise UserError(f"--{given[0].replace('_', '-')} sets deploy's own shrink, which --shrink-percent 0 turns off")
    options.check()
    deploy.check_candidate(options)
    ct2_decoding(cfg.generation)  # decoding options CTranslate2 cannot apply: refused before loading
    with results_folder(args.results_dir):
        table, paths = deploy.run(load(cfg), options, args.results_dir)
    print("\n".join(deploy.target_lines(table["targets"])))
    for path in paths:
        print(f"wrote {path}")
