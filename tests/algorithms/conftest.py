"""Shared pieces for the algorithm tests: hand-built samples, contexts, and a live `wai serve`."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from whileai.algorithms.core import Completion, Group, LossContext, Sample, SampleRequest
from whileai.envs import Task, load_taskset


def completion(reward: float, tokens: Sequence[int] = (97, 98), logprobs: Sequence[float] | None = None,
               truncated: bool = False) -> Completion:
    lp = list(logprobs) if logprobs is not None else [-1.0] * len(tokens)
    return Completion(list(tokens), lp, "length" if truncated else "stop", reward, "", truncated)


def group(rewards: Sequence[float], lengths: Sequence[int] | None = None, prompt: str = "abc") -> Group:
    lengths = lengths or [2] * len(rewards)
    comps = [completion(r, tokens=[97 + (i % 20)] * n) for i, (r, n) in enumerate(zip(rewards, lengths))]
    return Group(Task(prompt, prompt, prompt + "a", {"completion_len": 4}), [1, 2, 3], comps)


def sample(*groups: Group) -> Sample:
    return Sample(list(groups), 0)


REQUEST = SampleRequest(4, {"max_tokens": 8, "temperature": 1.0, "seed": 0}, 0)


def local_capabilities() -> dict[str, Any]:
    from whileai.engine import capabilities

    return {"provider": "local", "losses": capabilities()}


def tinker_like_capabilities() -> dict[str, Any]:
    """A provider as the spec describes Tinker Cloud: no gspo / dppo / sapo / ppo_critic, and the clip
    thresholds taken only as per-token loss_fn_inputs (no scalar config keys)."""
    caps = copy.deepcopy(local_capabilities())
    caps["provider"] = "tinker"
    for name in ("gspo", "dppo", "sapo", "ppo_critic"):
        del caps["losses"][name]
    for name in ("ppo", "cispo"):
        caps["losses"][name]["config"] = {}
    return caps


def context(options: Any, capabilities: dict[str, Any] | None = None, client: Any = None, teacher: Any = None,
            taskset: Any = None) -> LossContext:
    from whileai.engine.models import byte_tokenizer

    return LossContext(client, capabilities or local_capabilities(), byte_tokenizer(),
                       taskset or load_taskset("builtin:case"), options, teacher)


def completion_values(datum: dict[str, Any], key: str, n: int) -> list[float]:
    """The last ``n`` positions of a datum's loss input (the completion's tokens)."""
    return [float(x) for x in datum["loss_fn_inputs"][key][-n:]]


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real `wai serve` subprocess on loopback (the service engineer's launcher)."""
    from whileai.service.launch import start_server

    with start_server(tmp_path_factory.mktemp("algorithms-service") / "data") as server:
        yield server


@pytest.fixture
def client(service: Any) -> Iterator[Any]:
    from whileai.service import Client

    with Client(service.url, service.token) as c:
        yield c
