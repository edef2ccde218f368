"""Whole runs: what a run directory holds, exact resume, Ctrl-C, rows-trained methods."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import whileai as wai

TIMING = ("time/sample_s", "time/train_s", "time/step_s", "time/elapsed_s")


def _without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def _event_tags(folder: Path) -> set[str]:
    """Scalar tags in TensorBoard event files, read with the record format's own framing."""
    from tensorboardX.proto import event_pb2

    tags = set()
    for path in folder.glob("events.out.tfevents.*"):
        data = path.read_bytes()
        offset = 0
        while offset + 12 <= len(data):
            length = int.from_bytes(data[offset:offset + 8], "little")
            event = event_pb2.Event.FromString(data[offset + 12: offset + 12 + length])
            tags |= {v.tag for v in event.summary.value}
            offset += 12 + length + 4
    return tags


def test_a_run_writes_everything_a_user_reads(tmp_path: Path, quick):
    run = wai.train(**{**quick, "eval_tasks": 8, "eval_samples": 2, "export": True, "warm_start_steps": 2},
                    run_dir=str(tmp_path / "run"), lag=1)
    folder = run.dir
    records = run.metrics()
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(0.0 <= r["reward"] <= 1.0 and "admitted_share" in r and "drift" in r for r in records)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["eval_before"]["tasks"] == 8 and "compare" in summary
    assert summary["resolved"] == {"learning_rate": 1e-2, "lag": 1, "warm_start_steps": 2, "max_tokens": 4,
                                   "temperature": 1.0, "steps": 3, "warm_start_learning_rate": 1e-2}
    assert {"reward", "admitted_share", "drift", "loss"} <= _event_tags(folder / "tensorboard")
    assert (folder / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "method = \"flash_reinforce\"" in (folder / "config.toml").read_text()
    # the merged export loads with plain transformers and scores text like the engine does
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(run.weights))
    import torch

    ids = torch.tensor([[1, 70, 71, 72, 73]])
    with torch.no_grad():
        theirs = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])[:, 0]
    from whileai.engine import TrainingEngine

    engine = TrainingEngine("builtin:tiny", seed=0)
    engine.load_state(str(folder / "checkpoint"))
    ours = engine.compute_logprobs([1, 70, 71, 72, 73])["logprobs"][1:]
    np.testing.assert_allclose(theirs.numpy(), ours, atol=1e-4)


def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path: Path, quick):
    settings = {**quick, "steps": 4, "save_every": 2, "lag": 2}
    whole = wai.train(**settings, run_dir=str(tmp_path / "whole"))
    half = wai.train(**{**settings, "steps": 2}, run_dir=str(tmp_path / "half"))
    assert len(half.metrics()) == 2
    resumed = wai.train(resume=str(half.dir), steps=4, progress=False)
    assert _without_timing(resumed.metrics()) == _without_timing(whole.metrics())


def test_resume_refuses_fewer_steps_and_a_run_with_no_checkpoint(tmp_path: Path, quick):
    run = wai.train(**{**quick, "steps": 2}, run_dir=str(tmp_path / "two"))
    with pytest.raises(wai.ConfigError, match="is at step 2"):
        wai.train(resume=str(run.dir), steps=2)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.toml").write_text("[train]\nsteps = 2\n")
    with pytest.raises(wai.ConfigError, match="no checkpoint yet"):
        wai.train(resume=str(tmp_path / "empty"))


def test_a_taskset_object_with_a_python_grader_trains(tmp_path: Path, quick):
    from whileai.envs import load_taskset

    calls = []

    def vowels(task, completion):
        calls.append(completion)
        return sum(c in "aeiou" for c in completion) / max(len(completion), 1)

    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "answer": "aeiou"}) + "\n" for i in range(40)))
    tasks = load_taskset(str(path), grader=vowels, max_tokens=3)
    run = wai.train(**quick, taskset=tasks, run_dir=str(tmp_path / "obj"), force=True)  # no vowel yet: no signal
    # the probe before the warm start grades 10 tasks' answer and an empty completion (whileai.loop.plan.inputs);
    # then lag 2: two batches sampled ahead
    assert len(calls) == 2 * 10 + (3 + 2) * 8 and len(run.metrics()) == 3
    assert run.summary["preflight"]["ok"] is False
    assert "<taskset passed in Python>" in (run.dir / "config.toml").read_text()


def test_rae_state_lives_in_the_checkpoint(tmp_path: Path, quick):
    run = wai.train(**{**quick, "steps": 2}, method="rae", run_dir=str(tmp_path / "rae"))
    saved = next((run.dir / "checkpoint").glob("loop-*.json"))
    state = json.loads(saved.read_text())["method_state"]
    assert set(state) == {"baselines"} and len(state["baselines"]) == 1
    assert 0.0 < next(iter(state["baselines"].values())) < 1.0


