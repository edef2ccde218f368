"""The production loop closed, every part real and in its own process: `wai policy` serves a warm-started
builtin:tiny, `wai record` sits in front of it, users (examples/production_loop.py) ask `case` tasks through
the recorder with the official `openai` client while a grader posts each score a second later, and `wai train
--rows-from RECORDER --sampler-url SERVER` trains LoRA on the traces as they are scored, pushing each step's
adapter back into the server the traffic goes to. It is stopped with Ctrl-C (SIGINT) mid-run and resumed.
Served pass@1 on held-out tasks, asked of the server, rises; every trace is trained once; every row names
the weights that served it."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import whileai as wai
from whileai.envs import load_taskset
from whileai.loop.sources.recorder import ADAPTER, RecorderFeed
from whileai.loop.sources.traces import load_vocab
from whileai.loop.types import PASS
from whileai.record.launch import Started

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS, SIZE, STOP_AFTER = 10, 32, 3
TEST_TASKS, SAMPLES = 64, 4


def _example():
    spec = importlib.util.spec_from_file_location("production_loop", REPO / "examples" / "production_loop.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train(args, log):
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "whileai", "train", *args, "--no-progress"], stdout=out,
                                stderr=subprocess.STDOUT)


def _steps(run_dir):
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_traffic_scored_late_trains_continuously_and_the_served_pass_rate_rises(tmp_path):
    users = _example()
    taskset = load_taskset("builtin:case")
    warm = wai.train(method="flash_reinforce", taskset="builtin:case", steps=1, warm_start_steps=14, eval_tasks=0,
                     rollouts_per_step=8, progress=False, run_dir=str(tmp_path / "warm"))
    model, run_dir, log = str(warm.weights), tmp_path / "rl", tmp_path / "train.log"
    tokenizer = load_vocab(model).tokenizer
    with Started(["policy", model, "--threads", "1"], tmp_path) as policy, \
            Started(["record", "--upstream", policy.url, "--data-dir", str(tmp_path / "data")], tmp_path) as recorder:
        before = users.served_pass(policy.url, model, tokenizer, taskset, TEST_TASKS, SAMPLES)  # = step 0's adapter
        trainer = _train(["--rows-from", recorder.url, "--sampler-url", policy.url, "--model", model,
                          "--lora-rank", "8", "--learning-rate", "2e-2", "--steps", str(STEPS),
                          "--rollouts-per-step", str(SIZE), "--run-dir", str(run_dir)], log)
        done = threading.Event()

        def traffic():
            users.wait_for_model(recorder.url, ADAPTER)  # the trainer's first push loads it
            users.traffic(recorder.url, ADAPTER, tokenizer, taskset, 100_000, score_after=1.0, stop=done.is_set)

        users_thread = threading.Thread(target=traffic)
        users_thread.start()
        try:
            deadline = time.monotonic() + 600
            while len(_steps(run_dir)) < STOP_AFTER and trainer.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            trainer.send_signal(signal.SIGINT)  # Ctrl-C: the step finishes, a checkpoint, the resume line
            assert trainer.wait(timeout=300) == 130, log.read_text()
            assert f"Resume with: wai train --resume {run_dir}" in log.read_text()
            stopped_at = len(_steps(run_dir))
            assert STOP_AFTER <= stopped_at < STEPS
            resumed = _train(["--resume", str(run_dir)], log)
            assert resumed.wait(timeout=900) == 0, log.read_text()
            checked = [line for line in log.read_text().splitlines() if line.startswith("preflight: ")]
            # the traffic was capped by its server: the plan's cap (the method's 8192) is not shown as if it were
            assert checked and checked[0].startswith("preflight: ok") and ", cap " not in checked[0], checked
        finally:
            done.set()
            users_thread.join(timeout=120)
            trainer.kill()
        after = users.served_pass(policy.url, ADAPTER, tokenizer, taskset, TEST_TASKS, SAMPLES)
        exported = RecorderFeed(recorder.url).after(0, 1024)
    records = _steps(run_dir)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    trained = [seq for r in records for seq in r["recorded/scored_seqs"]]
    assert trained == list(range(1, STEPS * SIZE + 1)), "a trace trained twice, or one skipped, across the stop"
    assert all(r["recorded/unknown_version"] == 0 and r["recorded/refused"] == 0 for r in records)
    gaps = [r["recorded/version_gap_max"] for r in records]
    print(f"version gaps (max per step): {gaps}")
    assert min(gaps) >= 0 and max(gaps[:stopped_at]) <= 2  # served by the latest pushes while the trainer ran
    # (after the restart, the traces served meanwhile by the last weights before the stop are trained)
    assert exported["refused"] == [] and len(exported["rows"]) >= STEPS * SIZE
    assert all(str(row["weights_version"]).startswith(f"{ADAPTER}@sha256:") for row in exported["rows"])
    served = {row["weights_version"] for row in exported["rows"]}
    assert len(served) >= STEPS // 2  # the traffic really was served by the new weights, step after step
    result = wai.compare(before, after, threshold=PASS, baseline_name="served before", treatment_name="after")
    print(result, f"stopped after step {stopped_at}, {len(exported['rows'])} traces scored, {len(served)} versions")
    assert result.delta > 0.1 and result.ci95[0] > 0, result


def test_a_recorder_that_stops_answering_stops_the_run_with_a_checkpoint_and_the_resume_reads_on(tmp_path):
    """The recorder is killed (SIGKILL) while the trainer waits for its second batch: the trainer says so, writes
    a checkpoint and stops with the resume line; the recorder restarted on its data, the resumed run trains the
    traces scored since, from where its checkpoint ended."""
    import httpx

    from whileai.record.rewards import score

    run_dir, log = tmp_path / "rl", tmp_path / "train.log"
    users = _example()

    def asks(recorder, rewards):
        for k, reward in enumerate(rewards):
            reply = httpx.post(f"{recorder.url}/v1/completions", headers=recorder.headers, timeout=60,
                               json={"model": ADAPTER, "prompt": [1, 72 + k], "max_tokens": 2})
            score(recorder.url, reply.headers["x-whileai-trace-id"], reward)

    with Started(["policy", "builtin:tiny", "--threads", "1"], tmp_path) as policy:
        recorder = Started(["record", "--upstream", policy.url, "--data-dir", str(tmp_path / "data")], tmp_path)
        recorder.start()
        try:
            trainer = _train(["--rows-from", recorder.url, "--sampler-url", policy.url, "--lora-rank", "4",
                              "--steps", "3", "--rollouts-per-step", "4", "--run-dir", str(run_dir)], log)
            users.wait_for_model(recorder.url, ADAPTER)
            asks(recorder, [1.0, 0.0, 1.0, 0.0])
            deadline = time.monotonic() + 300
            while not _steps(run_dir) and trainer.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            recorder.kill()
            assert trainer.wait(timeout=120) == 2, log.read_text()
            text = log.read_text()
            assert f"the recorder at {recorder.url} failed at step 1: no recorder answers" in text, text
            assert f"then resume with: wai train --resume {run_dir}" in text
            recorder.start()  # the same port and data: the traces and scores it acknowledged are all there
            resumed = _train(["--resume", str(run_dir)], log)
            users.wait_for_model(recorder.url, ADAPTER)
            asks(recorder, [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
            assert resumed.wait(timeout=300) == 0, log.read_text()
        finally:
            recorder.stop()
    records = _steps(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["recorded/scored_seqs"] for r in records] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]


def test_full_fine_tuning_reloads_every_weight_under_the_served_name_and_each_row_names_its_step(tmp_path):
    """--lora-rank 0: each push is an /update_weights_from_disk of the whole model, versioned policy-step<k>;
    the clients keep asking for the served model's own name, and every trained row maps to the step that
    pushed the weights that served it."""
    import httpx

    from whileai.record.rewards import score

    run_dir, log = tmp_path / "rl", tmp_path / "train.log"
    with Started(["policy", "builtin:tiny", "--threads", "1"], tmp_path) as policy, \
            Started(["record", "--upstream", policy.url, "--data-dir", str(tmp_path / "data")], tmp_path) as recorder:
        trainer = _train(["--rows-from", recorder.url, "--sampler-url", policy.url, "--lora-rank", "0",
                          "--steps", "2", "--rollouts-per-step", "4", "--learning-rate", "1e-3",
                          "--run-dir", str(run_dir)], log)
        deadline = time.monotonic() + 300
        while httpx.get(f"{policy.url}/healthz", headers=policy.headers).json()["weights_version"] != "policy-step0":
            assert trainer.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        for k in range(8):
            while k == 4 and not _steps(run_dir):  # the second batch is asked of step 1's weights
                assert trainer.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            reply = httpx.post(f"{recorder.url}/v1/completions", headers=recorder.headers, timeout=60,
                               json={"model": "builtin:tiny", "prompt": [1, 72 + k], "max_tokens": 2})
            score(recorder.url, reply.headers["x-whileai-trace-id"], float(k % 2))
        assert trainer.wait(timeout=300) == 0, log.read_text()
        rows = RecorderFeed(recorder.url).after(0, 100)["rows"]
        final = httpx.get(f"{policy.url}/healthz", headers=policy.headers).json()["weights_version"]
    assert [row["weights_version"] for row in rows] == ["policy-step0"] * 4 + ["policy-step1"] * 4
    assert final == "policy-step2"
    records = _steps(run_dir)
    assert [(r["recorded/unknown_version"], r["recorded/version_gap_max"]) for r in records] == [(0, 0), (0, 0)]
