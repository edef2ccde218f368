"""What every server (``wai serve``, ``wai policy``, ``wai record``) checks before it does any work.

``read_body(request, limit)`` is the one body reader: it refuses a declared ``Content-Length`` over the limit
before reading a byte, and otherwise reads the body chunk by chunk and stops at the first byte past the
limit, so a huge body never sits in memory. ``BodyTooLarge`` carries the message (size, limit, the flag
that sets it); each server answers it in its own error shape with a 413.

Tokens (docs/decisions.md, "Auth"): ``server_token`` picks the token a server accepts (``--token``, else
``$WAI_TOKEN``, else a generated one it prints), ``--no-token`` opts out, and a non-loopback bind without a
token is refused. ``TokenCheck`` compares in constant time; no token is ever logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from typing import Any

from whileai.errors import ConfigError
from whileai.service.auth import TOKEN_ENV

BODY_FLAG = "--max-body-mb"


class BodyTooLarge(Exception):
    """A request body over the server's limit (answered 413)."""

    def __init__(self, size: int, limit: int, flag: str = BODY_FLAG, declared: bool = False) -> None:
        seen = f"declares {size} bytes" if declared else f"is more than {size - 1} bytes"
        super().__init__(f"the request body {seen}; the limit is {limit} bytes ({limit / 2**20:g} MiB, set by "
                         f"{flag}): split the request into smaller ones, or start the server with a larger {flag}")
        self.size, self.limit = size, limit


async def read_body(request: Any, limit: int, flag: str = BODY_FLAG) -> bytes:
    """The request's body, read while counting: ``BodyTooLarge`` as soon as it passes ``limit`` bytes (or
    at once when its ``Content-Length`` says it will). Later ``request.body()`` calls get the same bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(int(declared), limit, flag, declared=True)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit + 1, limit, flag)
        chunks.append(chunk)
    raw = b"".join(chunks)
    request._body = raw  # starlette's cache: request.body() and request.json() read these bytes
    return raw


# ----------------------------------------------------------------------------- tokens
def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``: only this machine can connect."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_token(server: str, token: str | None, no_token: bool, host: str) -> tuple[str | None, bool]:
    """The token ``wai SERVER`` accepts, and whether it was generated (then it is printed once, at start).

    ``--token`` wins, then ``$WAI_TOKEN``, else one is generated. ``--no-token`` serves with none, and only on a
    loopback address: anyone who can reach a non-loopback port could otherwise change weights or rewards."""
    if no_token:
        if token:
            raise ConfigError(f"wai {server}: --token and --no-token together; give one")
        if not is_loopback(host):
            raise ConfigError(f"wai {server}: --no-token on --host {host} would let anyone who reaches the port "
                              "change the served weights and the rewards. Fix: bind 127.0.0.1 (the default), or "
                              f"give --token (or ${TOKEN_ENV}) and send 'Authorization: Bearer <token>'")
        return None, False
    chosen = token or os.environ.get(TOKEN_ENV) or None
    if chosen is not None:
        if len(chosen) < 16 or len(chosen.split()) != 1:
            raise ConfigError(f"wai {server}: the token ({'--token' if token else '$' + TOKEN_ENV}) must be one "
                              "word of at least 16 characters; e.g. `python -c 'import secrets; "
                              "print(secrets.token_urlsafe(32))'`")
        return chosen, False
    return secrets.token_urlsafe(24), True


class TokenCheck:
    """Whether a request's ``Authorization: Bearer <token>`` header carries the server's token."""

    def __init__(self, token: str | None) -> None:
        self.expected = f"Bearer {token}".encode() if token is not None else None

    @property
    def required(self) -> bool:
        return self.expected is not None

    def accepts(self, authorization: str | None) -> bool:
        if self.expected is None:
            return True
        return hmac.compare_digest((authorization or "").strip().encode(), self.expected)

    def problem(self, authorization: str | None, server: str) -> str | None:
        """None when accepted, else what is wrong (the token itself is never repeated)."""
        if self.accepts(authorization):
            return None
        why = "no bearer token" if not authorization else "the bearer token is not this server's"
        return (f"{why}: send 'Authorization: Bearer <token>' with the token `wai {server}` printed at start, or "
                f"the one it was given (--token or ${TOKEN_ENV}); the OpenAI client sends it as api_key")


class RequireToken:
    """ASGI middleware: every HTTP request but ``open_paths`` (readiness) carries the server's token, else it
    gets ``refuse(message)`` (a 401 in the server's error shape) before any route reads its body."""

    def __init__(self, app: Any, check: TokenCheck, server: str, refuse: Any,
                 open_paths: tuple[str, ...] = ("/healthz",)) -> None:
        self.app, self.check, self.server, self.refuse, self.open_paths = app, check, server, refuse, open_paths

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.check.required and scope["path"] not in self.open_paths:
            header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
            problem = self.check.problem(header, self.server)
            if problem is not None:
                await self.refuse(problem)(scope, receive, send)
                return
        await self.app(scope, receive, send)
