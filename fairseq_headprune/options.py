"""Options declared once, on the dataclasses the library takes (fairseq's pattern, `gen_parser_from_dataclass`).

A field made with `option(...)` carries its command-line flag, help and choices in its metadata; its default is the
dataclass's own. `add_arguments` builds the parser's arguments from them (nested dataclasses included) and
`from_arguments` builds the options back from the parsed namespace, so a default, a help text and a check are each
written in one place and nothing is copied field by field between layers. The library itself never sees argparse.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import math
import re
import typing
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence

from fairseq_headprune.errors import UserError


def option(default: Any = dataclasses.MISSING, *, flag: str, help: str, choices: Optional[Sequence[str]] = None,
           metavar: Optional[str] = None, negate: bool = False, parse: Optional[Callable[[str], Any]] = None,
           shown: Optional[str] = None, group: Optional[str] = None, nargs: Optional[str] = None,
           always: bool = False, section: Optional[str] = None):
    """A dataclass field with its command-line form: `negate` makes a True default a `--no-...` switch, `parse`
    turns the given text into the field's value (shown: the default as the user would type it; a ValueError it
    raises is the user's one-line error), and fields of one `group` are mutually exclusive on the command line;
    nargs as argparse's (parse then takes the list; a list option given twice takes both lists). A flag without a
    leading '-' is a positional argument. A float field takes finite numbers only (`finite_float`). `always`: a
    rendered command line says it even at its default (report.parts.options_argv). `section`: the heading the
    command's --help lists it under (cli.help)."""
    metadata = {"flag": flag, "help": help, "choices": choices, "metavar": metavar, "negate": negate, "parse": parse,
                "shown": shown, "group": group, "nargs": nargs, "always": always, "section": section}
    return dataclasses.field(default=default, metadata=metadata)


def finite_float(text: str) -> float:
    """argparse's `type` for a float option: nan and inf are refused (no option of this package means them, and a
    comparison with nan passes every range check)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def finite_numbers(parser: argparse.ArgumentParser) -> None:
    """Every float option of `parser` parsed by finite_float: its own, fairseq's, and those fairseq adds while it
    parses (the architecture's, the task's), through argparse's type registry, which its groups share."""
    parser.register("type", float, finite_float)


def option_strings(parser: argparse.ArgumentParser) -> List[str]:
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--")]


