"""A training server that dies under `wai train --url` stops the run in bounded time with `ServerStopped`:
the training server named, the request that failed (not the session's cleanup `DELETE`), the latest
checkpoint, and the resume line; restarted on its data folder, the resume finishes the run."""

from __future__ import annotations

import json
import secrets
import threading
import time
from pathlib import Path

import pytest

import whileai as wai
from whileai.errors import ServerStopped
from whileai.service.launch import LocalServer, start_server

pytestmark = pytest.mark.slow


def _kill_after(server: LocalServer, metrics: Path, steps: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            server.kill()
            return
        time.sleep(0.05)


def test_a_killed_training_server_stops_the_run_naming_the_request_and_the_resume(tmp_path):
    settings = dict(steps=6, rollouts_per_step=4, warm_start_steps=0, eval_tasks=0, progress=False, save_every=2,
                    lr_schedule="constant", export=False)
    run_dir = tmp_path / "run"
    with start_server(tmp_path / "data", args=["--model", "builtin:tiny"]) as server:
        killer = threading.Thread(target=_kill_after, args=(server, run_dir / "metrics.jsonl", 3))
        killer.start()
        began = time.perf_counter()
        with pytest.raises(ServerStopped) as stopped:
            wai.train(**settings, url=server.url, token=server.token, run_dir=str(run_dir))
        took = time.perf_counter() - began
        killer.join()
        message = str(stopped.value)
        print(message, f"({took:.0f} s)")
        assert stopped.value.role == "training server" and f"the training server at {server.url} failed at step" \
            in message
        assert "/v1/training/runs/" in message and "did not answer" in message and "DELETE" not in message
        assert "The latest checkpoint is step 2" in message
        assert message.endswith(f"resume with: wai train --resume {run_dir}")
        assert took < 120  # the client gives up 30 s after the server went away
        server.start()  # the same port and data folder: the saved state is there
        resumed = wai.train(resume=str(run_dir), token=server.token)  # tokens are never written to the run
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7)) and resumed.summary["steps"] == 6


def test_a_killed_tinker_api_server_stops_the_run_in_bounded_time_naming_the_operation(tmp_path):
    """--api tinker: the SDK retries a dead server for minutes and then raised a raw RetryableException; the run
    now checks the server every POLL_S while it waits, and stops with ServerStopped naming the SDK operation, the
    checkpoint and the resume line; restarted, the resume finishes the run."""
    settings = dict(steps=6, rollouts_per_step=4, warm_start_steps=0, eval_tasks=0, progress=False, save_every=2,
                    lr_schedule="constant", export=False, api="tinker")
    run_dir = tmp_path / "run"
    token = "tml-" + secrets.token_urlsafe(24)  # the SDK takes only keys that start with 'tml-'
    with start_server(tmp_path / "data", token=token, args=["--model", "builtin:tiny"]) as server:
        killer = threading.Thread(target=_kill_after, args=(server, run_dir / "metrics.jsonl", 3))
        killer.start()
        began = time.perf_counter()
        with pytest.raises(ServerStopped) as stopped:
            wai.train(**settings, url=server.url, token=token, run_dir=str(run_dir))
        took = time.perf_counter() - began
        killer.join()
        message = str(stopped.value)
        print(message, f"({took:.0f} s)")
        assert stopped.value.role == "training server" and "stopped answering" in message
        assert any(op in message for op in ("sample", "forward", "optim_step", "save_weights_and_get_sampling_client"))
        assert "Retryable" not in message.split("(")[0] and "The latest checkpoint is step 2" in message
        assert message.endswith(f"resume with: wai train --resume {run_dir}")
        assert took < 120
        server.start()
        resumed = wai.train(resume=str(run_dir), token=token)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7)) and resumed.summary["steps"] == 6
