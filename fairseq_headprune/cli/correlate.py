"""`fairseq-headprune correlate A.jsonl B.jsonl`: Pearson/Spearman between two ablation result files."""
from __future__ import annotations

from fairseq_headprune.cli.common import results_folder
from fairseq_headprune.studies.correlation import correlate

USES_FAIRSEQ_OPTIONS = False


def add_args(parser) -> None:
    parser.add_argument("first", help="a results file of ablate (JSONL)")
    parser.add_argument("second", help="another results file of ablate (JSONL)")
    parser.add_argument("--results-dir", required=True)
    parser.add_argument("--field", default="delta", help="row field to correlate (default: delta)")
    parser.add_argument("--name", default=None, help="output name (default: correlation-A-vs-B)")


def run(cfg, args) -> None:
    with results_folder(args.results_dir):
        outputs = correlate(args.first, args.second, args.field, args.results_dir, args.name)
    for out in outputs:
        print(f"wrote {out}")
