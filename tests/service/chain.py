"""Two real `wai serve` processes, one in front of the other through the Tinker SDK (`--tinker-url`)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from whileai.service.launch import LocalServer, start_server


@contextmanager
def chained(data: Path) -> Iterator[tuple[LocalServer, LocalServer]]:
    """(upstream, front): the upstream with a ``tml-`` token (the SDK refuses others), the front started with
    ``--tinker-url`` to it and that token as its ``TINKER_API_KEY``."""
    token = "tml-" + secrets.token_urlsafe(24)
    with start_server(data / "upstream", token=token) as upstream:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TINKER_API_KEY", token)
            front = start_server(data / "front", args=["--tinker-url", upstream.url])
        with front:
            yield upstream, front
