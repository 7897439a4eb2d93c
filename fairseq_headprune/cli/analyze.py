"""`fairseq-headprune analyze`: confidence, LRP relevance and function of each head (Voita et al.)."""
from __future__ import annotations

from fairseq_headprune.analysis import head_functions as hf
from fairseq_headprune.cli.common import options_from, results_folder
from fairseq_headprune.fairseq_io.loading import load, progress_for
from fairseq_headprune.studies import analysis


def add_args(parser) -> None:
    g = parser.add_argument_group("analyze")
    g.add_argument("--results-dir", required=True, help=f"folder for {analysis.RESULTS} and the figures")
    g.add_argument("--num-sentences", type=int, help="analyse the first N sentences (by id) of the subset")
    g.add_argument("--source-parses", metavar="FILE.conllu",
                   help="dependency parses of the subset's raw source sentences, one CoNLL-U sentence per line of "
                        "the source (UD labels: nsubj, obj/dobj, amod, advmod); without it no syntactic functions")
    g.add_argument("--frequency-text", metavar="FILE",
                   help="training source text to count token frequencies for rare-token heads, encoded with "
                        "--tokenizer/--bpe if given (else already in the model's tokens); default: the source "
                        "dictionary's counts (fairseq's dict.*.txt count the training set's tokens)")
    g.add_argument("--importance", metavar="importance.json",
                   help="importance.json of `score`: correlate relevance with I_h and compare the least important")
    g.add_argument("--positional-threshold", type=float, default=hf.POSITIONAL_THRESHOLD,
                   help="share of tokens whose maximum goes to -1 (or +1) for a positional label (Voita et al.: 0.9)")
    g.add_argument("--rare-threshold", type=float, default=hf.RARE_THRESHOLD,
                   help="share of tokens whose maximum goes to the rarest token for a rare-token label (Voita et al. "
                        "give none; default: most of the time)")
    g.add_argument("--syntactic-margin", type=float, default=hf.SYNTACTIC_MARGIN,
                   help="accuracy above the positional baseline needed for a syntactic label (Voita et al.: 10 points)")


def run(cfg, args) -> None:
    options = options_from(analysis.AnalyzeOptions, args, subset=cfg.dataset.gen_subset)
    options.check()
    with results_folder(args.results_dir):
        outputs = analysis.run(load(cfg), options, args.results_dir, progress_for(cfg, f"analyze {options.subset}"))
    for out in outputs:
        print(f"wrote {out}")
