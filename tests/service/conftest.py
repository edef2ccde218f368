"""A real ``wai serve`` in its own process on a free loopback port, for tests over HTTP.

``service`` (one server for the whole test session) yields a ``LocalServer``: ``.url``, ``.token``,
``.other_token`` (a second accepted token, another owner), ``.data_dir``. Tests that crash or restart
a server start their own with ``start_server``. Elsewhere in the suite, the same fixture is three lines:

    from whileai.service.launch import start_server
    @pytest.fixture(scope="session")
    def service(tmp_path_factory):
        with start_server(tmp_path_factory.mktemp("service")) as server:
            yield server
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from whileai.service import Client
from whileai.service.launch import LocalServer, start_server

# Short waits so the ordering errors show within a test; small limits so 413s are cheap to provoke.
TEST_ARGS = ["--order-timeout", "3", "--respond-within", "1", "--max-body-mb", "2", "--max-datums", "256"]


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    data = tmp_path_factory.mktemp("service")
    token, other = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    tokens = data / "tokens.txt"
    tokens.write_text(f"# two owners\n{token}\n{other}\n")
    with start_server(data / "data", token=token, args=[*TEST_ARGS, "--token-file", str(tokens)]) as server:
        server.other_token = other  # type: ignore[attr-defined]
        yield server


@pytest.fixture
def client(service: LocalServer) -> Iterator[Client]:
    with Client(service.url, service.token) as c:
        yield c


@pytest.fixture(scope="module")
def tml_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """A ``wai serve`` of the module's own, its token ``tml-...`` (the Tinker SDK refuses keys without it)."""
    with start_server(tmp_path_factory.mktemp("tinker") / "data", token="tml-" + secrets.token_urlsafe(24)) as running:
        yield running


@pytest.fixture(scope="module")
def sdk(tml_server: LocalServer) -> Iterator[Any]:
    """The official Tinker SDK's ``ServiceClient`` on ``tml_server``."""
    tinker = pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
    client = tinker.ServiceClient(base_url=tml_server.url, api_key=tml_server.token)
    yield client
    client.holder.close()
