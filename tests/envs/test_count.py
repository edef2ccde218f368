"""builtin:count: a scratchpad (the a's written out), then '=' and the count; replies end with EOS."""

from __future__ import annotations

import pytest

import whileai as wai
from whileai.envs import load_taskset
from whileai.envs.episode import reference_episode
from whileai.envs.scratch import count_prompt, count_space


def test_prompts_and_replies_by_hand():
    """Default options: lengths 1-5 of a, b, c: 3 + 9 + 27 + 81 + 243 = 363 prompts, shorter strings first."""
    o = {"min_len": 1, "max_len": 5, "letters": 3}
    assert count_space(o) == 363
    assert count_prompt(0, o) == ("a?", "a=1") and count_prompt(2, o) == ("c?", "=0")
    assert count_prompt(3, o) == ("aa?", "aa=2")  # the first of length 2
    assert count_prompt(3 + 9 + 27 + 81 + 242, o) == ("ccccc?", "=0")  # the last of length 5


def test_reward_is_share_of_characters_right():
    tasks = load_taskset("builtin:count")
    task = next(t for t in tasks.split("test") if t.answer == "aa=2")
    assert tasks.grade(task, "aa=2") == 1.0
    assert tasks.grade(task, "aa=3") == 0.75
    assert tasks.grade(task, "aaa=3") == pytest.approx(2 / 5)  # over the longer of answer and reply
    assert tasks.grade(task, "aa=2aa") == pytest.approx(4 / 6)  # not stopping costs credit


def test_split_replies_vary_threefold_and_every_reference_ends_with_eos():
    tasks = load_taskset("builtin:count")
    train, test = tasks.split("train"), tasks.split("test")
    assert (len(train), len(test)) == (299, 64)  # 363 prompts, test_size 64
    assert not {t.prompt for t in train} & {t.prompt for t in test}
    assert all(t.answer == "a" * t.prompt.count("a") + "=" + str(t.prompt.count("a")) for t in train + test)
    lengths = [len(t.answer) for t in train + test]
    assert min(lengths) == 2 and max(lengths) == 7 and max(lengths) >= 3 * min(lengths)
    assert tasks.max_tokens == 8  # the longest reply and its EOS
    tokenizer = wai.TrainingEngine("builtin:tiny").tokenizer
    for task in test:
        tokens, mask = reference_episode(tasks, task, tokenizer)
        assert tokens[-1] == tokenizer.eos_token_id and len(tokens) == len(task.answer) + 1 and all(mask)


def test_recommended_warm_start_and_option_limits():
    tasks = load_taskset("builtin:count")
    assert (tasks.recommended.warm_start_steps, tasks.recommended.learning_rate) == (60, 1e-3)
    assert len(load_taskset("builtin:count", max_len=9, test_size=256).split("test")) == 256
    with pytest.raises(wai.ConfigError, match="max_len=10 must be <= 9"):
        load_taskset("builtin:count", max_len=10)
