"""reasoning-gym tasks through load_taskset, scored by reasoning-gym's own scorer."""

from __future__ import annotations

import pytest

import whileai as wai
from whileai.envs import load_taskset

rg = pytest.importorskip("reasoning_gym")


def test_basic_arithmetic_split_and_own_scorer():
    tasks = load_taskset("reasoning_gym:basic_arithmetic", train_size=60, test_size=20, seed=3)
    train, test = tasks.split("train"), tasks.split("test")
    assert len(test) == 20 and 0 < len(train) <= 60
    assert not {t.info["entry"]["question"] for t in train} & {t.info["entry"]["question"] for t in test}
    own = rg.create_dataset("basic_arithmetic", seed=3, size=20)   # the test split is this draw
    assert [t.answer for t in test] == [own[i]["answer"] for i in range(20)]
    task = test[0]
    system, user = task.prompt
    assert system["role"] == "system" and "<answer>" in system["content"] and user["content"] == own[0]["question"]
    right, wrong = f"thinking... <answer>{task.answer}</answer>", "<answer>nope</answer>"
    assert tasks.grade(task, right) == 1.0 and tasks.grade(task, wrong) == 0.0
    assert tasks.grade(task, str(task.answer)) == 0.0   # no tags: reasoning-gym's scorer sees None
    for completion in (str(task.answer), "nope", str(task.answer) + "1"):
        assert tasks.grade(task, f"<answer>{completion}</answer>") == own.score_answer(completion, entry=own[0])


def test_plain_prompts_without_tags_and_dataset_config():
    tasks = load_taskset("reasoning_gym:chain_sum", train_size=10, test_size=5, answer_tags=False,
                         min_terms=2, max_terms=2, max_tokens=12)
    task = tasks.split("test")[0]
    assert isinstance(task.prompt, str) and task.prompt.count("+") + task.prompt.count(" - ") == 1
    assert tasks.grade(task, f" {task.answer}\n") == 1.0 and tasks.max_tokens == 12


def test_bad_names_and_options():
    with pytest.raises(wai.ConfigError, match=r"not a reasoning-gym dataset; use one of \[.*'basic_arithmetic'"):
        load_taskset("reasoning_gym:no_such_task")
    with pytest.raises(wai.ConfigError, match="its config rejected.*bogus"):
        load_taskset("reasoning_gym:basic_arithmetic", bogus=1, train_size=5, test_size=5)
    with pytest.raises(wai.ConfigError, match="test_size=0"):
        load_taskset("reasoning_gym:basic_arithmetic", test_size=0)