@pytest.mark.slow
def test_ctrl_c_writes_a_checkpoint_exits_130_and_resume_finishes_the_same_run(tmp_path: Path):
    """Interrupted mid-run (linear learning-rate schedule, lag 2), resumed: the uninterrupted run's metrics."""
    settings = ["--steps", "24", "--rollouts-per-step", "8", "--warm-start-steps", "0", "--eval-tasks", "0",
                "--no-export", "--no-progress", "--save-every", "1000"]
    folder = tmp_path / "interrupted"
    command = [sys.executable, "-m", "whileai", "train", *settings, "--run-dir", str(folder)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not (folder / "metrics.jsonl").exists():
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=240)
    assert process.returncode == 130, err
    assert "wai train --resume" in err and str(folder) in err
    done = len((folder / "metrics.jsonl").read_text().splitlines())
    assert 1 <= done < 24
    loop_state = json.loads(next((folder / "checkpoint").glob("loop-*.json")).read_text())
    assert loop_state["step"] == done
    resumed = wai.train(resume=str(folder), progress=False)
    whole = wai.train(steps=24, rollouts_per_step=8, warm_start_steps=0, eval_tasks=0, export=False, progress=False,
                      save_every=1000, run_dir=str(tmp_path / "whole"))
    assert _without_timing(resumed.metrics()) == _without_timing(whole.metrics())


def test_sft_from_pushed_rows_lowers_the_loss(tmp_path: Path):
    rows = [{"prompt": "ab", "completion": "cd", "task_id": str(i)} for i in range(8)]
    run = wai.train(method="sft", rows=rows, lag=0, steps=6, rollouts_per_step=8, learning_rate=1e-2,
                    taskset=None, export=False, progress=False, run_dir=str(tmp_path / "sft"))
    losses = [r["loss"] for r in run.metrics()]
    assert losses[-1] < 0.8 * losses[0]
    assert (run.dir / "rows.jsonl").exists()  # rows passed in Python are saved with the run (for resume)


def test_dpo_from_pairs_raises_the_margin(tmp_path: Path):
    rows = []
    for i in range(4):
        rows += [{"prompt": "xy", "completion": "ab", "task_id": str(i), "reward": 1.0},
                 {"prompt": "xy", "completion": "zz", "task_id": str(i), "reward": 0.0}]
    run = wai.train(method="dpo", rows=rows, lag=0, steps=5, rollouts_per_step=8, learning_rate=1e-2,
                    taskset=None, export=False, progress=False, run_dir=str(tmp_path / "dpo"))
    margins = [r["method/mean_margin"] for r in run.metrics() if "method/mean_margin" in r]
    assert len(margins) == 5 and margins[-1] > margins[0] + 0.05


def test_a_reward_model_run_gives_a_judge_that_prefers_what_it_was_taught(tmp_path: Path):
    rows = []
    for i in range(6):
        rows += [{"prompt": f"q{i}", "completion": "good", "task_id": str(i), "reward": 1.0},
                 {"prompt": f"q{i}", "completion": "bad!", "task_id": str(i), "reward": 0.0}]
    run = wai.train(method="rm", rows=rows, lag=0, steps=30, rollouts_per_step=12, critic_learning_rate=3e-2,
                    taskset=None, export=False, progress=False, run_dir=str(tmp_path / "rm"))
    margins = [r["method/mean_margin"] for r in run.metrics()]
    assert margins[-1] > margins[0] + 0.5  # the Bradley-Terry loss -log sigmoid(margin) went down
    judge = wai.reward_model(run)
    good, bad = judge.scores([{"prompt": "q9", "completion": "good"}, {"prompt": "q9", "completion": "bad!"}])
    assert good > bad  # on a prompt it never saw
    from whileai.envs import Task

    assert judge(Task("x", "q9"), "good") == pytest.approx(good, abs=1e-5)  # the grader form
    with pytest.raises(wai.ConfigError, match="no scalar head"):
        wai.reward_model(wai.train(method="sft", rows=rows[:2], lag=0, steps=1, taskset=None, export=False,
                                   progress=False, run_dir=str(tmp_path / "sft")))


def test_a_grader_that_raises_names_the_task_and_leaves_the_checkpoint(tmp_path: Path, quick):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"p{i}", "answer": "x"}) + "\n" for i in range(40)))
    grader = tmp_path / "flaky_grader.py"
    grader.write_text("calls = [0]\n\ndef grade(task, completion):\n    calls[0] += 1\n"
                      "    if calls[0] > 20 + 24:\n        return float('nan')\n    return 0.5\n")  # 20: the probe's grades
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(wai.BatchError, match="task_id=") as info:
            wai.train(**{**quick, "steps": 5, "lag": 0}, taskset=str(tasks),
                      taskset_options={"grader": "flaky_grader:grade"}, max_tokens=2,
                      run_dir=str(tmp_path / "run"), force=True)  # a constant reward: the preflight would stop it
    finally:
        sys.path.remove(str(tmp_path))
    assert "nan" in str(info.value).lower()
    saved = json.loads(next((tmp_path / "run" / "checkpoint").glob("loop-*.json")).read_text())
    assert saved["step"] == 3  # 8 graded rollouts a step: steps 1-3 finished and were saved, step 4's failed
    from whileai.engine.state import snapshot_dir

    assert (snapshot_dir(tmp_path / "run" / "checkpoint") / "meta.json").exists()  # the checkpoint still loads


