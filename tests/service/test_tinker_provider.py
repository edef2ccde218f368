"""The service's ``tinker`` provider: `wai serve --tinker-url` in front of a second `wai serve`, via the SDK.

Server A runs the local engine. Server B runs every run on A through the official Tinker SDK. B must
advertise what A advertises, so the loop's capability checks read the upstream's own table; `wai train --url B`
equals the in-process run (tests/loop/test_over_url.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
pytestmark = pytest.mark.slow  # two servers and an SDK session: about 20 s before the first test

from tests.service.chain import chained  # noqa: E402
from whileai.service import Client  # noqa: E402
from whileai.service.launch import LocalServer  # noqa: E402


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalServer, LocalServer]]:
    with chained(tmp_path_factory.mktemp("providers")) as pair:
        yield pair


def test_the_tinker_provider_advertises_the_upstream_losses(servers: tuple[LocalServer, LocalServer]) -> None:
    upstream, front = servers
    theirs = Client(upstream.url, upstream.token).capabilities()
    ours = Client(front.url, front.token).capabilities()
    assert (theirs["provider"], ours["provider"]) == ("local", "tinker")
    assert ours["upstream"] == upstream.url and ours["losses"] == theirs["losses"]
    assert "add_critic" not in ours["operations"] and "export_lora" in ours["operations"]


# The same run through B and without it (weights and metrics): tests/loop/test_over_url.py, the --tinker-url chain.
