"""`fairseq-headprune recover`: fine-tune a pruned checkpoint towards the unpruned model with fairseq-train.

  fairseq-headprune recover DATA --path SHRUNK.pt --teacher UNPRUNED.pt --out OUT.pt \
      [--distill logits|sequences|both|none] [--epochs N | --updates N] [any fairseq-train option]

Writes OUT.pt (the student's shape, weights of the best validation loss; loads wherever the student loads) and
OUT.json (hashes, data, criterion, updates, wall time, valid loss per epoch). fairseq's own checkpoints stay in
--work-dir (default OUT.recover/): rerun the same command to resume after an interruption, or with a larger
--epochs to train on. fairseq-train options (--lr, --max-tokens, --lr-scheduler, --patience, --seed, ...) pass
through unchanged; those recover sets itself, and the student's architecture, are refused.
"""
from __future__ import annotations

import argparse
import os
import time

from fairseq_headprune.errors import UserError
from fairseq_headprune.cli.common import output_checkpoint, readable_file
from fairseq_headprune.compress.recover import RecoverOptions, record_path, recover
from fairseq_headprune.fairseq_io.checkpoint_io import check_pair_paths

USES_FAIRSEQ_OPTIONS = False


def add_args(parser) -> None:
    parser.add_argument("data", metavar="DATA", help="the fairseq data folder (train and valid subsets)")
    parser.add_argument("--path", required=True, metavar="STUDENT.pt", help="the pruned checkpoint to fine-tune")
    parser.add_argument("--teacher", metavar="UNPRUNED.pt", help="the frozen teacher (needed unless --distill none)")
    parser.add_argument("--out", required=True, metavar="OUT.pt", help="the recovered checkpoint to write")
    parser.add_argument("--distill", default="logits", choices=("logits", "sequences", "both", "none"),
                        help="logits: KL to the teacher's tokens + label-smoothed loss (default); sequences: the "
                             "teacher's beam translations as targets; both; none: plain fine-tuning")
    parser.add_argument("--distill-weight", type=float, default=None,
                        help="weight w of the KL (1 - w: the label-smoothed loss on the targets); default 0.9")
    parser.add_argument("--distill-temperature", type=float, default=None, help="softmax temperature T (default 2)")
    parser.add_argument("--distill-hidden-weight", type=float, default=None,
                        help="weight β of the squared distance of every decoder layer's output to the teacher's "
                             "(layer distillation, CoFi); default 0: off")
    parser.add_argument("--distill-hidden-layers", default=None, metavar="T1,T2,...",
                        help="the teacher decoder layer (1-indexed) each student layer is compared with, for a "
                             "student with fewer layers (shrink --keep-layers records its map as "
                             "layers.teacher_outputs); default: one to one")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--epochs", type=int, help="epochs of the training subset (default 2)")
    budget.add_argument("--updates", type=int, help="updates instead of epochs")
    parser.add_argument("--train-subset", default="train")
    parser.add_argument("--valid-subset", default="valid", help="validation loss for early stopping (--patience)")
    parser.add_argument("--work-dir", help="fairseq's checkpoints of this run (default OUT.recover/)")
    parser.add_argument("--sequence-beam", type=int, default=None,
                        help="beam of the teacher's translations (--distill sequences or both; default 5)")
    parser.add_argument("--distill-source", nargs="+", default=[], metavar="FILE",
                        help="raw source text (one sentence a line) the teacher translates once, with the model's "
                             "--tokenizer and --bpe, added to the training subset as its next shard (train1): a "
                             "distillation set beyond the parallel data; cached beside DATA")
    parser.add_argument("--distill-nbest", type=int, default=1, metavar="N",
                        help="the teacher's N best translations of each --distill-source sentence, each a pair "
                             "(at most --sequence-beam; default 1)")
    parser.add_argument("--force", action="store_true", help="replace an existing OUT.pt")


def parse_argv(argv):
    """recover's own options; every other token is a fairseq-train option, passed through."""
    parser = argparse.ArgumentParser(prog="fairseq-headprune recover", description=__doc__.split("\n")[0])
    add_args(parser)
    args, rest = parser.parse_known_args(argv)
    args.train_args = rest
    return None, args


def run(cfg, args) -> None:
    for option, path in (("--path", args.path), ("--teacher", args.teacher)):
        readable_file(option, path)
    if not os.path.isdir(args.data.split(os.pathsep)[0]):
        raise UserError(f"data directory not found: {args.data}")
    output_checkpoint("--out", args.out, args.path)
    if args.teacher and os.path.exists(args.out) and os.path.realpath(args.out) == os.path.realpath(args.teacher):
        raise UserError(f"--out {args.out} is the teacher; write elsewhere")
    check_pair_paths("--out", args.out, record_path(args.out))
    given = [o for o, v in (("--distill-weight", args.distill_weight), ("--distill-temperature",
                                                                        args.distill_temperature),
                            ("--distill-hidden-weight", args.distill_hidden_weight),
                            ("--distill-hidden-layers", args.distill_hidden_layers)) if v is not None]
    if given and args.distill in ("none", "sequences"):  # no teacher in the loss: recorded and ignored otherwise
        raise UserError(f"{given[0]} weighs a distance to the teacher's forward pass, which --distill "
                        f"{args.distill} does not use")
    if args.sequence_beam is not None and args.distill not in ("sequences", "both") and not args.distill_source:
        raise UserError(f"--sequence-beam sets the beam of the teacher's translations, which --distill "
                        f"{args.distill} without --distill-source does not use")
    if args.distill_nbest != 1 and not args.distill_source:
        raise UserError("--distill-nbest sets how many translations of each --distill-source sentence are kept: "
                        "give --distill-source")
    defaults = RecoverOptions()
    options = RecoverOptions(
        teacher=args.teacher or "", out=args.out, distill=args.distill,
        distill_weight=defaults.distill_weight if args.distill_weight is None else args.distill_weight,
        distill_temperature=defaults.distill_temperature if args.distill_temperature is None
        else args.distill_temperature,
        distill_hidden_weight=defaults.distill_hidden_weight if args.distill_hidden_weight is None
        else args.distill_hidden_weight, distill_hidden_layers=args.distill_hidden_layers or "",
        epochs=args.epochs, updates=args.updates,
        train_subset=args.train_subset, valid_subset=args.valid_subset, work_dir=args.work_dir,
        sequence_beam=defaults.sequence_beam if args.sequence_beam is None else args.sequence_beam,
        distill_source=list(args.distill_source), distill_nbest=args.distill_nbest,
        train_args=list(args.train_args), force=args.force)
    options.check()  # bad settings are refused before anything loads or is written
    start = time.perf_counter()
    record = recover(args.data, args.path, options)
    print(summary(record, args.path, time.perf_counter() - start))
    print(f"wrote {args.out}\nwrote {record_path(args.out)}")


def summary(record: dict, student: str, seconds: float) -> str:
    """What the run did, as its record says: the losses fairseq validated, and why it stopped."""
    loss = lambda v: "none (no validation ran)" if v is None else f"{v:.4f}"  # noqa: E731
    stop = f"stopped early: {record['early_stop']}" if record.get("early_stop") else "ran its whole budget"
    return (f"recovered {student} in {seconds:.0f}s: {record['updates']} updates, {stop}; best valid loss "
            f"{loss(record.get('best_valid_loss'))} at {record['updates_at_best']} updates (epoch "
            f"{record.get('epoch_at_best')}), last valid loss {loss(record.get('last_valid_loss'))}")
