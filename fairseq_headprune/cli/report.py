"""`fairseq-headprune report DATA --path CKPT --results-dir DIR`: the whole study of a model, its claims checked."""
from __future__ import annotations

import argparse
from typing import List, Sequence

from fairseq_headprune.cli.common import ResultsDir, options_from, results_folder
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR
from fairseq_headprune.options import add_arguments
from fairseq_headprune.report import parts, pipeline


def add_args(parser) -> None:
    g = parser.add_argument_group("report")
    add_arguments(g, ResultsDir)
    add_arguments(g, parts.ReportOptions)  # the report's own options, declared on ReportOptions


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
    options = options_from(parts.ReportOptions, args, subset=cfg.dataset.gen_subset)
    with results_folder(args.results_dir):
        outputs = pipeline.run(cfg, options, fairseq_argv(args.command_argv), args.results_dir)
    for out in outputs:
        print(f"wrote {out}")
