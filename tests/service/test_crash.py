"""SIGKILL the server mid-run, restart it on the same data directory, reattach, load_state, continue."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from whileai.engine import make_datum
from whileai.service import Client, ServiceError
from whileai.service.launch import LocalServer

DATA = [make_datum([1, 72 + i, 105], [33 + i, 2]) for i in range(4)]
PROBE = [1, 72, 101, 108, 108, 111, 33, 2]
ADAM = {"learning_rate": 1e-2}


def _train(run) -> None:
    run.forward_backward(DATA, "cross_entropy")
    run.optim_step(ADAM)


@pytest.mark.slow
def test_after_a_crash_the_last_saved_state_and_the_history_survive(tmp_path: Path):
    server = LocalServer(tmp_path / "data", args=["--respond-within", "1"]).start()
    try:
        client = Client(server.url, server.token, retries=10, backoff=0.5)
        session = client.create_session()
        run = session.create_run("builtin:tiny", seed=7)
        _train(run)
        _train(run)
        run.save_state("two")
        at_save = run.compute_logprobs(PROBE)["logprobs"]
        _train(run)  # acknowledged, but after the last save: lost in the crash
        after_save = run.compute_logprobs(PROBE)["logprobs"]
        assert after_save != at_save
        acknowledged = run.history()

        caught: list[BaseException] = []

        def in_flight() -> None:  # a long sample (no EOS stop: all 200 tokens), running when the server dies; the client keeps retrying
            try:
                run.sample([[1, 72]] * 32, 16, {"max_tokens": 200, "seed": 0, "ignore_eos": True})
            except BaseException as err:  # noqa: BLE001 - the test inspects it below
                caught.append(err)

        thread = threading.Thread(target=in_flight)
        thread.start()
        time.sleep(0.5)
        server.kill()
        server.start()  # same data directory, port and token
        thread.join(timeout=120)
        assert caught and isinstance(caught[0], ServiceError) and caught[0].status == 409
        assert "load_state(NAME) first; saved states: ['two']" in caught[0].message

        again = Client(server.url, server.token)
        sessions = again.sessions()
        assert [s.id for s in sessions] == [session.id]
        [listed] = sessions[0].runs()
        assert listed.id == run.id and [s["name"] for s in listed.info()["states"]] == ["two"]
        history = listed.history()
        assert history[:len(acknowledged)] == acknowledged  # nothing acknowledged is missing
        assert [h["op"] for h in history[len(acknowledged):]] == ["sample"]  # the resent one, refused

        with pytest.raises(ServiceError) as err:  # before load_state: the weights are not the run's
            listed.forward_backward(DATA, "cross_entropy")
        assert err.value.status == 409 and "Work after the last save was lost" in err.value.message
        listed.load_state("two")
        assert listed.step == 2
        assert listed.compute_logprobs(PROBE)["logprobs"] == at_save  # the saved weights, exactly
        _train(listed)  # the same step again, with the restored optimizer: the same weights as before the crash
        assert listed.step == 3
        assert listed.compute_logprobs(PROBE)["logprobs"] == pytest.approx(after_save, abs=1e-6)
    finally:
        server.stop()


@pytest.mark.slow
def test_a_critic_added_to_a_run_comes_back_after_a_crash(tmp_path: Path):
    """add_critic is part of the run: after SIGKILL and restart the run is re-created with its value head, so
    load_state restores the trained head (it used to refuse: the saved state had a critic, the run had none)."""
    from whileai.loop.step import value_datum

    server = LocalServer(tmp_path / "data").start()
    try:
        client = Client(server.url, server.token, retries=10, backoff=0.5)
        run = client.create_session().create_run("builtin:tiny", seed=7)
        run.add_critic(1e-2, reward_range=[0.0, 1.0])
        datum = value_datum({"prompt_tokens": [1, 72, 105], "tokens": [33, 2]}, [0.5, 0.5], [1.0, 1.0])
        for _ in range(2):
            run.forward_backward([datum], "ppo_critic")
            run.optim_step(ADAM)
        trained = run.forward([datum], "ppo_critic").loss_fn_outputs[0]["values"]
        run.save_state("with-critic")
        server.kill()
        server.start()
        [listed] = Client(server.url, server.token).sessions()[0].runs()
        listed.load_state("with-critic")
        assert listed.forward([datum], "ppo_critic").loss_fn_outputs[0]["values"] == pytest.approx(trained, abs=1e-7)
    finally:
        server.stop()
