"""Sequence numbers: order whatever the arrival order, retries answered from the record, conflicts, gaps."""

from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from whileai.service import Client
from whileai.service.launch import LocalServer, start_server

# cheap operations, each with its body; optim_step with no gradient still counts a step
CHEAP = [("noop", {}), ("optim_step", {"adam_params": {"learning_rate": 1e-3}}), ("save_weights_for_sampler", {}),
         ("noop", {})]


def _send(http: httpx.Client, run_id: str, op: str, body: dict, seq: int) -> httpx.Response:
    content = json.dumps({"seq_id": seq, **body}).encode()
    return http.post(f"/v1/training/runs/{run_id}/{op}", content=content)


def _answer(http: httpx.Client, response: httpx.Response) -> httpx.Response:
    while response.status_code == 202:
        response = http.get(f"/v1/training/requests/{response.json()['request_id']}", params={"wait": 5})
    return response


def _http(server: LocalServer, token: str | None = None) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {token or server.token}"})


def test_a_retry_gets_the_recorded_answer_and_a_different_body_a_409(service: LocalServer, client: Client):
    run = client.create_session().create_run("builtin:tiny")
    with _http(service) as http:
        first = _answer(http, _send(http, run.id, "optim_step", {"adam_params": None}, 0))
        again = _answer(http, _send(http, run.id, "optim_step", {"adam_params": None}, 0))
        assert first.status_code == again.status_code == 200 and first.text == again.text
        assert first.json()["step"] == 1
        conflict = _send(http, run.id, "optim_step", {"adam_params": {"learning_rate": 0.5}}, 0)
        assert conflict.status_code == 409 and "operation 0 was already sent as 'optim_step'" in conflict.text
        other_op = _send(http, run.id, "noop", {}, 0)
        assert other_op.status_code == 409
    assert client.run(run.id).info()["step"] == 1 and len(run.history()) == 1  # it ran once


def test_operations_run_in_seq_order_whatever_order_they_arrive_in(service: LocalServer, client: Client):
    run = client.create_session().create_run("builtin:tiny")
    ops = [CHEAP[i % len(CHEAP)] for i in range(12)]
    order = list(range(12))
    random.Random(0).shuffle(order)
    with _http(service) as http, ThreadPoolExecutor(12) as pool:
        futures = {}
        for seq in order:
            futures[seq] = pool.submit(lambda s: _answer(http, _send(http, run.id, *ops[s], s)), seq)
            time.sleep(0.01)
        answers = {seq: f.result().json() for seq, f in futures.items()}
    steps = 0
    for seq in range(12):
        assert answers[seq]["version"] == steps, seq  # it saw exactly the optim_steps numbered before it
        steps += ops[seq][0] == "optim_step"
    assert [h["seq_id"] for h in run.history()] == list(range(12))


def test_a_missing_earlier_number_times_out_naming_it(service: LocalServer, client: Client):
    run = client.create_session().create_run("builtin:tiny")
    with _http(service) as http:
        started = time.monotonic()
        early = _answer(http, _send(http, run.id, "noop", {}, 2))
        assert early.status_code == 408 and early.json()["error"]["missing"] == 0
        assert "waited 3 s for operation 0, which never arrived" in early.text
        assert time.monotonic() - started >= 3.0
        for seq in (0, 1, 2):  # the early one did not use up its number: once 0 and 1 came, it runs
            assert _answer(http, _send(http, run.id, "noop", {}, seq)).status_code == 200
    assert [h["seq_id"] for h in run.history()] == [0, 1, 2]


def test_a_long_operation_answers_a_request_id_to_poll(service: LocalServer, client: Client):
    run = client.create_session().create_run("builtin:tiny")
    with _http(service) as http:
        waiting = _send(http, run.id, "noop", {}, 1)  # cannot run before 0: answered 202 after 1 s
        assert waiting.status_code == 202 and waiting.json()["request_id"] == f"{run.id}.1"
        assert _answer(http, _send(http, run.id, "noop", {}, 0)).status_code == 200
        assert _answer(http, waiting).json()["seq_id"] == 1
        unknown = http.get(f"/v1/training/requests/{run.id}.99")
        assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "UnknownRequest"


@pytest.mark.slow
def test_eight_clients_out_of_order_with_duplicates_and_retries(tmp_path: Path):
    """8 runs x 200 operations, shuffled together, a third sent twice, a tenth retried after their answer:
    each run executes exactly its sequence once, and its optimizer step count matches."""
    n_runs, n_ops = 8, 200
    rng = random.Random(1)
    with start_server(tmp_path / "data", args=["--respond-within", "0.2", "--order-timeout", "120"]) as server:
        client = Client(server.url, server.token)
        runs = [client.create_session().create_run("builtin:tiny") for _ in range(n_runs)]
        plan = {run.id: [rng.choice(CHEAP) for _ in range(n_ops)] for run in runs}
        sends = [(r, s) for r in plan for s in range(n_ops)]
        sends += rng.sample(sends, len(sends) // 3)  # duplicates, in flight at the same time
        rng.shuffle(sends)
        answers: dict[tuple[str, int], set[str]] = {}
        lock = threading.Lock()
        https = {run.id: _http(server) for run in runs}  # one HTTP client per run, used from many threads

        def send(key: tuple[str, int]) -> httpx.Response:
            return _send(https[key[0]], key[0], *plan[key[0]][key[1]], key[1])

        with ThreadPoolExecutor(16) as pool:  # submit everything first: none waits on an unsent one
            first = list(zip(sends, pool.map(send, sends)))
        with ThreadPoolExecutor(16) as pool:
            done = list(pool.map(lambda kr: (kr[0], _answer(https[kr[0][0]], kr[1])), first))
        retries = rng.sample(sorted(set(sends)), len(plan) * n_ops // 10)
        done += [(key, _answer(https[key[0]], send(key))) for key in retries]
        for key, response in done:
            assert response.status_code == 200, response.text
            with lock:
                answers.setdefault(key, set()).add(response.text)
        for http in https.values():
            http.close()
        assert all(len(texts) == 1 for texts in answers.values())  # a duplicate got the very same answer
        assert sum(1 for _, r in first if r.status_code == 202) > 0  # the polling path was taken
        for run in runs:
            steps = 0
            for seq, (op, _) in enumerate(plan[run.id]):
                answer = json.loads(next(iter(answers[(run.id, seq)])))
                assert (answer["op"], answer["version"]) == (op, steps), (run.id, seq)
                steps += op == "optim_step"
            history = run.history()
            assert [(h["seq_id"], h["op"]) for h in history] == [(s, op) for s, (op, _) in enumerate(plan[run.id])]
            assert run.info()["step"] == steps == sum(op == "optim_step" for op, _ in plan[run.id])