def test_method_auto_routes_on_a_probe_and_says_why(tmp_path: Path, quick):
    # after a short warm start some probe rollouts pass and some fail, so route picks a method the loop runs
    run = wai.train(**{**quick, "steps": 1, "lag": 0, "warm_start_steps": 12}, method="auto",
                    run_dir=str(tmp_path / "auto"))
    why = (run.dir / "route.txt").read_text()
    assert why.startswith("route: ") and run.summary["method"].split("(")[0].lower().replace("_", "") in \
        why.lower().replace("_", "")


def test_a_lora_run_exports_an_adapter_peft_loads(tmp_path: Path, quick):
    run = wai.train(**{**quick, "steps": 2, "export": True}, lora_rank=4, learning_rate=1e-2,
                    run_dir=str(tmp_path / "lora"))
    assert (run.weights / "adapter_config.json").exists()
    import torch
    from peft import PeftModel

    from whileai.engine import TrainingEngine
    from whileai.engine.models import build_builtin

    base, _ = build_builtin("tiny", seed=0)
    model = PeftModel.from_pretrained(base, str(run.weights)).eval()
    ids = torch.tensor([[1, 70, 71, 72]])
    with torch.no_grad():
        theirs = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])[:, 0]
    engine = TrainingEngine("builtin:tiny", seed=0, lora_rank=4)
    engine.load_state(str(run.dir / "checkpoint"))
    np.testing.assert_allclose(theirs.numpy(), engine.compute_logprobs([1, 70, 71, 72])["logprobs"][1:], atol=1e-4)


def test_sft_on_the_passes_of_graded_rows(tmp_path: Path):
    """The methods reference's "push scored.passes()": load graded rows, keep the passes, train SFT on them."""
    path = tmp_path / "graded.jsonl"
    path.write_text("".join(json.dumps({"task_id": str(i), "prompt": "ab", "completion": "cd" if i % 2 else "zz",
                                        "reward": float(i % 2)}) + "\n" for i in range(8)))
    scored = wai.load_graded(str(path))
    passes = scored.passes()
    assert [r["completion"] for r in passes] == ["cd"] * 4
    run = wai.train(method="sft", rows=passes, lag=0, steps=4, rollouts_per_step=4, learning_rate=1e-2,
                    taskset=None, export=False, progress=False, run_dir=str(tmp_path / "sft"))
    losses = [r["loss"] for r in run.metrics()]
    assert losses[-1] < losses[0]


def test_a_hub_id_offline_fails_fast_naming_the_local_path_fix(tmp_path: Path, quick):
    began = time.time()
    with pytest.raises(wai.ConfigError, match="local"):
        wai.train(**quick, model="someone/some-model", run_dir=str(tmp_path / "hub"))
    assert time.time() - began < 30


def test_method_auto_over_a_server_refuses_a_chosen_method_the_server_cannot_run(tmp_path: Path):
    """A named method is checked against the server's capabilities before anything is created; auto's choice
    is made later (on a probe), so it is checked then, against the same answer, before its first step."""
    from whileai.envs import load_taskset
    from whileai.errors import ConfigError
    from whileai.loop.auto import route_method
    from whileai.loop.plan.config import build
    from whileai.loop.plan.run_plan import make_plan
    from whileai.loop.types import LoopState
    from whileai.trainers.engine import EngineTrainer

    config = build(None, method="auto", steps=1, lag=0, warm_start_steps=12, rollouts_per_step=8, eval_tasks=0,
                   progress=False)
    taskset = load_taskset(config.taskset)
    plan = make_plan(config, {}, None, taskset)
    offered = {"models": [config.model], "operations": ["forward_backward", "optim_step", "sample"], "losses": {}}
    trainer = EngineTrainer(config.model, seed=0)  # standing in for a server trainer with these capabilities
    trainer.where, trainer.url, trainer.capabilities = "the server at http://example.invalid", "http://example.invalid", offered
    tmp_path.mkdir(exist_ok=True)
    with pytest.raises(ConfigError, match=r"--method auto chose .* cannot run: the method runs the engine loss"):
        route_method(config, plan, trainer, taskset, None, tmp_path, LoopState())
    assert not (tmp_path / "config.toml").exists()  # nothing written for a run that cannot start
