"""Nothing a run made is lost: two Ctrl-Cs at several points of a real `wai train` process never remove a run
directory that holds a checkpoint, metrics, the warm start's log or TensorBoard files; one Ctrl-C in the warm
start stops it within a step with a checkpoint, and --resume continues it to the uninterrupted run's numbers;
a run still training cannot be resumed a second time (its lock)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import whileai as wai
from whileai.loop.run import LOCK_FILE, WORK

UPPER = str(Path(__file__).resolve().parents[2] / "examples" / "tasksets" / "upper.jsonl")
SETTINGS = ["--taskset", UPPER, "--rollouts-per-step", "8", "--eval-tasks", "4", "--eval-samples", "1",
            "--no-export", "--no-progress", "--save-every", "1000", "--force"]


def _start(folder: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "whileai", "train", *SETTINGS, *extra, "--run-dir", str(folder)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(process: subprocess.Popen, path: Path, lines: int = 1, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.is_file() and len(path.read_text().splitlines()) >= lines:
            return
        if process.poll() is not None:
            raise AssertionError(f"the run ended before {path.name} had {lines} lines:\n{process.communicate()}")
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"{path} never had {lines} lines")


@pytest.mark.slow
@pytest.mark.parametrize("point", ["warm start", "rl steps"])
def test_two_ctrl_cs_never_remove_a_run_that_holds_work(tmp_path: Path, point: str):
    """The second Ctrl-C quits at once (exit 130) wherever it lands; what the run wrote before it stays."""
    folder = tmp_path / "run"
    process = _start(folder, "--warm-start-steps", "300" if point == "warm start" else "2", "--steps", "200")
    _wait_for(process, folder / ("warm_start.jsonl" if point == "warm start" else "metrics.jsonl"), lines=2)
    held = {name for name in WORK if (folder / name).exists()}
    process.send_signal(signal.SIGINT)
    time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=240)
    assert process.returncode == 130, err
    assert held and all((folder / name).exists() for name in held), (held, err)
    assert "kept" in err or "checkpoint written" in err, err
    assert not (folder / LOCK_FILE).exists()


@pytest.mark.slow
def test_ctrl_c_in_the_warm_start_checkpoints_within_a_step_and_resume_continues_it(tmp_path: Path, capsys):
    folder = tmp_path / "stopped"
    process = _start(folder, "--warm-start-steps", "40", "--steps", "2", "--lr-schedule", "constant")
    _wait_for(process, folder / "warm_start.jsonl", lines=3)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=240)
    assert process.returncode == 130, err
    assert "interrupted during the warm start, after its step" in err and f"--resume {folder}" in err
    assert "warm start step 1/40: loss 5.5" in out  # --no-progress: a line at the first step, then every 25
    from test_run import _event_tags

    assert {"warm_start/loss", "warm_start/pass_estimate"} <= _event_tags(folder / "tensorboard")
    steps = [json.loads(line)["warm_start_step"] for line in (folder / "warm_start.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1)) and 3 <= len(steps) <= 8  # within one step of the signal
    resumed = wai.train(resume=str(folder), progress=False)
    assert f"resuming {folder} in its warm start, after step {len(steps)} of 40" in capsys.readouterr().out
    whole = wai.train(taskset=UPPER, rollouts_per_step=8, eval_tasks=4, eval_samples=1, export=False,
                      progress=False, save_every=1000, warm_start_steps=40, steps=2, lr_schedule="constant", force=True,
                      run_dir=str(tmp_path / "whole"))
    logged = [json.loads(line) for line in (folder / "warm_start.jsonl").read_text().splitlines()]
    assert [r["warm_start_step"] for r in logged] == list(range(1, 41))
    assert [r["loss"] for r in logged] == [json.loads(line)["loss"]
                                           for line in (whole.dir / "warm_start.jsonl").read_text().splitlines()]
    assert resumed.summary["eval_after"]["pass_at_1"] == whole.summary["eval_after"]["pass_at_1"]


@pytest.mark.slow
def test_sigterm_stops_after_the_step_with_a_checkpoint_and_resume_continues(tmp_path: Path):
    """SIGTERM (what kill, timeout and job schedulers send) is a first Ctrl-C: the step ends, a checkpoint is
    written, the lock is released, and --resume continues from it."""
    folder = tmp_path / "termed"
    process = _start(folder, "--warm-start-steps", "2", "--steps", "200")
    _wait_for(process, folder / "metrics.jsonl", lines=2)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=240)
    assert process.returncode == 130, err
    assert "SIGTERM: finishing this step" in out and "checkpoint written" in err, (out, err)
    step = int(err.split("interrupted after step ")[1].split(";")[0])
    assert list((folder / "checkpoint").glob("loop-*.json")) and not (folder / LOCK_FILE).exists()
    assert wai.train(resume=str(folder), steps=step + 2, progress=False).summary["steps"] == step + 2


def test_a_run_that_is_still_training_cannot_be_resumed_again(tmp_path: Path, quick):
    """The lock names a live process (this one): refused; a lock left by a dead process is taken over."""
    run = wai.train(**quick, run_dir=str(tmp_path / "r"))

    (run.dir / LOCK_FILE).write_text(f"{os.getpid()} {socket.gethostname()}\n")
    with pytest.raises(wai.ConfigError, match=f"still training \\(pid {os.getpid()}, run.lock\\)"):
        wai.train(resume=str(run.dir), steps=4, progress=False)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run.dir / LOCK_FILE).write_text(f"{dead.pid} {socket.gethostname()}\n")
    assert wai.train(resume=str(run.dir), steps=4, progress=False).summary["steps"] == 4
    assert not (run.dir / LOCK_FILE).exists()



def test_a_live_run_still_in_its_warm_start_is_named_as_training_not_as_checkpointless(tmp_path: Path):
    """A run in its warm start has a config and a lock but no checkpoint yet: a second --resume is told it is
    still training (pid), not that it has nothing to resume (newcomer review)."""
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "config.toml").write_text('[train]\ntaskset = "builtin:case"\n')
    (folder / LOCK_FILE).write_text(f"{os.getpid()} {socket.gethostname()}\n")
    with pytest.raises(wai.ConfigError, match=f"still training \\(pid {os.getpid()}, run.lock\\)"):
        wai.train(resume=str(folder), progress=False)


def test_an_error_after_work_keeps_the_run_and_says_so(tmp_path: Path, capsys):
    """The preflight stops a run whose warm start taught nothing it can use: the warm start's log and TensorBoard
    stay (not removed as a half-made run), and stderr names the kept directory."""
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"{i:03d}?", "answer": "qqqqqq"}) + "\n" for i in range(60)))
    with pytest.raises(wai.ConfigError, match="NO SIGNAL"):
        wai.train(taskset=str(tasks), warm_start_steps=1, steps=2, rollouts_per_step=8, eval_tasks=0,
                  max_tokens=1, progress=False, export=False, run_dir=str(tmp_path / "r"))
    assert (tmp_path / "r" / "warm_start.jsonl").is_file() and (tmp_path / "r" / "tensorboard").is_dir()
    printed = capsys.readouterr()
    assert f"run directory {tmp_path / 'r'} kept" in printed.err
    assert "NO SIGNAL" not in printed.out + printed.err  # the report comes once, in the error, not also above it


def test_the_kept_message_names_run_dir_only_when_the_user_gave_one(tmp_path: Path):
    """A run with no --run-dir gets a new time-stamped directory on its own: its kept message does not send the
    user to a flag they never gave (newcomer review)."""
    from whileai.loop.run import kept_message

    (tmp_path / "metrics.jsonl").write_text("")
    mine = kept_message(tmp_path, given=False)
    assert "--run-dir" not in mine and "start the run again (it gets a directory of its own)" in mine
    assert "start the run again with another --run-dir" in kept_message(tmp_path, given=True)


def test_an_error_after_the_warm_start_keeps_it_resumable(tmp_path: Path, monkeypatch, capsys):
    """A grader that breaks after the probe (in the first held-out evaluation) used to throw the warm start away
    ('no checkpoint to resume from'); the warm start's end is a checkpoint, and the resume after the fix goes on
    from it without warming up again (lead's newcomer review)."""
    (tmp_path / "grader_that_breaks_after_the_warm_start.py").write_text(
        "import math, pathlib\n"
        "BROKEN = pathlib.Path(__file__).with_name('broken')\n"
        "CALLS = [0]\n"
        "def grade(task, completion):\n"
        "    CALLS[0] += 1\n"
        "    if BROKEN.exists() and CALLS[0] > 40:\n"
        "        return math.nan\n"
        "    return float(completion == task.answer)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "grader_that_breaks_after_the_warm_start", raising=False)  # none cached
    (tmp_path / "broken").write_text("")
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"{i:03d}?", "answer": "y"}) + "\n" for i in range(60)))
    quick = dict(taskset=str(tasks), taskset_options={"grader": "grader_that_breaks_after_the_warm_start:grade"},
                 warm_start_steps=30,
                 steps=2, rollouts_per_step=8, eval_tasks=6, eval_samples=2, progress=False, export=False)
    with pytest.raises(wai.BatchError, match="returned nan"):
        wai.train(**quick, run_dir=str(tmp_path / "r"))
    assert f"resume it with: wai train --resume {tmp_path / 'r'}" in capsys.readouterr().err
    (tmp_path / "broken").unlink()
    run = wai.train(resume=str(tmp_path / "r"), progress=False)
    assert run.summary["steps"] == 2 and run.summary["warm_start_steps_run"] == 30
    assert len((tmp_path / "r" / "warm_start.jsonl").read_text().splitlines()) == 30  # not warmed up again


