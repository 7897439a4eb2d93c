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
from dataclasses import dataclass, field
from typing import List, Optional

from fairseq_headprune.errors import UserError
from fairseq_headprune.options import add_arguments, from_arguments, one_line_errors, option
from fairseq_headprune.cli.common import output_checkpoint, readable_file
from fairseq_headprune.prune.recover import record_path, recover
from fairseq_headprune.prune.recovery_config import DISTILL, RecoverOptions
from fairseq_headprune.fairseq_io.checkpoint_io import check_pair_paths

USES_FAIRSEQ_OPTIONS = False


@dataclass
class RecoverCommand:
    """recover's own options (every other token is a fairseq-train option). None: not given, so RecoverOptions'
    default (the one place it is written) applies."""

    data: str = option(flag="data", metavar="DATA", help="the fairseq data folder (train and valid subsets)")
    path: str = option(flag="--path", metavar="STUDENT.pt", help="the pruned checkpoint to fine-tune")
    out: str = option(flag="--out", metavar="OUT.pt", help="the recovered checkpoint to write")
    teacher: Optional[str] = option(None, flag="--teacher", metavar="UNPRUNED.pt",
                                    help="the frozen teacher (needed unless --distill none)")
    distill: str = option(RecoverOptions.distill, flag="--distill", choices=DISTILL,
                          help="logits: KL to the teacher's tokens + label-smoothed loss; sequences: the teacher's "
                               "beam translations as targets; both; none: plain fine-tuning")
    distill_weight: Optional[float] = option(
        None, flag="--distill-weight",
        help="weight w of the KL (1 - w: the label-smoothed loss on the targets); default "
             f"{RecoverOptions.distill_weight}")
    distill_temperature: Optional[float] = option(
        None, flag="--distill-temperature",
        help=f"softmax temperature T (default {RecoverOptions.distill_temperature:g})")
    distill_hidden_weight: Optional[float] = option(
        None, flag="--distill-hidden-weight",
        help="weight β of the squared distance of every decoder layer's output to the teacher's (layer distillation, "
             "CoFi); default 0: off")
    distill_hidden_layers: Optional[str] = option(
        None, flag="--distill-hidden-layers", metavar="T1,T2,...",
        help="the teacher decoder layer (1-indexed) each student layer is compared with, for a student with fewer "
             "layers (shrink --keep-layers records its map as layers.teacher_outputs); default: one to one")
    epochs: Optional[int] = option(None, flag="--epochs", group="budget", help="epochs of the training subset "
                                                                             "(default 2)")
    updates: Optional[int] = option(None, flag="--updates", group="budget", help="updates instead of epochs")
    train_subset: str = option(RecoverOptions.train_subset, flag="--train-subset", help="the subset trained on")
    valid_subset: str = option(RecoverOptions.valid_subset, flag="--valid-subset",
                               help="validation loss for early stopping (--patience)")
    work_dir: Optional[str] = option(None, flag="--work-dir",
                                     help="fairseq's checkpoints of this run (default OUT.recover/)")
    sequence_beam: Optional[int] = option(
        None, flag="--sequence-beam",
        help="beam of the teacher's translations (--distill sequences or both; default "
             f"{RecoverOptions.sequence_beam})")
    distill_source: List[str] = option(
        (), flag="--distill-source", nargs="+", metavar="FILE", parse=list,
        help="raw source text (one sentence a line) the teacher translates once, with the model's --tokenizer and "
             "--bpe, added to the training subset as its next shard (train1): a distillation set beyond the parallel "
             "data; cached beside DATA")
    distill_nbest: int = option(RecoverOptions.distill_nbest, flag="--distill-nbest", metavar="N",
                                help="the teacher's N best translations of each --distill-source sentence, each a "
                                     "pair (at most --sequence-beam)")
    force: bool = option(False, flag="--force", help="replace an existing OUT.pt")
    train_args: List[str] = field(default_factory=list)  # every other token: fairseq-train's options, passed through


def add_args(parser) -> None:
    add_arguments(parser, RecoverCommand)


def parse_argv(argv):
    """recover's own options; every other token is a fairseq-train option, passed through."""
    parser = argparse.ArgumentParser(prog="fairseq-headprune recover", description=__doc__.split("\n")[0])
    add_args(parser)
    parsed, rest = one_line_errors(parser).parse_known_args(argv)
    return None, from_arguments(RecoverCommand, parsed, train_args=rest)


def run(cfg, args) -> None:
    for flag, path in (("--path", args.path), ("--teacher", args.teacher)):
        readable_file(flag, path)
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
                        f"{args.distill} does not use (without --distill-source)")
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
