"""Built-in procedural tasksets: hand-worked rewards, the recipe's grading carried over, fixed disjoint splits."""

from __future__ import annotations

import dataclasses
import importlib.util
import random
import sys
from pathlib import Path

import pytest

import whileai as wai
from whileai.envs import BUILTIN_TASKSETS, Task, load_taskset

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "rl_loop.py"


def recipe():
    """recipes/ is a folder of scripts: load rl_loop.py by path (same module name as tests/recipes uses)."""
    if "rl_loop_recipe" not in sys.modules:
        spec = importlib.util.spec_from_file_location("rl_loop_recipe", RECIPE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["rl_loop_recipe"]


def grade(name: str, prompt: str, completion: str, answer: str | None = None, **options) -> float:
    """The taskset's reward for `completion` on a task like its own with this prompt (and answer)."""
    tasks = load_taskset(f"builtin:{name}", **options)
    task = dataclasses.replace(tasks.split("test")[0], task_id=prompt, prompt=prompt, answer=answer)
    return tasks.grade(task, completion)


def test_case_reward_by_hand():
    # "abq" is lower case: of the first 4 characters of "abCd", a, b, d are lower -> 3/4
    assert grade("case", "abq", "abCd") == 0.75
    assert grade("case", "abq", "ab") == 0.5            # two characters written, two missing: 2/4
    assert grade("case", "abq", "") == 0.0
    assert grade("case", "abq", "abcdEFGH") == 1.0      # only the first 4 count
    assert grade("case", "XYZ", "XYZa") == 0.75         # upper-case prompt: "a" is a miss
    assert grade("case", "XYZ", "1 X?") == 0.25
    assert grade("case", "ab", "abcdef", prompt_len=2, completion_len=6, test_size=100) == 1.0


def test_case_equals_the_recipe_grading_on_random_token_sequences():
    """The loop grades decoded text (EOS removed); rl_loop.py graded tokens. On <= completion_len tokens
    of the byte tokenizer (any byte, possibly ending with EOS) the two rewards are identical."""
    from whileai.engine.models import byte_tokenizer

    rl, tok = recipe(), byte_tokenizer()
    tasks = load_taskset("builtin:case")
    rng = random.Random(0)
    letters = [3 + ord(c) for c in "aZqQ"]
    for task in tasks.split("test")[:100]:
        prompt_ids = [tok.bos_token_id] + tok.encode(task.prompt, add_special_tokens=False)
        n = rng.randint(0, 4)
        tokens = [rng.choice(letters) if rng.random() < 0.5 else rng.randrange(3, 259) for _ in range(n)]
        if n < 4 and rng.random() < 0.5:
            tokens.append(tok.eos_token_id)
        text = tok.decode(tokens, skip_special_tokens=True)
        assert tasks.grade(task, text) == rl.grade(prompt_ids, tokens, tok, 4), (task.prompt, tokens)


def test_copy_reverse_add_by_hand():
    assert grade("copy", "abc=", "abc", "abc") == 1.0
    assert grade("copy", "abc=", "abd", "abc") == pytest.approx(2 / 3)
    assert grade("reverse", "abc=", "cba", "cba") == 1.0
    assert grade("reverse", "abc=", "cbx", "cba") == pytest.approx(2 / 3)
    assert grade("reverse", "abc=", "abc", "cba") == pytest.approx(1 / 3)  # only the middle "b" is in place
    assert grade("add", "3+45=", "48", "48") == 1.0
    assert grade("add", "3+45=", "4", "48") == 0.5       # "4" right, "8" missing
    assert grade("add", "3+45=", "48x", "48") == pytest.approx(2 / 3)  # trailing junk costs credit
    assert grade("add", "3+45=", "84", "48") == 0.0


@pytest.mark.parametrize(("name", "solve"), [("copy", lambda p: p[:-1]), ("reverse", lambda p: p[:-1][::-1]),
                                             ("add", lambda p: str(sum(map(int, p[:-1].split("+")))))])
def test_answers_are_right(name, solve):
    tasks = load_taskset(f"builtin:{name}")
    for task in tasks.split("test") + tasks.split("train")[:500]:
        assert task.answer == solve(task.prompt), task
    assert any(len(t.answer) == 3 for t in tasks.split("test")) if name == "add" else True


def test_letters_option_narrows_the_alphabet():
    tasks = load_taskset("builtin:reverse", letters=4, prompt_len=6)   # 4**6 = 4096 prompts
    every = tasks.split("train") + tasks.split("test")
    assert (len(tasks.split("train")), len(tasks.split("test"))) == (3840, 256)
    assert set("".join(t.prompt[:-1] for t in every)) == set("abcd")
    assert all(t.answer == t.prompt[:-1][::-1] for t in every)


def test_case_prompts_are_one_case():
    tasks = load_taskset("builtin:case")
    prompts = [t.prompt for t in tasks.split("test")]
    assert all(p.isalpha() and len(p) == 3 and (p.islower() or p.isupper()) for p in prompts)
    assert 0.3 < sum(p.islower() for p in prompts) / len(prompts) < 0.7  # both cases drawn


@pytest.mark.parametrize("name", sorted(set(BUILTIN_TASKSETS) - {"count"}))  # count: tests/envs/test_count.py
def test_split_fixed_disjoint_and_answers_pass(name):
    tasks = load_taskset(f"builtin:{name}")
    train, test = tasks.split("train"), tasks.split("test")
    assert (len(train), len(test)) == (4096, 256)
    assert not {t.prompt for t in train} & {t.prompt for t in test}
    assert not {t.task_id for t in train} & {t.task_id for t in test}
    assert len({t.task_id for t in train}) == len(train)
    again = load_taskset(f"builtin:{name}")
    assert again.split("test") == test and again.split("train") == train
    assert load_taskset(f"builtin:{name}", seed=1).split("test") != test
    assert all(tasks.grade(t, t.answer) == 1.0 for t in test)  # the answer is a passing completion
    assert tasks.max_tokens == max(len(t.answer) for t in train + test)


@pytest.mark.parametrize(("name", "options"), [("case", {"prompt_len": 6, "completion_len": 6}),
                                                ("copy", {"prompt_len": 6}), ("reverse", {"prompt_len": 6}),
                                                ("add", {"digits": 2})])
def test_prompts_short_and_answers_at_most_6_bytes_at_the_largest_options(name, options):
    tasks = load_taskset(f"builtin:{name}", **options)
    every = tasks.split("train") + tasks.split("test")
    assert max(len(t.prompt.encode()) for t in every) < 16
    assert max(len(t.answer.encode()) for t in every) <= 6


def test_small_prompt_space_fills_train_with_the_rest_or_refuses():
    # prompt_len=1: 52 distinct prompts (26 lower + 26 upper)
    tasks = load_taskset("builtin:case", prompt_len=1, test_size=12)
    assert (len(tasks.split("train")), len(tasks.split("test"))) == (40, 12)
    with pytest.raises(wai.ConfigError, match="only 52 distinct prompts"):
        load_taskset("builtin:case", prompt_len=1)


def test_bad_options_all_reported():
    with pytest.raises(wai.ConfigError, match=r"unknown option\(s\) \['lenght'\].*valid options"):
        load_taskset("builtin:copy", lenght=3)
    with pytest.raises(wai.ConfigError) as err:
        load_taskset("builtin:case", prompt_len=0, completion_len=9, test_size=2.5)
    assert all(s in str(err.value) for s in ("prompt_len=0", "completion_len=9", "test_size=2.5"))
    with pytest.raises(wai.ConfigError, match=r"use one of \['add', 'case', 'copy', 'count', 'lookup', 'reverse'\]"):
        load_taskset("builtin:nope")


def test_split_name_checked():
    with pytest.raises(wai.ConfigError, match=r"split 'validation'.*\['train', 'test'\]"):
        load_taskset("builtin:case").split("validation")


def test_task_is_frozen():
    task = Task("1", "abq")
    with pytest.raises(AttributeError):
        task.prompt = "x"  # type: ignore[misc]


def test_copy_declares_its_measured_settings_and_the_others_the_short_warm_start():
    """builtin:copy learns only with a longer warm start and a 10x lower RL rate (docs/tasksets.md, 4 of 5 seeds);
    the others keep the 14-step warm start and the loop's rates; resolve reads them for a built-in model."""
    from whileai.envs import Recommended
    from whileai.loop.plan import config as config_io
    from whileai.loop.plan.run_plan import make_plan

    assert load_taskset("builtin:copy").recommended == Recommended(warm_start_steps=60, learning_rate=1e-3)
    for name in ("case", "reverse", "add"):
        assert load_taskset(f"builtin:{name}").recommended == Recommended(warm_start_steps=14)
    config = config_io.build(None, taskset="builtin:copy")
    resolved = make_plan(config, {}, None, load_taskset("builtin:copy"))
    assert (resolved.warm_start_steps, resolved.learning_rate) == (60, 1e-3)
    loaded = config_io.build(None, taskset="builtin:copy", model="some/model")
    assert make_plan(loaded, {}, None, load_taskset("builtin:copy")).warm_start_steps == 0  # not a built-in