def test_a_run_given_a_taskset_object_resumes_from_python_with_it(tmp_path: Path, quick):
    """A taskset passed as a Python object (an environment of one's own) cannot live in config.toml: the stop
    message names the Python call that resumes it, `wai train --resume` refuses naming that call, and the resumed
    run ends as the uninterrupted one."""
    from whileai.envs import load_taskset
    from whileai.loop.hooks.context import Interrupted

    tasks = load_taskset(UPPER)
    settings = {**quick, "force": True, "max_tokens": 6}
    half = wai.train(**{**settings, "steps": 2}, taskset=tasks, run_dir=str(tmp_path / "half"))
    said = str(Interrupted(half.dir, 2, python_taskset=True))
    assert f"Resume with: wai.train(resume={str(half.dir)!r}, taskset=<the same taskset object>)" in said
    with pytest.raises(wai.ConfigError, match=r"a Python object.*wai.train\(resume="):
        wai.train(resume=str(half.dir), steps=4, progress=False)
    with pytest.raises(wai.ConfigError, match="hands back a Taskset object"):
        wai.train(resume=str(half.dir), steps=4, progress=False, taskset="builtin:case")
    resumed = wai.train(resume=str(half.dir), steps=4, progress=False, taskset=tasks)
    whole = wai.train(**{**settings, "steps": 4}, taskset=tasks, run_dir=str(tmp_path / "whole"))
    assert [m["step"] for m in resumed.metrics()] == [1, 2, 3, 4]
    assert [m["reward"] for m in resumed.metrics()] == [m["reward"] for m in whole.metrics()]
    spec = wai.train(**{**settings, "steps": 2}, taskset=UPPER, run_dir=str(tmp_path / "spec"))
    with pytest.raises(wai.ConfigError, match="and this run's taskset is .*upper.jsonl.*leave taskset= out"):
        wai.train(resume=str(spec.dir), steps=4, progress=False, taskset=tasks)
