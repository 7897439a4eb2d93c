"""`fairseq-headprune survivors GATES.json... [--analysis HEADS_ANALYSIS.json] --results-dir DIR`: the heads an
L0 sweep keeps across λ, per type and layer, and the functions of the encoder heads that survive (Voita)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from fairseq_headprune.cli.common import results_dir, results_folder
from fairseq_headprune.options import add_arguments, from_arguments, option
from fairseq_headprune.studies import survivors

USES_FAIRSEQ_OPTIONS = False


@dataclass
class SurvivorsArgs:
    """survivors' options."""

    gates: List[str] = option(flag="gates", nargs="+", metavar="GATES.json", help="each run's gates.json (`gates`)")
    results_dir: str = results_dir()
    analysis: Optional[str] = option(None, flag="--analysis", metavar="FILE",
                                     help="heads_analysis.json of the model the runs were fine-tuned from (`analyze`)")


def add_args(parser) -> None:
    add_arguments(parser, SurvivorsArgs)


def run(cfg, args) -> None:
    a = from_arguments(SurvivorsArgs, args)
    with results_folder(a.results_dir):
        for out in survivors.run(a.gates, a.analysis, a.results_dir):
            print(f"wrote {out}")
