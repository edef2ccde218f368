"""A run's states over HTTP, whatever trainer serves it: the local engine (``wai serve``) and the Tinker SDK
(``wai serve --tinker-url`` in front of a second ``wai serve``).

Pinned before the service's two run adapters became one over the ``Trainer`` protocol (issue 32): a state saved
at step 1 and loaded after a second step gives back step 1's log-probabilities, step, and optimizer (the next
step's gradient norm and weights equal the first time's); sampler weights saved at a version are sampled after
training on; a new run made from a copy of the state loads it; what a trainer cannot do is refused with a 400
that names it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from whileai.engine import make_datum
from whileai.service import Client, RunClient, ServiceError, Session
from whileai.service.launch import LocalServer

PROBE = [1, 72, 101, 108, 108, 111, 33, 2]
ADAM = {"learning_rate": 1e-2}


def _data(i: int) -> list[dict[str, Any]]:
    return [make_datum([1, 72 + i + j, 105], [33 + j, 2]) for j in range(3)]


def _step(run: RunClient, i: int) -> float:
    run.forward_backward(_data(i), "cross_entropy")
    return run.optim_step(ADAM).grad_norm


def _probe(run: RunClient) -> np.ndarray:
    return np.asarray(run.compute_logprobs(PROBE)["logprobs"][1:], dtype=np.float64)


def round_trip(run: RunClient) -> None:
    """save at step 1, train on, load: step 1's weights, step and optimizer come back; sampler versions stay."""
    _step(run, 0)
    saved = run.save_state("one")
    assert saved and run.step == 1
    at_one = _probe(run)
    version = run.save_weights_for_sampler()
    params = {"max_tokens": 5, "seed": 3}
    sampled = run.sample([1, 72], 2, params)
    second = _step(run, 1)
    assert run.step == 2 and np.max(np.abs(_probe(run) - at_one)) > 1e-4
    assert run.sample([1, 72], 2, params, version=version) == sampled and run.last_version == version
    run.load_state("one")
    assert run.step == 1
    np.testing.assert_allclose(_probe(run), at_one, rtol=0, atol=1e-6)
    again = _step(run, 1)  # the optimizer's moments came back with the weights: the same second step
    assert again == pytest.approx(second, rel=1e-6) and run.step == 2
    with_moments = _probe(run)
    run.load_state("one", optimizer=False)  # the weights only: Adam starts again, so the step lands elsewhere
    assert _step(run, 1) == pytest.approx(second, rel=1e-6)  # the same weights, so the same gradient
    assert np.max(np.abs(_probe(run) - with_moments)) > 1e-5
    with pytest.raises(ServiceError, match="saved no state named 'two'") as missing:
        run.load_state("two")
    assert missing.value.status == 400


def copied(session: Session, run: RunClient, lora_rank: int = 0) -> None:
    """A new run made from a copy of the run's state ``one`` (``CreateRun.from_state``, what ``--resume`` over a
    server does) loads step 1's weights."""
    copy = session.create_run("builtin:tiny", lora_rank=lora_rank, seed=5, from_state=f"{run.id}/one")
    run.load_state("one")
    copy.load_state("one")
    assert copy.id != run.id and copy.step == 1
    np.testing.assert_allclose(_probe(copy), _probe(run), rtol=0, atol=1e-6)


def test_a_local_run_saves_loads_and_exports_its_state(client: Client, tmp_path: Path):
    session = client.create_session()
    run = session.create_run("builtin:tiny", lora_rank=4, seed=5)
    round_trip(run)
    run.load_state("one")
    _step(run, 1)
    first = load_file(str(Path(run.export_lora(tmp_path / "after")) / "adapter_model.safetensors"))
    run.load_state("one")
    _step(run, 1)
    second = load_file(str(Path(run.export_lora(tmp_path / "again")) / "adapter_model.safetensors"))
    assert sorted(first) == sorted(second)
    assert max(float(np.max(np.abs(first[k] - second[k]))) for k in first) <= 1e-6
    assert any(float(np.abs(t).sum()) > 0 for k, t in first.items() if "lora_B" in k)
    copied(session, run, lora_rank=4)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalServer, LocalServer]]:
    pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
    from tests.service.chain import chained

    with chained(tmp_path_factory.mktemp("chain")) as pair:
        yield pair


@pytest.mark.slow
def test_a_run_on_the_tinker_sdk_behind_wai_serve_saves_and_loads_its_state(chain: tuple[LocalServer, LocalServer],
                                                                           tmp_path: Path):
    _, front = chain
    with Client(front.url, front.token) as client:
        session = client.create_session()
        run = session.create_run("builtin:tiny", seed=5)
        round_trip(run)
        copied(session, run)
        exported = Path(run.export_lora(tmp_path / "front-export"))  # the upstream's save_weights_external
        assert (exported / "model.safetensors").is_file()
        with pytest.raises(ServiceError, match="prompt_logprobs") as scores:
            run.call("sample", {"prompt_tokens": [1, 72], "num_samples": 1, "sampling_params": {"max_tokens": 2},
                                "prompt_logprobs": True})
        assert scores.value.status == 400
