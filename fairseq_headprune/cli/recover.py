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
from dataclasses import dataclass

from fairseq_headprune.errors import UserError
from fairseq_headprune.options import add_arguments, from_arguments, nested, one_line_errors, option
from fairseq_headprune.cli.common import output_checkpoint, readable_file
from fairseq_headprune.prune.recover import record_path, recover
from fairseq_headprune.prune.recovery_config import RecoverOptions
from fairseq_headprune.fairseq_io.checkpoint_io import check_pair_paths

USES_FAIRSEQ_OPTIONS = False


@dataclass
class RecoverCommand:
    """recover's arguments: the data and the student, and the recovery's options, declared once on RecoverOptions
    (every other token is a fairseq-train option)."""

    data: str = option(flag="data", metavar="DATA", help="the fairseq data folder (train and valid subsets)")
    path: str = option(flag="--path", metavar="STUDENT.pt", help="the pruned checkpoint to fine-tune")
    options: RecoverOptions = nested(RecoverOptions)


def add_args(parser) -> None:
    add_arguments(parser, RecoverCommand)


def parse_argv(argv):
    """recover's own options; every other token is a fairseq-train option, passed through."""
    parser = argparse.ArgumentParser(prog="fairseq-headprune recover", description=__doc__.split("\n")[0])
    add_args(parser)
    parsed, rest = one_line_errors(parser).parse_known_args(argv)
    command = from_arguments(RecoverCommand, parsed)
    command.options.train_args = rest
    return None, command


def run(cfg, args) -> None:
    options = args.options
    for flag, path in (("--path", args.path), ("--teacher", options.teacher or None)):
        readable_file(flag, path)
    if not os.path.isdir(args.data.split(os.pathsep)[0]):
        raise UserError(f"data directory not found: {args.data}")
    if not options.out:
        raise UserError("--out OUT.pt is required: the recovered checkpoint to write")
    output_checkpoint("--out", options.out, args.path)
    if options.teacher and os.path.exists(options.out) and \
            os.path.realpath(options.out) == os.path.realpath(options.teacher):
        raise UserError(f"--out {options.out} is the teacher; write elsewhere")
    check_pair_paths("--out", options.out, record_path(options.out))
    options.check()  # bad settings are refused before anything loads or is written
    start = time.perf_counter()
    record = recover(args.data, args.path, options)
    print(summary(record, args.path, time.perf_counter() - start))
    print(f"wrote {options.out}\nwrote {record_path(options.out)}")


def summary(record: dict, student: str, seconds: float) -> str:
    """What the run did, as its record says: the losses fairseq validated, and why it stopped."""
    loss = lambda v: "none (no validation ran)" if v is None else f"{v:.4f}"  # noqa: E731
    stop = f"stopped early: {record['early_stop']}" if record.get("early_stop") else "ran its whole budget"
    return (f"recovered {student} in {seconds:.0f}s: {record['updates']} updates, {stop}; best valid loss "
            f"{loss(record.get('best_valid_loss'))} at {record['updates_at_best']} updates (epoch "
            f"{record.get('epoch_at_best')}), last valid loss {loss(record.get('last_valid_loss'))}")
