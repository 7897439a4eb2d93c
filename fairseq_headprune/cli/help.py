"""A command's help: its own options first, grouped, one line each (`--help`); fairseq-generate's options it applies
on request (`--help-fairseq`), without those it refuses.

Every command that takes fairseq's options parses fairseq-generate's whole parser (some 600 lines of help, most of
it logging, fp16 and distributed options); `--help` shows the command's own options and the fairseq options a user
of it reaches for, and says how to see the rest.
"""
from __future__ import annotations

import argparse
import re
from typing import Dict, Iterable, List, Sequence

from fairseq_headprune.fairseq_io.fairseq_options import DECODE, INERT, RULES, SAME_CALL

FAIRSEQ_HELP = "--help-fairseq"
# fairseq-generate's options a user of any command gives most, in the order a command line holds them
COMMON_FAIRSEQ = ("data", "--path", "--gen-subset", "--task", "--source-lang", "--target-lang", "--beam",
                  "--max-tokens", "--batch-size", "--lenpen", "--max-len-a", "--max-len-b", "--bpe", "--tokenizer")
WIDTH = 30  # the column an option's help starts at


def first_clause(text: str, width: int = 100) -> str:
    """The help text's first sentence, without its parentheticals when longer than `width`, the default kept (the
    short listing; --help-fairseq has it whole)."""
    text = " ".join((text or "").split())
    default = re.search(r" \(default [^()]*\)$", text)
    if default:
        text = text[:default.start()]
    cut = re.search(r"(?<=[a-z0-9)%])[.;] ", text)
    text = text[:cut.start()] if cut else text.rstrip(".")
    if text.count("(") > text.count(")"):  # the sentence ended inside a parenthesis: without it
        text = text[:text.rindex(" (")] if " (" in text else text
    if len(text) > width and " (" in text:
        text = text[:text.index(" (")]
    return text + (default.group(0) if default else "")


def invocation(action: argparse.Action) -> str:
    """`--flag VALUE` as the command line takes it."""
    if not action.option_strings:
        return action.metavar or action.dest.upper()
    named = "--" + action.dest.replace("_", "-")
    flag = named if named in action.option_strings else max(action.option_strings, key=len)
    if action.nargs == 0:
        return flag
    value = action.metavar or (f"{{{','.join(map(str, action.choices))}}}" if action.choices else
                               action.dest.upper())
    return f"{flag} {value}"


def option_line(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    name = invocation(action)
    text = first_clause(formatter._expand_help(action)) if action.help else ""
    return f"  {name:<{WIDTH - 3}} {text}" if len(name) < WIDTH - 3 else f"  {name}  {text}"


def own_sections(parser: argparse.ArgumentParser) -> Dict[str, List[argparse.Action]]:
    """The command's own options by section (an option's declared section, else its argument group's title)."""
    sections: Dict[str, List[argparse.Action]] = {}
    for group in parser._action_groups:
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            sections.setdefault(getattr(action, "section", None) or group.title, []).append(action)
    return sections


def short_help(command: str, description: str, own: argparse.ArgumentParser,
               fairseq: Sequence[argparse.Action]) -> str:
    """The command's --help: usage, its own options grouped, the fairseq options most used, and how to see the
    others."""
    formatter = own._get_formatter()
    lines = [f"usage: fairseq-headprune {command} DATA --path CHECKPOINT [options]", "", description]
    for title, actions in own_sections(own).items():
        lines += ["", f"{title}:", *(option_line(a, formatter) for a in actions)]
    lines += ["", "fairseq-generate's options, applied as fairseq-generate applies them (the most used):",
              *(option_line(a, formatter) for a in fairseq),
              "", f"fairseq-headprune {command} {FAIRSEQ_HELP} lists every fairseq option this command applies."]
    return "\n".join(lines)


def accepted_fairseq_dests() -> set:
    """The fairseq fields the commands apply (decoding, the same call, or inert): the others are refused."""
    applied = {name for rules in RULES.values() for name, kind in rules.items() if kind in (DECODE, SAME_CALL, INERT)}
    return applied | {"data", "task", "bpe", "tokenizer"}  # the registry choices, applied as fairseq-generate does


def fairseq_actions(parser: argparse.ArgumentParser, own: Iterable[str],
                    refused: Sequence[str] = ()) -> List[argparse.Action]:
    """fairseq-generate's options in `parser` that the command applies: not its own (`own`: their dests), not
    refused by RULES (an option RULES does not know is refused when given) or by the command (`refused` flags)."""
    mine, accepted = set(own), accepted_fairseq_dests()
    return [a for a in parser._actions if a.dest not in mine and not isinstance(a, argparse._HelpAction)
            and a.dest in accepted and not set(a.option_strings) & set(refused) and a.help != argparse.SUPPRESS]


def common_fairseq(actions: Sequence[argparse.Action]) -> List[argparse.Action]:
    """The COMMON_FAIRSEQ options among `actions`, in COMMON_FAIRSEQ's order."""
    by_name = {name: a for a in actions for name in (*a.option_strings, a.dest)}
    return [by_name[name] for name in COMMON_FAIRSEQ if name in by_name]


def fairseq_help(command: str, parser: argparse.ArgumentParser, actions: Sequence[argparse.Action]) -> str:
    """--help-fairseq: every fairseq-generate option the command applies, with fairseq's own help, by section."""
    formatter = parser._get_formatter()
    kept = {id(a) for a in actions}
    lines = [f"fairseq-generate's options that fairseq-headprune {command} applies (as fairseq-generate applies "
             "them; any other is refused in one line):"]
    for group in parser._action_groups:
        shown = [a for a in group._group_actions if id(a) in kept]
        if shown:
            lines += ["", f"{group.title}:"]
            for action in shown:
                lines.append(f"  {invocation(action)}")
                text = " ".join(formatter._expand_help(action).split()) if action.help else ""
                lines += [f"      {text}"] if text else []
    return "\n".join(lines)
