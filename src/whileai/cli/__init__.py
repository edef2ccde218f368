"""`wai`: one command line over the whole library.

Each subcommand lives in its own module under ``whileai.cli`` and exposes
``register(subparsers) -> None``; the parser it adds sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from typing import Any, NoReturn

from whileai.errors import WhileaiError

# Subcommand modules, in the order `wai --help` lists them.
COMMANDS: tuple[str, ...] = (
    "whileai.cli.train_cmd",
    "whileai.cli.methods_cmd",
    "whileai.cli.rows_cmd",
    "whileai.cli.prime_rl_cmd",
    "whileai.cli.serve_cmd",
    "whileai.cli.skills_cmd",
    "whileai.cli.policy_cmd",
    "whileai.cli.record_cmd",
    "whileai.cli.recipe_cmd",
    "whileai.cli.lags_cmd",
)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (what was wrong, and where the help is)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--lr` must not quietly mean `--lr-schedule`
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}. See `{self.prog} --help`.\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="wai", description="whileai: post-training language models with reinforcement learning.")
    parser.add_argument("--version", action="version", version=f"whileai {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # name the subcommand whose help lists the valid flags, and the nearest one
        _innermost(parser, args).error(_unknown(_innermost(parser, args), extras))
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    # a deprecated knob name (--set generations=4) is said on stderr, which Python hides outside __main__
    warnings.filterwarnings("default", message=r".* is deprecated: the knob is ", category=DeprecationWarning)
    try:
        return int(args.func(args) or 0)
    except WhileaiError as err:
        print(f"wai {args.command}: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `wai report ... | head`: the reader left, which is not an error
        _silence_stdout()
        return 0
    except OSError as err:  # a path the user gave: missing, a folder, not readable
        print(f"wai {args.command}: {describe_os_error(err)}", file=sys.stderr)
        return 2


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser the command line reached: `wai train` for `wai train --bad`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            if chosen in action.choices:
                return _innermost(action.choices[chosen], args)
    return parser


def _unknown(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    import difflib

    flags = [o for a in parser._actions for o in a.option_strings]
    message = f"unrecognized arguments: {' '.join(extras)}"
    first = next((e.split("=")[0] for e in extras if e.startswith("-")), None)
    near = difflib.get_close_matches(first, flags, n=1) if first else []
    return message + (f" (did you mean {near[0]}?)" if near else "")


def describe_os_error(err: OSError) -> str:
    """One line naming the path, what is wrong with it, and what to do."""
    path = err.filename2 if err.filename2 is not None else err.filename
    if isinstance(err, FileNotFoundError):
        return f"{path}: no such file. Fix: check the path (relative paths start at {os.getcwd()})."
    if isinstance(err, IsADirectoryError):
        return f"{path} is a folder, not a file. Fix: name a file (e.g. {os.path.join(str(path), 'rows.jsonl')})."
    if isinstance(err, PermissionError):
        return f"{path}: permission denied. Fix: choose a path you can read (or write), or change its permissions."
    where = f"{path}: " if path is not None else ""
    return f"{where}{err.strerror or err}."


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _version() -> str:
    from whileai._version import __version__

    return __version__


if __name__ == "__main__":
    sys.exit(main())
