"""`fairseq-headprune COMMAND [fairseq options] [command options]`: argument parsing and one call per command.

Every command takes fairseq-generate's own options (data folder, --path, --gen-subset, --max-tokens, --beam, ...)
and defaults to `--task translation_headprune` with this package as `--user-dir`. Each command is one thin module
of this package, named as the command: `add_args(parser)` and `run(cfg, args)`, which checks the cheap things
(options, input files, the results folder), builds the study's options and calls the study
(fairseq_headprune.studies). The studies never see argparse.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
import warnings
from typing import List, Optional

from fairseq_headprune.cli import help as help_text
from fairseq_headprune.fairseq_io import fairseq_errors
from fairseq_headprune.fairseq_io import fairseq_options
from fairseq_headprune.errors import UserError
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR, trust_fairseq_checkpoints
from fairseq_headprune.options import one_line_errors

COMMANDS = {
    "score": ("fairseq_headprune.cli.score", "head importance I_h = E|dL/dxi_h| (Michel et al.)"),
    "ablate": ("fairseq_headprune.cli.ablate", "single-head and keep-one-head ablations with significance"),
    "prune": ("fairseq_headprune.cli.prune", "pruning curves: importance, oracle or random order"),
    "remove": ("fairseq_headprune.cli.remove", "write a checkpoint whose given heads are physically gone"),
    "speed": ("fairseq_headprune.cli.speed", "generation speed of unpruned, masked and pruned models"),
    "dynamics": ("fairseq_headprune.cli.dynamics", "pruning curves of every epoch of a training run"),
    "correlate": ("fairseq_headprune.cli.correlate", "Pearson/Spearman between two ablation result files"),
    "report": ("fairseq_headprune.cli.report", "the whole study of a model, its claims checked"),
    "analyze": ("fairseq_headprune.cli.analyze", "confidence, LRP relevance, function of each head (Voita)"),
    "gates": ("fairseq_headprune.cli.gates", "heads kept by the L0 gates of a gated checkpoint (Voita)"),
    "compare": ("fairseq_headprune.cli.compare", "Michel's I_h pruning vs Voita's L0 gates, equal heads kept"),
    "survivors": ("fairseq_headprune.cli.survivors", "heads an L0 sweep keeps across λ, by type, layer, function"),
    "shrink": ("fairseq_headprune.cli.shrink", "prune to a budget without retraining (Kwon et al. 2022)"),
    "recover": ("fairseq_headprune.cli.recover", "fine-tune a pruned model towards the unpruned one (fairseq-train)"),
    "export-ct2": ("fairseq_headprune.cli.export_ct2",
                   "a CTranslate2 model of any checkpoint, checked against fairseq"),
    "deploy": ("fairseq_headprune.cli.deploy", "BLEU and speed in fairseq and CTranslate2, unpruned vs pruned"),
    "compress": ("fairseq_headprune.cli.compress", "a deployable model at a stated speed, in one resumable run"),
    "translate": ("fairseq_headprune.cli.translate", "raw text in, translations out, with an exported model folder"),
}


def usage() -> str:
    lines = ["usage: fairseq-headprune COMMAND DATA --path CHECKPOINT [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "fairseq-headprune COMMAND --help lists a command's own options and the fairseq-generate options "
              f"most used; COMMAND {help_text.FAIRSEQ_HELP} every fairseq option it applies."]
    return "\n".join(lines)


def parser_for(command: str, module) -> argparse.ArgumentParser:
    """The command's parser: fairseq-generate's options and the command's own (or its own only), every usage error
    one line (options.one_line_errors)."""
    if not getattr(module, "USES_FAIRSEQ_OPTIONS", True):  # fairseq not imported: translate stays quiet and quick
        parser = argparse.ArgumentParser(prog=f"fairseq-headprune {command}", description=module.__doc__.split("\n")[0])
    else:
        from fairseq import options  # fairseq's parser for the commands that take its options (an optional weight)

        parser = options.get_generation_parser(default_task="translation_headprune")
        parser.prog = f"fairseq-headprune {command}"
    module.add_args(parser)
    return one_line_errors(parser)  # a usage error is one line, not fairseq's option list


def print_help(command: str, module, argv: List[str]) -> None:
    """--help: the command's own options and the fairseq options most used; --help-fairseq: every fairseq option
    it applies (under --task's options, translation_headprune's by default)."""
    from fairseq.tasks import TASK_REGISTRY  # the task's options (DATA, -s, -t) join the parser as fairseq adds them

    own = argparse.ArgumentParser(add_help=False)
    module.add_args(own)
    parser = parser_for(command, module)
    task = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--task"), "translation_headprune")
    TASK_REGISTRY[task if task in TASK_REGISTRY else "translation_headprune"].add_args(parser)
    fairseq = help_text.fairseq_actions(parser, {a.dest for a in own._actions},
                                        getattr(module, "REFUSED_FAIRSEQ_OPTIONS", ()))
    if help_text.FAIRSEQ_HELP in argv:
        print(help_text.fairseq_help(command, parser, fairseq))
    else:
        print(help_text.short_help(command, COMMANDS[command][1], own, help_text.common_fairseq(fairseq)))


def wants_help(module, argv: List[str]) -> bool:
    """Help asked of a command that takes fairseq's options (the others print argparse's own, which is short)."""
    takes_fairseq = getattr(module, "USES_FAIRSEQ_OPTIONS", True) and not hasattr(module, "parse_argv")
    return takes_fairseq and any(a in ("-h", "--help", help_text.FAIRSEQ_HELP) for a in argv)


def parse(command: str, module, argv: List[str]):
    if hasattr(module, "parse_argv"):  # a command that parses for itself (recover: fairseq-train's options)
        return module.parse_argv(argv)
    parser = parser_for(command, module)
    if not getattr(module, "USES_FAIRSEQ_OPTIONS", True):
        return None, parser.parse_args(argv)
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    if not any(a == "--user-dir" or a.startswith("--user-dir=") for a in argv):
        argv = ["--user-dir", PACKAGE_DIR] + argv
    try:
        args = options.parse_args_and_arch(parser, input_args=argv)
    except ValueError as e:  # fairseq's own checks of option combinations ("Cannot combine --fp16 and --tpu")
        raise UserError(f"bad options: {str(e).splitlines()[0]}") from None
    args.command_argv = [a for a in argv]  # the tokens as given (report renders each part's command line from them)
    try:
        cfg = convert_namespace_to_omegaconf(args)
    except Exception as e:  # hydra's message names the option that does not fit
        hint = " (--tokenizer moses needs --source-lang and --target-lang)" if "tokenizer" in str(e) else ""
        raise UserError(f"bad options: {str(e).splitlines()[0]}{hint}") from None
    fairseq_options.check(cfg)  # every option applied as fairseq-generate applies it, or refused here
    return cfg, args


def _quiet_dependencies() -> None:
    """fairseq, hydra and torch warn about their own deprecations at every start; users cannot act on those."""
    for category in (UserWarning, FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        level=os.environ.get("LOGLEVEL", "WARNING").upper(),
        stream=sys.stderr,
        force=True,
    )
    logging.getLogger("hydra").setLevel(logging.WARNING)


INTERRUPTED = 130  # the shell's code for a process ended by SIGINT


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        near = difflib.get_close_matches(command, COMMANDS, n=1, cutoff=0.6)
        hint = f" (did you mean {near[0]}?)" if near else ""
        print(f"fairseq-headprune: error: unknown command '{command}'{hint}; fairseq-headprune --help lists them",
              file=sys.stderr)
        return 2
    trust_fairseq_checkpoints()
    _quiet_dependencies()
    module = importlib.import_module(COMMANDS[command][0])
    if wants_help(module, rest):
        print_help(command, module, rest)
        return 0
    try:
        cfg, args = parse(command, module, rest)
        code = module.run(cfg, args)  # a command with more outcomes than success returns its exit code
    except KeyboardInterrupt:
        print(f"fairseq-headprune {command}: interrupted: every file already written is whole; the same command "
              "resumes where its results are resumable", file=sys.stderr)
        return INTERRUPTED
    except Exception as e:  # noqa: BLE001 - fairseq's failures on the user's input are one line too
        message = fairseq_errors.user_message(e)
        if message is None:
            raise
        print(f"fairseq-headprune {command}: error: {message}", file=sys.stderr)
        return 2
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
