"""`wai serve`: the training service (FastAPI on uvicorn), bound to 127.0.0.1 unless told otherwise.

Sessions, runs, operation answers and saved states are kept under ``--data-dir`` (SQLite + the runs'
state folders), so a restart on the same folder lets clients reattach. See docs/service.md.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path
from typing import Any

from whileai.cli.options import add_address, add_threads, check_port, set_threads
from whileai.errors import ConfigError

DEFAULT_PORT = 8321


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve", help="run the training service: sessions, runs, ordered operations over HTTP",
        description="Serve the engine's operations over HTTP (JSON, bearer token). One process serves "
                    "several runs; each run's model is loaded once and stays warm.")
    add_address(serve, DEFAULT_PORT)
    serve.add_argument("--data-dir", type=Path, default=Path("wai-service"),
                       help="folder for the database, saved states and exports (default ./wai-service)")
    serve.add_argument("--model", action="append", default=None, metavar="M", dest="models",
                       help="a model runs may use: builtin:tiny, builtin:mini, builtin:small, a local directory "
                            "or a hub id (repeatable; default builtin:tiny and builtin:mini)")
    serve.add_argument("--token-file", type=Path, default=None,
                       help="accepted bearer tokens, one per line, each its own owner (default: $WAI_TOKEN, "
                            "else a token generated and printed at start)")
    serve.add_argument("--order-timeout", type=float, default=30.0,
                       help="seconds an early operation waits for a missing earlier seq_id before a 408 "
                            "naming it (default 30)")
    serve.add_argument("--respond-within", type=float, default=10.0,
                       help="seconds a request waits for its answer before getting a request id to poll "
                            "(default 10)")
    serve.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body in MiB (default 64)")
    serve.add_argument("--max-datums", type=int, default=4096, help="most datums per request (default 4096)")
    serve.add_argument("--max-samples", type=int, default=4096,
                       help="most sequences per sample request, prompts x num_samples (default 4096)")
    add_threads(serve)
    serve.add_argument("--tinker-url", default=None, metavar="URL",
                       help="run every run on this Tinker-compatible server (Tinker Cloud, SkyRL, another wai "
                            "serve) through the tinker SDK, key from $TINKER_API_KEY (default: none, the local "
                            "engine); needs pip install whileai[tinker]")
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from whileai.service.app import ServeConfig, create_app
    from whileai.service.auth import TOKEN_ENV, read_tokens

    check_port(args.port)
    if min(args.order_timeout, args.respond_within, args.max_body_mb) <= 0 or min(args.max_datums,
                                                                                   args.max_samples) < 1:
        raise ConfigError("--order-timeout, --respond-within and --max-body-mb must be > 0, --max-datums and "
                          "--max-samples >= 1")
    from whileai.engine.models import model_problem

    problems = [p for p in map(model_problem, args.models or []) if p]
    if problems:
        raise ConfigError("--model: " + "; ".join(problems))
    tokens, generated = read_tokens(args.token_file)
    set_threads(args.threads, "serve")
    config = ServeConfig(data_dir=args.data_dir, tokens=tokens, models=args.models or ["builtin:tiny", "builtin:mini"],
                         order_timeout=args.order_timeout, respond_within=args.respond_within,
                         max_body_bytes=int(args.max_body_mb * 2**20), max_datums=args.max_datums,
                         max_samples=args.max_samples)
    _check_free(args.host, args.port)
    app = create_app(config, _provider(args.tinker_url, config.models))
    where = f"http://{args.host}:{args.port}"
    print(f"wai serve: {where}, models {', '.join(config.models)}, data in {args.data_dir}", flush=True)
    if generated:
        print(f"wai serve: token {tokens[0]} (generated; set {TOKEN_ENV} or --token-file to choose one)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _check_free(host: str, port: int) -> None:
    """Refuse a port another process holds, in one line, before loading anything."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a TIME_WAIT port is free
        try:
            probe.bind((host, port))
        except OSError as err:
            raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror}; pick another --port, or stop the "
                              "server that holds it") from None


if __name__ == "__main__":
    from whileai.cli import main

    sys.exit(main(["serve", *sys.argv[1:]]))


def _provider(tinker_url: str | None, models: list[str]) -> Any:
    """None (the local engine), or the tinker provider for ``--tinker-url``."""
    if tinker_url is None:
        return None
    import os

    key = os.environ.get("TINKER_API_KEY")
    if not key:
        raise ConfigError("--tinker-url needs the upstream server's api key in $TINKER_API_KEY")
    from whileai.service.provider import TinkerProvider

    return TinkerProvider(tinker_url, key, models)
