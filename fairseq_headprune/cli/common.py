"""What every command checks before it starts work, and how options reach a study."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Type, TypeVar

from fairseq_headprune.errors import UserError
from fairseq_headprune.options import from_arguments, option
from fairseq_headprune.records.log import FolderLock

T = TypeVar("T")


def options_from(cls: Type[T], args, **overrides: Any) -> T:
    """A study's options dataclass filled from argparse's namespace (options.from_arguments), then `overrides`."""
    return from_arguments(cls, args, **overrides)


def results_dir(help: str = "the results folder (created if needed; one process writes it at a time)"):
    """The --results-dir field of a command's options: one name and one declaration for every command."""
    return option(flag="--results-dir", metavar="DIR", help=help)


@dataclass
class ResultsDir:
    """The --results-dir of a command whose study takes the folder as an argument."""

    results_dir: str = results_dir()


def results_folder(folder: str, shard: Optional[Tuple[int, int]] = None) -> FolderLock:
    """The results folder, created if needed, writable, and locked for this process (use as a context manager)."""
    return FolderLock(folder, shard)


def at_least(option: str, value, minimum) -> None:
    if value is None or value < minimum:
        raise UserError(f"{option} must be at least {minimum}, not {value}")


def readable_file(option: str, path: Optional[str]) -> None:
    if path and not os.path.isfile(path):
        raise UserError(f"{option}: no such file: {path}")


def output_checkpoint(option: str, out: str, source: str) -> None:
    """A checkpoint to write: not a folder, in a writable folder, and never the input itself (links resolved)."""
    if os.path.isdir(out):
        raise UserError(f"{option} {out} is a folder; name the checkpoint file to write")
    folder = os.path.dirname(os.path.abspath(out)) or "."
    if not os.path.isdir(folder):
        raise UserError(f"{option}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UserError(f"{option}: folder {folder} is not writable")
    if os.path.exists(out) and os.path.realpath(out) == os.path.realpath(source):
        raise UserError(f"{option} {out} is the checkpoint being read ({os.path.realpath(source)}); write elsewhere")