def usage_error(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's error message as one line, an unknown option given with the nearest option of the parser."""
    unknown = re.match(r"unrecognized arguments: (.*)", message)
    if not unknown:
        return message.replace("\n", " ")
    tokens = unknown.group(1).split()
    flags = [t.split("=", 1)[0] for t in tokens if t.startswith("-")]
    if not flags:
        return f"unexpected argument {tokens[0]!r}"
    near = difflib.get_close_matches(flags[0], option_strings(parser), n=1, cutoff=0.8)
    return f"unknown option {flags[0]}" + (f" (did you mean {near[0]}?)" if near else "")


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A parser whose usage errors are a UserError (one line, exit code 2) instead of argparse's usage dump (the
    generation parser's is some 200 lines of fairseq's options); float options take finite numbers only."""
    def error(message: str) -> NoReturn:
        raise UserError(usage_error(parser, message))

    parser.error = error
    finite_numbers(parser)
    return parser


def nested(cls, section: Optional[str] = None, defaults: Optional[Dict[str, Any]] = None, why: str = ""):
    """A field holding another options dataclass, whose own fields become arguments of the same parser (listed
    under `section` in --help, unless a field names its own). `defaults`: the values this holder gives some of
    cls's fields instead of cls's own, for the reason `why` (said in each such flag's --help): one declaration of
    the option, its other default written once with its reason."""
    defaults = dict(defaults or {})
    unknown = set(defaults) - {f.name for f in dataclasses.fields(cls)}
    if unknown or (defaults and not why):
        raise TypeError(f"nested({cls.__name__}): defaults for fields it lacks ({sorted(unknown)}), or no reason")
    factory = functools.partial(cls, **defaults) if defaults else cls
    return dataclasses.field(default_factory=factory,
                             metadata={"nested": True, "section": section, "defaults": defaults, "why": why})


def _default(f, defaults: Dict[str, Any]) -> Any:
    """A field's default: its holder's (`defaults`, from nested) or its own (None when it has none)."""
    if f.name in defaults:
        return defaults[f.name]
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def _fields(cls):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield f, hints[f.name]


def _scalar_type(hint) -> Optional[type]:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint
    return base if base in (int, float) else None


def _is_option(meta) -> bool:
    """A field made by option(): other fields (set by the code, or read from fairseq's own arguments) are skipped."""
    return "flag" in meta and "help" in meta


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_arguments(parser, cls, groups: Optional[Dict[str, Any]] = None, section: Optional[str] = None,
                  defaults: Optional[Dict[str, Any]] = None, why: str = "") -> None:
    """Every `option` field of cls (and of its nested dataclasses) as an argument of parser (or an argument group),
    each argparse action carrying its --help `section`; `defaults` and `why`: a holder's other defaults (nested)."""
    groups, defaults = ({} if groups is None else groups), (defaults or {})
    for f, hint in _fields(cls):
        meta = f.metadata
        if meta.get("nested"):
            add_arguments(parser, hint, groups, meta.get("section") or section, meta.get("defaults"), meta.get("why"))
            continue
        if not _is_option(meta):
            continue
        target = parser
        if meta["group"]:
            if meta["group"] not in groups:
                groups[meta["group"]] = parser.add_mutually_exclusive_group()
            target = groups[meta["group"]]
        text = meta["help"].replace("%", "%%")  # argparse formats help with %
        if meta["negate"] or hint is bool:  # a switch: --no-X turns a True default off, --X a False one on
            action = target.add_argument(meta["flag"], action="store_true", help=text)
            action.section = meta["section"] or section
            continue
        own = meta["shown"] if meta["shown"] is not None else (None if f.default is dataclasses.MISSING else f.default)
        default = defaults[f.name] if f.name in defaults else own
        kwargs = {"help": text, "metavar": meta["metavar"], "choices": meta["choices"], "nargs": meta["nargs"]}
        if meta["parse"] is None and _scalar_type(hint):
            kwargs["type"] = finite_float if _scalar_type(hint) is float else _scalar_type(hint)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if default not in (None, (), ""):  # a holder's other default with its reason
            reason = f": {why}" if f.name in defaults else ""
            kwargs["help"] = f"{text} (default {f'{default}{reason}'.replace('%', '%%')})"
        if not meta["flag"].startswith("-"):  # a positional argument: required unless nargs says otherwise
            action = target.add_argument(meta["flag"], **{k: v for k, v in kwargs.items() if v is not None})
            action.section = meta["section"] or section
            continue
        if required:
            kwargs["required"] = True
        if meta["nargs"] in ("+", "*"):  # given twice, both lists count (argparse's default keeps the last alone)
            kwargs["action"] = "extend"
        action = target.add_argument(meta["flag"], default=None, **{k: v for k, v in kwargs.items() if v is not None})
        action.section = meta["section"] or section


def from_arguments(cls, args, defaults: Optional[Dict[str, Any]] = None, **overrides):
    """The options dataclass as the parsed arguments give it: a field whose argument was not given keeps the
    dataclass default (`defaults`: a holder's other defaults, nested's); a field not made by option() takes the
    argument of its own name when the parser has one (fairseq's options, or arguments a command declares itself);
    overrides set fields that no argument holds."""
    values = dict(defaults or {})
    for f, hint in _fields(cls):
        meta = f.metadata
        if f.name in overrides:
            continue
        if meta.get("nested"):
            values[f.name] = from_arguments(hint, args, meta.get("defaults"))
        elif _is_option(meta):
            given = getattr(args, _dest(meta["flag"]))
            if meta["negate"] or hint is bool:
                if given:
                    values[f.name] = not _default(f, defaults or {})
            elif given is not None:
                values[f.name] = _parsed(meta, given)
        elif hasattr(args, f.name):
            values[f.name] = getattr(args, f.name)
    values.update(overrides)
    return cls(**values)


def _parsed(meta, given):
    """The field's value from the given text: its `parse`, whose ValueError is the user's one-line error."""
    if not meta["parse"]:
        return given
    try:
        return meta["parse"](given)
    except ValueError as e:
        raise UserError(f"{meta['flag']} {given if isinstance(given, str) else ' '.join(given)}: {e}") from None


def non_finite(options) -> None:
    """Refuse nan or inf in any float option field of an options dataclass (nested too), in one line naming its
    flag: a library caller's options are held to what the command line's finite_float holds them to."""
    for f, _hint in _fields(type(options)):
        value = getattr(options, f.name)
        if f.metadata.get("nested"):
            non_finite(value)
        elif _is_option(f.metadata) and isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{f.metadata['flag']} must be a finite number, not {value}")


def given_flags(cls, options, defaults: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """flag -> value for every option field (nested too) whose value differs from its default (a nested one's: its
    holder's): what a user chose, in the words they chose it with (for refusals and records)."""
    out = {}
    for f, hint in _fields(cls):
        value = getattr(options, f.name)
        if f.metadata.get("nested"):
            out.update(given_flags(hint, value, f.metadata.get("defaults")))
        elif _is_option(f.metadata):
            if value != _default(f, defaults or {}):
                out[f.metadata["flag"]] = value
    return out
