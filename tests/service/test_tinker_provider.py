"""The service's ``tinker`` provider: `wai serve --tinker-url` in front of a second `wai serve`, via the SDK.

Server A runs the local engine. Server B runs every run on A through the official Tinker SDK. The same
algorithm loop against B and against A must give the same cycles (rewards, losses, gradient norms), and B
must advertise what A advertises, so the algorithms' provider checks read the upstream's own table.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
pytestmark = pytest.mark.slow  # two servers and an SDK session: about 20 s before the first test

from whileai.algorithms import rl_loop  # noqa: E402
from whileai.service import Client  # noqa: E402
from whileai.service.launch import LocalServer, start_server  # noqa: E402

# One prompt per cycle: a Tinker request carries one prompt, so only the first prompt of a batch draws the
# local engine's random stream (tinker_provider._prompt_seed); eight rollouts so some earn a reward.
SETTINGS: dict[str, Any] = {"cycles": 3, "tasks_per_cycle": 1, "rollouts_per_prompt": 8, "log": lambda line: None}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalServer, LocalServer]]:
    data = tmp_path_factory.mktemp("providers")
    upstream_token = "tml-" + secrets.token_urlsafe(24)
    with start_server(data / "upstream", token=upstream_token) as upstream:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TINKER_API_KEY", upstream_token)
            front = start_server(data / "front", args=["--tinker-url", upstream.url])
        with front:
            yield upstream, front


def test_the_tinker_provider_advertises_the_upstream_losses(servers: tuple[LocalServer, LocalServer]) -> None:
    upstream, front = servers
    theirs = Client(upstream.url, upstream.token).capabilities()
    ours = Client(front.url, front.token).capabilities()
    assert (theirs["provider"], ours["provider"]) == ("local", "tinker")
    assert ours["upstream"] == upstream.url and ours["losses"] == theirs["losses"]
    assert "export_lora" not in ours["operations"]


@pytest.mark.parametrize("name", ["ppo", "rloo"])
def test_three_cycles_through_the_tinker_provider_equal_the_local_provider(
        servers: tuple[LocalServer, LocalServer], name: str) -> None:
    upstream, front = servers
    direct = rl_loop(Client(upstream.url, upstream.token), name, "builtin:case", **SETTINGS)
    relayed = rl_loop(Client(front.url, front.token), name, "builtin:case", **SETTINGS)
    try:
        assert len(relayed.history) == 3
        for mine, theirs in zip(relayed.history, direct.history):
            assert mine.keys() == theirs.keys()
            for key, value in theirs.items():
                assert mine[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (key, mine, theirs)
        assert direct.history[-1]["grad_norm"] > 0
    finally:
        direct.close()
        relayed.close()
