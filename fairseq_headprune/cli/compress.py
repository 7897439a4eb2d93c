"""`fairseq-headprune compress DATA --path CKPT --out DIR --speedup 1.5`: from a checkpoint to a deployable model at a
stated speed (or the fastest within a stated BLEU loss), in one staged, resumable run (compress.pipeline).

  fairseq-headprune compress DATA --path CKPT --out DIR --speedup 1.5 [--engine ct2-int8|ct2-float32|fairseq] \\
      [--budget-epochs 4] [--gen-subset test] [fairseq decoding options: --beam 5 --max-tokens 4000 ...]
  fairseq-headprune compress DATA --path CKPT --out DIR --max-bleu-loss 0.3 ...

Writes DIR/ct2/ (the CTranslate2 model, ct2 engines), DIR/model.pt (the pruned fairseq checkpoint),
DIR/MODEL_CARD.md and DIR/compress.json; DIR/stages/ keeps each stage, so the same command resumes.
"""
from __future__ import annotations

import shlex

from fairseq_headprune.compress import levers
from fairseq_headprune.compress.pipeline import STAGES, CompressOptions, recover_args


def add_args(parser) -> None:
    g = parser.add_argument_group("compress")
    g.add_argument("--out", required=True, metavar="DIR", help="the folder of the model, its card and its stages")
    g.add_argument("--speedup", type=float, help="at least this many times the unpruned model's speed in --engine, "
                   "at equal work")
    g.add_argument("--max-bleu-loss", type=float, help="instead: the fastest model that loses at most this much BLEU "
                   "on a held-out split of valid")
    g.add_argument("--engine", default="ct2-int8", help=f"where the model runs: {', '.join(levers.ENGINES)}")
    g.add_argument("--budget-epochs", type=int, default=4, help="recovery epochs at most (early stopping on valid; "
                   "a rerun with more extends; 0: no recovery)")
    g.add_argument("--references", help="raw references of --gen-subset for BLEU (default: the binarised targets)")
    g.add_argument("--calibration-subset", default="train", help="sentences the heads are chosen and the model "
                   "reconstructed on (never --gen-subset)")
    g.add_argument("--calibration-sentences", type=int, default=1000)
    g.add_argument("--calibration-max-tokens", type=int, default=1000, help="tokens per calibration batch")
    g.add_argument("--window-steps", type=int, default=1000, help="Adam steps of each pruned attention sublayer's "
                   "window fit (shrink --window-steps)")
    g.add_argument("--window-lr", type=float, default=3e-4)
    g.add_argument("--timing-subset", default="valid", help="sentences the speeds are measured on")
    g.add_argument("--timing-sentences", type=int, default=300)
    g.add_argument("--runs", type=int, default=3, help="interleaved timing rounds")
    g.add_argument("--significance", type=float, default=levers.SIGNIFICANCE,
                   help="a cost-table row's time saving counts when its slice was faster in significantly more "
                        "batches than not: sign test p below this (1: every measured saving counts)")
    g.add_argument("--heldout-sentences", type=int, default=500,
                   help="--max-bleu-loss: the first N sentences of valid choose; the rest early-stop the recovery")
    g.add_argument("--check-sentences", type=int, default=100, help="sentences of the pruned-model and export checks")
    g.add_argument("--recover-args", default="", metavar="'FAIRSEQ-TRAIN OPTIONS'",
                   help="fairseq-train options of the recovery, as one argument: --recover-args='--lr 3e-4' (device "
                        "and distributed options too)")
    g.add_argument("--cost-cache", default=levers.default_cache(),
                   help="folder of cost tables measured before (per model, engine, CPU); '' for none")
    g.add_argument("--stop-after", choices=STAGES, help="stop after this stage (the same command without it goes on)")


def user_argv(argv):
    """The tokens as the user gave them (without the --user-dir the command adds for itself)."""
    from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR

    out = list(argv)
    if out[:2] == ["--user-dir", PACKAGE_DIR]:
        out = out[2:]
    return out


def run(cfg, args) -> None:
    from fairseq_headprune.compress import pipeline
    from fairseq_headprune.fairseq_io.loading import load

    options = CompressOptions(
        out=args.out, speedup=args.speedup, max_bleu_loss=args.max_bleu_loss, engine=args.engine,
        budget_epochs=args.budget_epochs, gen_subset=cfg.dataset.gen_subset, references=args.references,
        calibration_subset=args.calibration_subset, calibration_sentences=args.calibration_sentences,
        calibration_max_tokens=args.calibration_max_tokens, window_steps=args.window_steps,
        window_lr=args.window_lr, timing_subset=args.timing_subset, timing_sentences=args.timing_sentences,
        runs=args.runs, heldout_sentences=args.heldout_sentences, significance=args.significance, check_sentences=args.check_sentences,
        recover_args=recover_args(args.recover_args), cost_cache=args.cost_cache or None,
        stop_after=args.stop_after,
        command="fairseq-headprune compress " + shlex.join(user_argv(args.command_argv)))
    options.check()  # every option applied or refused before the model loads
    record = pipeline.run(load(cfg), options)
    if record:
        for name in ("ct2", "model.pt", "MODEL_CARD.md", "compress.json"):
            if name != "ct2" or record["stages"]["export"].get("ct2"):
                print(f"wrote {options.out.rstrip('/')}/{name}")
