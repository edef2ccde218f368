"""Everything checkable is checked before the warm start (whileai.loop.plan.inputs and the config's ranges): each
case is a run that used to start (and crash mid-run, hang, or learn nothing) and is now refused or noted by
`dry_run`, before any model loads."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

import whileai as wai
from whileai.envs import GraderError, Task, Taskset, episode
from whileai.loop import dry_run


def _tasks(grader, n: int = 40) -> Taskset:
    tasks = [Task(f"t{i}", f"{i:02d}?", "a") for i in range(n)]
    return Taskset("mine", tasks[8:], tasks[:8], grader, max_tokens=2)


def test_a_grader_that_hangs_is_named_with_its_task_within_the_time_limit(monkeypatch):
    def grade(task, completion):
        if task.task_id == "t9":
            time.sleep(30)
        return float(completion == task.answer)

    monkeypatch.setattr(episode, "GRADE_TIMEOUT_S", 0.3)
    started = time.perf_counter()
    with pytest.raises(wai.ConfigError, match="the grader did not return within 0.3 s on task_id='t9'"):
        dry_run(taskset=_tasks(grade))
    assert time.perf_counter() - started < 5


def test_a_grader_that_hangs_later_in_the_run_stops_it_within_the_time_limit_naming_the_task(monkeypatch, tmp_path):
    """The probe passes (the first tasks grade at once); a training task's grade hangs mid-run: the run stops
    with the task named, within the limit."""
    def grade(task, completion):
        if task.task_id == "t30":
            time.sleep(30)
        return float(completion == task.answer)

    monkeypatch.setattr(episode, "GRADE_TIMEOUT_S", 0.3)
    started = time.perf_counter()
    with pytest.raises(GraderError, match="the grader did not return within 0.3 s on task_id='t30'"):
        wai.train(taskset=_tasks(grade), steps=3, rollouts_per_step=32, warm_start_steps=0, eval_tasks=0,
                  force=True, export=False, progress=False, run_dir=str(tmp_path / "r"))
    assert time.perf_counter() - started < 20


@pytest.mark.parametrize(("value", "shown"), [("yes", "'yes'"), (math.nan, "nan"), (True, "True"), (None, "None")])
def test_a_grader_that_returns_no_number_is_refused_before_the_warm_start(value, shown):
    with pytest.raises(wai.ConfigError, match=f"probed before the warm start.*returned {shown} on task_id='t8'"):
        dry_run(taskset=_tasks(lambda task, completion: value))


def test_a_grader_on_a_0_to_10_scale_gets_a_note_and_answers_that_fail_their_grader_too():
    plan = dry_run(taskset=_tasks(lambda task, completion: 10.0 * (completion == task.answer)))
    assert any("returned 10 on task_id='t8'" in n and "0-10 scale" in n for n in plan.notes)
    assert "notes:" in plan.table()
    plan = dry_run(taskset=_tasks(lambda task, completion: 0.5 * (completion == task.answer)))
    assert any("10 of the 10 reference answers probed do not pass" in n for n in plan.notes)
    assert dry_run(taskset=_tasks(lambda task, completion: float(completion == task.answer))).notes == ()


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_prompt_longer_than_the_context_is_named_by_task_id_before_anything_loads(tmp_path: Path):
    rows = [{"prompt": f"{i:03d}?", "answer": "y"} for i in range(40)]
    rows[6]["prompt"] = "x" * 300  # builtin:tiny's context is 256 byte tokens
    with pytest.raises(wai.ConfigError, match=r"1 prompt fill the model's context of 256 tokens.*task_id '7' \(301 "
                                              r"tokens\).*line number"):
        dry_run(taskset=_jsonl(tmp_path / "t.jsonl", rows))


def test_a_cap_at_the_context_is_refused_when_given_and_a_prompt_near_it_noted(tmp_path: Path):
    rows = [{"prompt": f"{i:03d}?", "answer": "y"} for i in range(40)]
    path = _jsonl(tmp_path / "t.jsonl", rows)
    with pytest.raises(wai.ConfigError, match="max_tokens = 100000 is not below the model's context of 256"):
        dry_run(taskset=path, max_tokens=100_000)
    rows[3]["prompt"] = "x" * 250
    plan = dry_run(taskset=_jsonl(tmp_path / "u.jsonl", rows), max_tokens=10)
    assert any("task_id '4', 251 tokens" in n and "cut at the context" in n for n in plan.notes)


def test_duplicate_prompts_with_different_answers_are_noted(tmp_path: Path):
    rows = [{"prompt": f"{i:03d}?", "answer": "y"} for i in range(40)]
    rows[10] = {"prompt": "005?", "answer": "n"}
    plan = dry_run(taskset=_jsonl(tmp_path / "t.jsonl", rows))
    assert any(n.startswith('1 prompt is given on 2 tasks with different answers ("005?": task_id \'6\' answer "y", '
                            'task_id \'11\' answer "n")') for n in plan.notes), plan.notes
    rows[20], rows[30] = {"prompt": "007?", "answer": "n"}, {"prompt": "007?", "answer": "m"}  # 3 tasks, 1 prompt
    notes = dry_run(taskset=_jsonl(tmp_path / "w.jsonl", rows)).notes
    assert any(n.startswith("2 prompts are each given on more than one task with different answers (5 tasks in all: "
                            '"005?": task_id \'6\' answer "y", task_id \'11\' answer "n"; "007?": task_id \'8\'')
               for n in notes), notes
    rows[10] = {"prompt": "005?", "answer": "y"}  # the same answer twice is not a clash
    assert not any("more than once" in n for n in dry_run(taskset=_jsonl(tmp_path / "u.jsonl", rows)).notes)


@pytest.mark.parametrize(("settings", "expected"), [
    ({"learning_rate": 1e9}, "learning_rate = 1000000000.0 is above 1"),
    ({"warm_start_learning_rate": 5.0}, "warm_start_learning_rate = 5.0 is above 1"),
    ({"steps": 10**9}, "steps = 1,000,000,000 is above 10,000,000"),
])
def test_impossible_numbers_are_refused(settings, expected):
    with pytest.raises(wai.ConfigError, match=expected):
        dry_run(**settings)


def test_numbers_a_user_may_mean_are_accepted_with_a_note():
    plan = dry_run(steps=200_000, learning_rate=0.5)
    assert any(n.startswith("steps = 200,000") for n in plan.notes)
    assert any(n.startswith("learning_rate = 0.5") for n in plan.notes)


def test_a_missing_model_folder_is_named_as_a_folder_not_a_hub_id(tmp_path: Path):
    tasks = _jsonl(tmp_path / "t.jsonl", [{"prompt": f"{i:03d}?", "answer": "y"} for i in range(40)])
    with pytest.raises(wai.ConfigError, match="--model './missing-folder': model folder './missing-folder' does not "
                                              "exist") as info:
        dry_run(taskset=tasks, model="./missing-folder")
    assert "Repo id" not in str(info.value)
