"""`wai train --threads`: the rule (hand-worked), its plan row with the source, and the run really using it."""

from __future__ import annotations

import pytest

import whileai as wai
from whileai.cli import main
from whileai.envs import Task, Taskset
from whileai.loop.plan import rules


@pytest.mark.parametrize(("omp", "cores", "load", "value", "words"), [
    ("3", 2, 5.0, 3, "$OMP_NUM_THREADS"),           # the environment's setting wins, whatever the load
    (None, 2, 0.2, 2, "2 cores for this process less a load average of 0.20"),  # an idle 2-core machine: both
    (None, 2, 1.3, 1, "less a load average of 1.30"),  # one core busy elsewhere: 2 - 1.3 = 0.7 -> 1
    (None, 2, 9.0, 1, "within 1..8"),                # far oversubscribed: still 1
    (None, 64, 0.0, 8, "64 cores"),                  # a big idle machine: at most 8
    ("0", 4, 0.0, 4, "4 cores"),                     # OMP_NUM_THREADS=0 or junk is not a thread count
    ("many", 4, 1.0, 3, "4 cores"),
])
def test_the_thread_rule_by_hand(omp, cores, load, value, words):
    got, source = rules.threads(omp=omp, cores=cores, load=load)
    assert got == value and words in source


def test_the_plan_prints_the_threads_and_their_source(monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert main(["train", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "threads 1 [rule]" in out and "threads: 1: $OMP_NUM_THREADS" in out
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr("os.getloadavg", lambda: (0.9, 0.0, 0.0))
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert main(["train", "--dry-run"]) == 0
    assert "threads: 3: 4 cores for this process less a load average of 0.90" in capsys.readouterr().out
    assert main(["train", "--dry-run", "--threads", "2"]) == 0
    assert "threads 2 [user]" in capsys.readouterr().out
    with pytest.raises(wai.ConfigError, match="threads = 0 must be >= 1"):
        wai.loop.dry_run(threads=0)


def test_the_run_trains_with_the_plans_threads_and_sets_torch_back(tmp_path):
    """The grader runs inside the run: it sees torch at the plan's thread count; after the run, torch's own."""
    import torch

    seen: list[int] = []

    def grade(task, completion):
        seen.append(torch.get_num_threads())
        return float(completion == task.answer)

    tasks = [Task(str(i), f"{i:02d}?", "a") for i in range(40)]
    taskset = Taskset("mine", tasks[8:], tasks[:8], grade, max_tokens=2)
    before = torch.get_num_threads()
    wanted = 2 if before != 2 else 3
    wai.loop.dry_run(taskset=taskset)  # the grader probe before the run (outside it): counted, then left out
    probed = len(seen)
    seen.clear()
    run = wai.train(taskset=taskset, threads=wanted, steps=1, rollouts_per_step=8, warm_start_steps=0,
                    eval_tasks=0, progress=False, export=False, force=True, run_dir=str(tmp_path / "r"))
    assert len(seen) > probed and set(seen[probed:]) == {wanted} and run.summary["plan"]["values"]["threads"] == wanted
    assert torch.get_num_threads() == before
