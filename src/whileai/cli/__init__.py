"""`wai`: one command line over the whole library.

Each subcommand lives in its own module under ``whileai.cli`` and exposes
``register(subparsers) -> None``; the parser it adds sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from whileai.errors import WhileaiError

# Subcommand modules, in the order `wai --help` lists them.
COMMANDS: tuple[str, ...] = (
    "whileai.cli.methods_cmd",
    "whileai.cli.rows_cmd",
    "whileai.cli.prime_rl_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wai", description="whileai: post-training language models with reinforcement learning."
    )
    parser.add_argument("--version", action="version", version=f"whileai {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except WhileaiError as err:
        print(f"wai {args.command}: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError) as err:
        print(f"wai {args.command}: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `wai report ... | head`: the reader left, which is not an error
        _silence_stdout()
        return 0


def _silence_stdout() -> None:
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _version() -> str:
    from whileai import __version__

    return __version__


if __name__ == "__main__":
    sys.exit(main())
