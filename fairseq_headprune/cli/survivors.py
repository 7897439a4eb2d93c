"""`fairseq-headprune survivors GATES.json... [--analysis HEADS_ANALYSIS.json] --results-dir DIR`: the heads an
L0 sweep keeps across λ, per type and layer, and the functions of the encoder heads that survive (Voita)."""
from __future__ import annotations

from fairseq_headprune.cli.common import results_folder
from fairseq_headprune.studies import survivors

USES_FAIRSEQ_OPTIONS = False


def add_args(parser) -> None:
    parser.add_argument("gates", nargs="+", metavar="GATES.json", help="each run's gates.json (`gates`)")
    parser.add_argument("--analysis", metavar="FILE",
                        help="heads_analysis.json of the model the runs were fine-tuned from (`analyze`)")
    parser.add_argument("--results-dir", required=True)


def run(cfg, args) -> None:
    with results_folder(args.results_dir):
        for out in survivors.run(args.gates, args.analysis, args.results_dir):
            print(f"wrote {out}")
