"""Flags more than one `wai` subcommand takes, declared once."""

from __future__ import annotations

import argparse

from whileai.errors import ConfigError


def add_address(parser: argparse.ArgumentParser, default_port: int) -> None:
    """``--host`` and ``--port`` of a server subcommand (`wai serve`, `wai policy`, `wai record`)."""
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    parser.add_argument("--port", type=int, default=default_port, help=f"port (default {default_port})")


def check_port(port: int) -> None:
    if not 0 <= port < 65536:
        raise ConfigError(f"--port {port} must be in [0, 65535]")


def add_token(parser: argparse.ArgumentParser, server: str) -> None:
    """``--token`` and ``--no-token`` of `wai policy` and `wai record` (docs/decisions.md, Auth)."""
    parser.add_argument("--token", default=None, metavar="T",
                        help="the bearer token every route but /healthz asks for (default $WAI_TOKEN, else one is "
                             "generated and printed at start); clients send 'Authorization: Bearer T' (the OpenAI "
                             "client's api_key)")
    parser.add_argument("--no-token", action="store_true",
                        help=f"serve with no token (only on a loopback --host): anyone who can reach the port may "
                             f"use every route of wai {server}")


def serving_token(args: argparse.Namespace, server: str) -> str | None:
    """The token the server takes (printed once when generated; never logged otherwise)."""
    from whileai.service.guard import TOKEN_ENV, server_token

    token, generated = server_token(server, args.token, args.no_token, args.host)
    if generated:
        print(f"wai {server}: token {token} (generated; set {TOKEN_ENV} or --token to choose one, --no-token for "
              "none)", flush=True)
    elif token is None:
        print(f"wai {server}: no token (--no-token): every route is open to whoever reaches {args.host}", flush=True)
    return token


def add_body_limit(parser: argparse.ArgumentParser, default: float) -> None:
    parser.add_argument("--max-body-mb", type=float, default=default,
                        help=f"largest request body in MiB, refused with a 413 while it is read (default {default:g})")


def positive(**values: float) -> None:
    """Refuse a limit flag that is not > 0, naming it."""
    for name, value in values.items():
        if not value > 0:
            raise ConfigError(f"--{name.replace('_', '-')} {value:g} must be > 0")


def add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: the rule `wai train` uses: $OMP_NUM_THREADS, else the cores "
                             "this process may use less the load average, within 1..8; 0: torch's own choice, every "
                             "core, which oversubscribes a shared machine)")


def set_threads(threads: int | None, server: str) -> None:
    """torch's CPU threads for a server: ``--threads`` as given (0: torch's own), else the run plan's rule;
    printed with where the number came from."""
    import torch

    from whileai.loop.plan.run_plan import threads_rule

    if threads is not None and threads < 0:
        raise ConfigError(f"--threads {threads}: give a whole number >= 1, or 0 for torch's own choice")
    if threads == 0:
        print(f"wai {server}: torch threads {torch.get_num_threads()} (--threads 0: torch's own choice)", flush=True)
        return
    count, source = (threads, "--threads") if threads is not None else threads_rule()
    torch.set_num_threads(count)
    print(f"wai {server}: torch threads {count} ({source})", flush=True)
