"""`wai train --sampler-url` end to end against a real `wai policy` subprocess: builtin:case learns through it
with full fine-tuning (the default run, lag 2) and with a LoRA adapter (lag 0, where every sampled token's
ratio of trainer to server probability is 1 within 1e-4), the paired held-out interval excluding 0 and no
row staler than the lag; a server killed with SIGKILL mid-run stops the run with a checkpoint and the resume
line, and the resumed run (server restarted) trains each step once, ending on the weights of a run that was
never cut."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import whileai as wai
from whileai.loop.hooks.context import read_state
from whileai.loop.sources.sampler import ServerStopped
from whileai.record.launch import Started

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("wai_token")]


@pytest.mark.parametrize(("name", "settings"), [
    ("full", {}),  # the embedded default run: 40 steps, lag 2, every weight
    ("lora", {"lora_rank": 8, "lag": 0}),
])
def test_builtin_case_learns_through_a_policy_server(tmp_path, name, settings):
    with Started(["policy", "builtin:tiny", "--threads", "1"], tmp_path) as server:
        run = wai.train(sampler_url=server.url, progress=False, run_dir=str(tmp_path / name), **settings)
    compare, records = run.summary["compare"], run.metrics()
    print(name, compare["text"], f"{run.summary['seconds']:.0f} s")
    assert compare["delta"] > 0 and compare["excludes_zero"], compare
    lag = run.summary["plan"]["values"]["lag"]
    assert max(r["staleness/max"] for r in records) == lag and all(r["staleness/max"] <= lag for r in records)
    if lag == 0:
        assert max(r["ratio_gap_max"] for r in records) < 1e-4


def _kill_after(server: Started, metrics: Path, steps: int) -> None:
    while not metrics.exists() or len(metrics.read_text().splitlines()) < steps:
        time.sleep(0.02)
    server.kill()


def test_a_killed_server_stops_the_run_cleanly_and_the_resume_trains_nothing_twice(tmp_path):
    settings = dict(steps=8, rollouts_per_step=8, warm_start_steps=0, eval_tasks=0, progress=False, save_every=1000,
                    lr_schedule="constant", learning_rate=3e-2, lag=0)
    cut = tmp_path / "cut"
    with Started(["policy", "builtin:tiny", "--threads", "1"], tmp_path) as server:
        whole = wai.train(**settings, sampler_url=server.url, run_dir=str(tmp_path / "whole"))
        killer = threading.Thread(target=_kill_after, args=(server, cut / "metrics.jsonl", 3))
        killer.start()
        with pytest.raises(ServerStopped) as stopped:
            wai.train(**settings, sampler_url=server.url, run_dir=str(cut))
        killer.join()
        step, message = stopped.value.step, str(stopped.value)
        print(message)
        assert 3 <= step < 8 and read_state(cut).step == step  # the checkpoint holds every step trained
        assert f"the inference server at {server.url} failed at step {step}: " in message
        assert "broke" in message or "no inference server answers" in message  # what happened, in the client's words
        assert message.endswith(f"resume with: wai train --resume {cut}")
        server.start()  # the same port, its base weights again: the resume pushes its own
        resumed = wai.train(resume=str(cut))
    assert [r["step"] for r in resumed.metrics()] == list(range(1, 9))
    a, b = load_file(str(whole.weights / "model.safetensors")), load_file(str(resumed.weights / "model.safetensors"))
    assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a) < 1e-6  # lag 0: deterministic, nothing trained twice
