"""`wai serve` under concurrent clients and a dying server: runs created at once on a fresh server all load
(model builds are serialized), a failure the server did not foresee is a 500 in the documented error shape,
and a client whose server is gone gives up in bounded time naming the operation that failed."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from whileai.service import Client, ServiceError
from whileai.service.launch import start_server


def test_runs_created_at_once_on_a_fresh_server_all_load(tmp_path):
    with start_server(tmp_path / "data") as server:
        headers = {"authorization": f"Bearer {server.token}"}
        session = httpx.post(server.url + "/v1/training/sessions", headers=headers).json()["session_id"]

        def create(seed: int) -> httpx.Response:
            return httpx.post(f"{server.url}/v1/training/sessions/{session}/runs", headers=headers, timeout=120,
                              json={"base_model": "builtin:tiny" if seed % 2 else "builtin:mini", "seed": seed})

        with ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(create, range(8)))
        assert [r.status_code for r in replies] == [200] * 8, [r.text[:200] for r in replies]
        assert len({r.json()["run_id"] for r in replies}) == 8


def test_an_unforeseen_failure_is_a_500_in_the_documented_shape(tmp_path):
    from starlette.testclient import TestClient

    from whileai.record.policy_app import create_policy_app
    from whileai.record.proxy import RecordConfig, create_record_app
    from whileai.service.app import ServeConfig, create_app

    apps = [create_app(ServeConfig(data_dir=tmp_path / "s", tokens=["t" * 20])),
            create_record_app(RecordConfig(upstream="http://127.0.0.1:9", data_dir=tmp_path / "r", token="t" * 20))]

    class Broken:  # a model object whose every use raises: stands in for a bug
        def __getattr__(self, name):
            raise RuntimeError("boom")

    from whileai.record.policy import Served

    apps.append(create_policy_app(Served(Broken(), "m", "v"), token="t" * 20))
    for app in apps:
        app.add_api_route("/boom", lambda: 1 / 0)
        with TestClient(app, raise_server_exceptions=False) as client:
            reply = client.get("/boom", headers={"authorization": "Bearer " + "t" * 20})
            assert reply.status_code == 500
            error = reply.json()["error"]
            assert "ZeroDivisionError" in error["message"] and "still up" in error["message"]
    with TestClient(apps[2], raise_server_exceptions=False) as client:
        reply = client.post("/v1/completions", json={"prompt": [1]}, headers={"authorization": "Bearer " + "t" * 20})
        assert reply.status_code == 500 and "RuntimeError: boom" in reply.json()["error"]["message"]


def test_a_client_of_a_dead_server_gives_up_in_bounded_time_naming_the_operation(tmp_path):
    with start_server(tmp_path / "data") as server:
        client = Client(server.url, server.token, give_up_after=4.0)
        session = client.create_session()
        run = session.create_run("builtin:tiny")
        server.kill()
        began = time.perf_counter()
        with pytest.raises(ServiceError) as failed:
            run.forward([{"model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
                          "loss_fn_inputs": {"target_tokens": [2, 3], "weights": [1.0, 1.0]}}], "cross_entropy")
        took = time.perf_counter() - began
        print(failed.value, f"({took:.1f} s)")
        assert took < 8 and failed.value.status == 0
        assert f"POST /v1/training/runs/{run.id}/forward failed: the server at {server.url} did not answer" \
            in str(failed.value)
        began = time.perf_counter()
        with pytest.raises(ServiceError, match=f"DELETE /v1/training/sessions/{session.id} failed"):
            session.close()  # a cleanup after a give-up tries once
        assert time.perf_counter() - began < 2
