"""The field suite: the three servers as a stranger on the network meets them, each in its own process on
loopback with small limits so that refusals are cheap to provoke. Real clients only (httpx, openai, the
library's own).

    policy      `wai policy builtin:tiny` with a token and --max-body-mb 1, --max-n 4, --max-tokens 64, --max-batch 8
    recorder    `wai record` in front of it, with its own token and --max-body-mb 1
    serve       `wai serve` with --max-body-mb 1 (a token, as always)
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from whileai.record.launch import Started
from whileai.service.launch import LocalServer, start_server

LIMITS = ["--max-body-mb", "1", "--max-n", "4", "--max-tokens", "64", "--max-batch", "8"]
@pytest.fixture(scope="module")
def field_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("field")


@pytest.fixture(scope="module")
def policy(field_dir: Path) -> Iterator[Started]:
    with Started(["policy", "builtin:tiny", "--threads", "1", *LIMITS], field_dir,
                 token="pol-" + secrets.token_urlsafe(18)) as server:
        yield server


@pytest.fixture(scope="module")
def recorder(policy: Started, field_dir: Path) -> Iterator[Started]:
    with Started(["record", "--upstream", policy.url, "--data-dir", str(field_dir / "record"), "--max-body-mb", "1",
                  "--upstream-key", str(policy.token)], field_dir, token="rec-" + secrets.token_urlsafe(18)) as server:
        yield server


@pytest.fixture(scope="module")
def serve(field_dir: Path) -> Iterator[LocalServer]:
    with start_server(field_dir / "serve", args=["--max-body-mb", "1", "--order-timeout", "3"]) as server:
        yield server
