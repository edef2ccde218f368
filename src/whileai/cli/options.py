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
