"""`fairseq-headprune report DATA --path CKPT --results-dir DIR`: the whole study of a model, its claims checked."""
from __future__ import annotations

import argparse
from typing import List, Sequence

from fairseq_headprune.cli.common import add_sweep_options, options_from, results_folder
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR
from fairseq_headprune.report import pipeline


def add_args(parser) -> None:
    g = parser.add_argument_group("report")
    g.add_argument("--results-dir", required=True, help="folder of every part's results and of report.md/html")
    g.add_argument("--parts", default=",".join(pipeline.PARTS),
                   help=f"parts to run, comma-separated, from {', '.join(pipeline.PARTS)}")
    g.add_argument("--references", help="raw reference file of --gen-subset (default: its decoded targets)")
    g.add_argument("--importance-subset", help="subset I_h is computed on (default: --gen-subset)")
    add_sweep_options(g, commands="ablate, prune")
    g.add_argument("--keep-one-select", choices=["bleu", "loss"], default="bleu",
                   help="keep-one: choose each layer's head by BLEU on --gen-subset (every head decoded), or by "
                        "teacher-forced NLL on --importance-subset (or --gen-subset) and decode only the chosen "
                        "heads on --gen-subset (BLEU, significance): about 20x faster")
    g.add_argument("--bootstrap-sample-ratio", type=float, default=0.5,
                   help="single, keep-one: size of each bootstrap resample as a share of the set (default: "
                        "compare-mt's 0.5, so the verdicts compare with Michel et al.'s; `ablate` defaults to 1)")
    g.add_argument("--prune-orders", default="importance,oracle,random", help="prune: orders of the whole-model curves")
    g.add_argument("--prune-step", type=float, default=0.1, help="prune: share of heads masked at each step")
    g.add_argument("--speed-percent", type=float, default=50.0,
                   help="speed: prune the heads the importance order prunes at this percent")
    g.add_argument("--speed-batch-sizes", default="1,4,16,64")
    g.add_argument("--speed-runs", type=int, default=3)
    g.add_argument("--speed-sentences", type=int, default=128)
    g.add_argument("--analyze-sentences", type=int, help="analyze: only the first N sentences (default: all)")
    g.add_argument("--shrink-percents", default=pipeline.ReportOptions.shrink_percents,
                   help="shrink: shares of the heads removed without retraining, one budget each")
    g.add_argument("--shrink-methods", default=pipeline.ReportOptions.shrink_methods,
                   help="shrink: the methods compared at every budget (see `fairseq-headprune shrink --help`)")
    g.add_argument("--shrink-calibration-subset", default=pipeline.ReportOptions.shrink_calibration_subset,
                   help="shrink: subset of DATA the pruning is fitted on (another than --gen-subset, which scores it)")
    g.add_argument("--shrink-calibration-sentences", type=int,
                   default=pipeline.ReportOptions.shrink_calibration_sentences,
                   help="shrink: calibration sentences (the first N of that subset)")
    g.add_argument("--deploy-percent", type=float, default=pipeline.ReportOptions.deploy_percent,
                   help="deploy: the share of heads its per-stack shrink removes (fitted on the shrink part's "
                        "calibration sentences), timed beside the unpruned model in fairseq and CTranslate2")
    g.add_argument("--deploy-runs", type=int, default=pipeline.ReportOptions.deploy_runs,
                   help="deploy: interleaved timing rounds")
    g.add_argument("--deploy-batch1-sentences", type=int, default=pipeline.ReportOptions.deploy_batch1_sentences,
                   help="deploy: sentences timed one at a time (latency)")
    g.add_argument("--dynamics",
                   help="dynamics.jsonl of `dynamics` for claim C5: this model's training run (default: the bundled "
                        "model's run for the bundled model, none for any other; a file of another model is judged "
                        "and the report says whose it is)")
    g.add_argument("--l0-sweep", metavar="FILE",
                   help="result file of Voita's L0 λ sweep (`compare`) for the Voita claim")
    g.add_argument("--l0-encoder-sweep", metavar="FILE",
                   help="the same with encoder self-attention gated alone (Voita's main experiment): when given, "
                        "the Voita claim's verdict is this sweep's")
    g.add_argument("--recover-study", metavar="FILE",
                   help="recover-test.json of benchmarks/recover_study.py, shown as the report's recover section "
                        "(default: the bundled model's study, for the bundled model only)")
    g.add_argument("--note", default="", help="a sentence for the report's header (e.g. how the data was sliced)")
    g.add_argument("--render-only", action="store_true",
                   help="run nothing: write the report from the result files already in --results-dir")


def own_options() -> dict:
    """The report's own option strings -> whether they take a value (read off its argument group)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_args(parser)
    return {s: action.nargs != 0 for action in parser._actions for s in action.option_strings}


def fairseq_argv(argv: Sequence[str]) -> List[str]:
    """The user's tokens without the report's own options and without the --user-dir the CLI adds."""
    own = own_options()
    out, i = [], 0
    argv = list(argv)
    if argv[:2] == ["--user-dir", PACKAGE_DIR]:
        argv = argv[2:]
    while i < len(argv):
        token = argv[i]
        name = token.split("=", 1)[0]
        if name in own:
            i += 1 + (own[name] and "=" not in token)
            continue
        out.append(token)
        i += 1
    return out


def run(cfg, args) -> None:
    options = options_from(pipeline.ReportOptions, args, subset=cfg.dataset.gen_subset)
    with results_folder(args.results_dir):
        outputs = pipeline.run(cfg, options, fairseq_argv(args.command_argv), args.results_dir)
    for out in outputs:
        print(f"wrote {out}")
