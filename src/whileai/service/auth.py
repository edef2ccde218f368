"""Bearer tokens: where they come from, and which owner a request's token stands for.

Tokens come from ``--token-file`` (one per line; blank lines and ``#`` comments skipped), else from
the ``WAI_TOKEN`` environment variable, else one is generated and printed at start. Each token is
its own owner: sessions and runs made with one token are invisible (404) to every other. The server
keeps only each token's SHA-256, and compares in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from whileai.errors import ConfigError

TOKEN_ENV = "WAI_TOKEN"


def read_tokens(token_file: Path | None) -> tuple[list[str], bool]:
    """The tokens the server accepts, and whether it generated one (then it must be shown)."""
    if token_file is not None:
        lines = [line.strip() for line in token_file.read_text(encoding="utf-8").splitlines()]
        tokens = [line for line in lines if line and not line.startswith("#")]
        if not tokens:
            raise ConfigError(f"--token-file {str(token_file)!r} holds no token; write one per line")
        spaced = [i for i, t in enumerate(tokens) if len(t.split()) > 1]
        if spaced:
            raise ConfigError(f"--token-file {str(token_file)!r}: token {spaced[0] + 1} ({tokens[spaced[0]][:6]}...) "
                              "holds whitespace; write one token per line, and put comments on their own lines "
                              "starting with #")
        short = [i for i, t in enumerate(tokens) if len(t) < 16]
        if short:
            raise ConfigError(f"--token-file {str(token_file)!r}: token {short[0] + 1} is shorter than 16 "
                              "characters; use long random tokens, e.g. `python -c 'import secrets; "
                              "print(secrets.token_urlsafe(32))'`")
        return tokens, False
    if os.environ.get(TOKEN_ENV):
        return [os.environ[TOKEN_ENV]], False
    return [secrets.token_urlsafe(24)], True


def owner_of(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:32]


class Tokens:
    """The accepted tokens, as owners."""

    def __init__(self, tokens: list[str]) -> None:
        self.owners = [owner_of(t) for t in tokens]

    def owner(self, authorization: str | None) -> str | None:
        """The owner of a ``Bearer <token>`` header, or None when it is missing or not accepted."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        candidate = owner_of(authorization.removeprefix("Bearer ").strip())
        found = None
        for owner in self.owners:  # compare against every one: the time does not say which matched
            if hmac.compare_digest(owner, candidate):
                found = owner
        return found
