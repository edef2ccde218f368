"""reasoning-gym procedural tasks (`reasoning_gym:NAME`), scored by reasoning-gym's own scorer.

Real tasks with real verifiers nobody here wrote; optional extra `whileai[reasoning-gym]`. The test split
is drawn with `seed`, the train split with `seed + test_size` (reasoning-gym seeds item i with seed + i,
so the two draw different items); a train question that also appears in the test split is still left out
of train, so the two never overlap.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from whileai.envs.core import Task, Taskset
from whileai.errors import BatchError, ConfigError

OPTIONS: dict[str, Any] = {"seed": 0, "train_size": 2000, "test_size": 200, "answer_tags": True,
                           "max_tokens": None}
"""our options; any other option is passed to the dataset's own config (e.g. num_terms for chain_sum).
answer_tags: prompts are chat messages with reasoning-gym's default system prompt (think, then give the
answer in <answer>...</answer>) and the scorer sees the tagged answer; False: the question as plain text
(works with the byte tokenizer) and the scorer sees the whole stripped completion"""


def _import() -> Any:
    try:
        return importlib.import_module("reasoning_gym")
    except ImportError as exc:
        raise ConfigError("reasoning_gym:NAME needs the optional extra: pip install 'whileai[reasoning-gym]'") from exc


def _create(rg: Any, name: str, seed: int, size: int, config: Mapping[str, Any]) -> Any:
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        raise ConfigError(f"reasoning_gym:{name!r} is not a reasoning-gym dataset; use one of {sorted(DATASETS)}")
    try:
        return rg.create_dataset(name, seed=seed, size=size, **config)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(f"reasoning_gym:{name}: its config rejected {dict(config)} ({exc}); our own options "
                          f"are {sorted(OPTIONS)}, the rest go to the dataset's config") from exc


def _check(name: str, options: Mapping[str, Any]) -> None:
    bad = [f"{k}={options[k]!r} must be an integer >= {low}" for k, low in
           (("seed", 0), ("train_size", 1), ("test_size", 1))
           if isinstance(options[k], bool) or not isinstance(options[k], int) or options[k] < low]
    if not isinstance(options["answer_tags"], bool):
        bad.append(f"answer_tags={options['answer_tags']!r} must be true or false")
    top = options["max_tokens"]
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        bad.append(f"max_tokens={top!r} must be a positive integer or None")
    if bad:
        raise ConfigError(f"reasoning_gym:{name}: " + "; ".join(bad) + " (fix the options)")


def load_reasoning_gym(name: str, **given: Any) -> Taskset:
    """The reasoning-gym dataset `name` as a taskset graded by its own `score_answer`."""
    rg = _import()
    options = {**OPTIONS, **{k: v for k, v in given.items() if k in OPTIONS}}
    _check(name, options)
    config = {k: v for k, v in given.items() if k not in OPTIONS}
    test_data = _create(rg, name, options["seed"], options["test_size"], config)
    train_data = _create(rg, name, options["seed"] + options["test_size"], options["train_size"], config)
    test = [_task(entry, f"test-{i}", options["answer_tags"]) for i, entry in enumerate(test_data)]
    held = {entry["question"] for entry in test_data}
    train = [_task(entry, f"train-{i}", options["answer_tags"]) for i, entry in enumerate(train_data)
             if entry["question"] not in held]
    if not train:
        raise BatchError(f"reasoning_gym:{name}: every train question is also a test question; the task has "
                         f"too few distinct questions for test_size={options['test_size']}: lower it")
    return Taskset(f"reasoning_gym:{name}", train, test, _scorer(train_data, options["answer_tags"]),
                   options["max_tokens"])


def _task(entry: Mapping[str, Any], task_id: str, answer_tags: bool) -> Task:
    prompt: Any = entry["question"]
    if answer_tags:
        from reasoning_gym.utils import SYSTEM_PROMPTS

        prompt = [{"role": "system", "content": SYSTEM_PROMPTS["default"]}, {"role": "user", "content": prompt}]
    return Task(task_id, prompt, entry["answer"], {"entry": entry})


def _scorer(dataset: Any, answer_tags: bool) -> Any:
    """reasoning-gym's `score_answer` on the tagged answer (or the stripped completion)."""
    from reasoning_gym.utils import extract_answer

    def grade(task: Task, completion: str) -> float:
        answer = extract_answer(completion) if answer_tags else completion.strip()
        return float(dataset.score_answer(answer=answer, entry=task.info["entry"]))

    return grade
