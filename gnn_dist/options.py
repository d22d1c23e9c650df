"""The option machinery of the configs: `option()` makes a dataclass field that is also a command-line flag,
`add_options` turns a config's option fields into argparse options and `options_from_args` reads them back,
so a config's defaults, help and parsing are written once (gnn_dist.config holds the configs themselves).

May import: nothing of gnn_dist
"""
from __future__ import annotations

import argparse
from dataclasses import MISSING, field, fields


def timeout_seconds(text: str) -> float | str:
    """--timeout: "auto" or a number of seconds (0: off)."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give auto or a number of seconds, got {text!r}") from None


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def fanout_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected one integer per layer separated by commas, like 15,10,5; "
                                         f"got {text!r}") from None


def option(default=MISSING, help: str = "", *, parse=None, choices=None, flag: str | None = None):
    """A config field that is also a command-line option.

    parse: argparse's `type` (default: the type of the default); choices: a tuple, or a function returning
    one when the parser is built (the model registry); flag: the option's name when it is not --FIELD-NAME
    (a True boolean default becomes --no-FIELD-NAME).
    """
    return field(default=default, metadata={"help": help, "parse": parse, "choices": choices, "flag": flag})

def add_options(parser: argparse.ArgumentParser, config_class, only=None, help_prefix: str = "",
                choices: dict | None = None) -> None:
    """One argparse option per option() field of config_class (or of the names in `only`).

    choices: field name -> a function returning that option's choices, for the options whose registry sits
    above this module (--task: gnn_dist.tasks, whose tasks train with these configs); the caller supplies it."""
    for f in flag_fields(config_class, only):
        meta = f.metadata
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        text = help_prefix + meta["help"]
        if f.default is MISSING:
            parser.add_argument(flag, dest=f.name, required=True, type=meta["parse"] or str, help=text)
        elif isinstance(f.default, bool):
            if f.default:
                parser.add_argument(meta["flag"] or "--no-" + f.name.replace("_", "-"), dest=f.name,
                                    action="store_false", help=f"do not: {text}")
            else:
                parser.add_argument(flag, dest=f.name, action="store_true", help=text)
        else:
            listed = (choices or {}).get(f.name, meta["choices"])
            choices_now = listed() if callable(listed) else listed
            parse = meta["parse"] or type(f.default)
            shown = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
            parser.add_argument(flag, dest=f.name, type=parse, default=f.default, choices=choices_now,
                                help=text if f.default is None else f"{text} (default: {shown})")

def options_from_args(config_class, args: argparse.Namespace, only=None) -> dict:
    """The option() fields of config_class that `args` holds, as keyword arguments."""
    return {f.name: getattr(args, f.name) for f in flag_fields(config_class, only) if hasattr(args, f.name)}

def profile_range(text: str) -> range:
    """--profile-epochs A:B as range(A, B); ValueError naming the form otherwise."""
    start, colon, stop = text.partition(":")
    if not (colon and start.isdigit() and stop.isdigit() and int(start) < int(stop)):
        raise ValueError(f"bad --profile-epochs {text!r}: give A:B with 0 <= A < B, e.g. 1:3 for epochs 1 and 2")
    return range(int(start), int(stop))

def flag_fields(config_class, only=None):
    return [f for f in fields(config_class) if "help" in f.metadata and (only is None or f.name in only)]
