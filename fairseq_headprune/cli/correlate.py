"""`fairseq-headprune correlate A.jsonl B.jsonl`: Pearson/Spearman between two ablation result files."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fairseq_headprune.cli.common import results_dir, results_folder
from fairseq_headprune.options import add_arguments, from_arguments, option
from fairseq_headprune.studies.correlation import correlate

USES_FAIRSEQ_OPTIONS = False


@dataclass
class CorrelateArgs:
    """correlate's options."""

    first: str = option(flag="first", help="a results file of ablate (JSONL)")
    second: str = option(flag="second", help="another results file of ablate (JSONL)")
    results_dir: str = results_dir()
    field: str = option("delta", flag="--field", help="row field to correlate")
    name: Optional[str] = option(None, flag="--name", help="output name (default: correlation-A-vs-B)")


def add_args(parser) -> None:
    add_arguments(parser, CorrelateArgs)


def run(cfg, args) -> None:
    a = from_arguments(CorrelateArgs, args)
    with results_folder(a.results_dir):
        outputs = correlate(a.first, a.second, a.field, a.results_dir, a.name)
    for out in outputs:
        print(f"wrote {out}")
