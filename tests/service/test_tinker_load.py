"""8 SDK processes at once against one `wai serve`: each creates a run with the same seed at the same moment and
trains it; every process must see the same losses, step for step (a run's initial state is a function of its
own settings only, and each run's operations run in its client's order)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")

from whileai.service.launch import start_server  # noqa: E402

pytestmark = pytest.mark.slow
PROCESSES, STEPS = 8, 4
CLIENT = """
import json, sys, time
import tinker
from tinker import types

url, key, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
service = tinker.ServiceClient(base_url=url, api_key=key)
tokens = [1, 57, 46, 54, 64, 60, 2]
datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:], "weights": [0.0] * 4 + [1.0, 1.0]})
time.sleep(max(0.0, start_at - time.time()))          # every process creates its run at the same moment
training = service.create_lora_training_client(base_model="builtin:mini", rank=4, seed=7)
losses = []
for _ in range(int(sys.argv[4])):
    step = training.forward_backward([datum], "cross_entropy")
    training.optim_step(types.AdamParams(learning_rate=1e-2, eps=1e-8))
    losses.append(step.result().metrics["loss:sum"])
print(json.dumps({"model_id": training.model_id, "losses": losses}))
"""


def test_eight_sdk_processes_creating_runs_at_once_with_one_seed_see_identical_losses(tmp_path: Path) -> None:
    with start_server(tmp_path / "data", token="tml-" + secrets.token_urlsafe(16)) as server:
        start_at = time.time() + 8.0  # after every process has imported the SDK and opened its session
        procs = [subprocess.Popen([sys.executable, "-c", CLIENT, server.url, server.token, str(start_at), str(STEPS)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(PROCESSES)]
        outputs = [p.communicate(timeout=600) for p in procs]
        histories = {}
        for out, _ in outputs:
            if out.strip():
                model_id = json.loads(out.strip().splitlines()[-1])["model_id"]
                histories[model_id] = [h["op"] for h in httpx.get(
                    f"{server.url}/v1/training/runs/{model_id}/operations",
                    headers={"Authorization": f"Bearer {server.token}"}).json()]
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-2000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert len({r["model_id"] for r in results}) == PROCESSES      # eight runs, not one shared
    for model_id, ops in histories.items():                         # each ran its client's ops exactly once
        assert ops == ["forward_backward", "optim_step"] * STEPS, (model_id, ops)
    first = results[0]["losses"]
    assert all(b < a for a, b in zip(first, first[1:])), first     # it trains
    assert [r["losses"] for r in results] == [first] * PROCESSES   # bit-identical, step 1 included
