"""The taskset contract: a `Task`, a `Taskset` (fixed train / test splits and a grader), `render_prompt`.

A taskset never trains: it hands the loop prompts, a generation cap, and a grader that turns a decoded
completion (special tokens removed) into a finite reward, where a pass is reward >= 1.0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from whileai.errors import BatchError, ConfigError
from whileai.prompts import prompt_ids

SPLITS = ("train", "test")

Prompt = str | list[dict[str, str]]
Grader = Callable[["Task", str], float]


class GraderError(BatchError):
    """A grader raised, or returned something that is not a finite number, for one task."""


@dataclass(frozen=True)
class Task:
    """One prompt and what its grader compares a completion against."""

    task_id: str
    """unique within the taskset, stable across runs"""
    prompt: Prompt
    """plain text, or chat messages [{"role": ..., "content": ...}]"""
    answer: Any = None
    """what the grader compares against (for the built-ins: a completion that earns reward 1.0)"""
    info: Mapping[str, Any] = field(default_factory=dict)
    """anything else the grader needs (the built-ins keep their options here)"""

    def __hash__(self) -> int:  # prompts may be lists and info a dict: hash what identifies the task
        return hash((self.task_id, _key(self.prompt)))


@dataclass(frozen=True)
class Recommended:
    """Training settings measured for a built-in (random-init) model on one taskset. `wai train` on a built-in
    model reads each one for a setting the config leaves empty (None); a value the user gives always wins, and
    a field left None here falls to the loop's own rule (whileai.loop.plan.config)."""

    warm_start_steps: int = 0
    """supervised steps on the reference answers before RL (0: none)"""
    warm_start_learning_rate: float | None = None
    """the warm start's learning rate"""
    learning_rate: float | None = None
    """the RL policy learning rate"""
    steps: int | None = None
    """RL optimizer steps"""

    def __post_init__(self) -> None:
        bad = [f"{k}={getattr(self, k)!r} must be an integer >= {low}" for k, low in (("warm_start_steps", 0), ("steps", 1))
               if getattr(self, k) is not None and (isinstance(getattr(self, k), bool)
                                                    or not isinstance(getattr(self, k), int) or getattr(self, k) < low)]
        bad += [f"{k}={getattr(self, k)!r} must be a finite number > 0" for k in ("warm_start_learning_rate", "learning_rate")
                if getattr(self, k) is not None and not (isinstance(getattr(self, k), Real)
                                                         and math.isfinite(getattr(self, k)) and getattr(self, k) > 0)]
        if bad:
            raise ConfigError("Recommended: " + "; ".join(bad) + " (or None: the loop's rule)")


class Taskset:
    """Fixed, disjoint train and test splits plus one grader. Built by `load_taskset`, or directly."""

    recommended: Recommended | None = None
    """training settings measured for a built-in model on this taskset (None: the loop's rules alone)"""

    def __init__(self, name: str, train: Sequence[Task], test: Sequence[Task], grader: Grader,
                 max_tokens: int | None = None, recommended: Recommended | None = None) -> None:
        self.name = name
        """the spec it was loaded from, e.g. "builtin:case" """
        self.max_tokens = max_tokens
        """a sensible generation cap for this taskset (None: the method's)"""
        if recommended is not None and not isinstance(recommended, Recommended):
            raise ConfigError(f"taskset {name!r}: recommended={recommended!r} must be a whileai.envs.Recommended "
                              "or None")
        self.recommended = recommended
        self._grader = grader
        self._splits = {"train": tuple(train), "test": tuple(test)}
        _check_splits(name, self._splits)

    def split(self, which: str) -> list[Task]:
        """The tasks of split `which` ("train" or "test"), in a fixed order."""
        if which not in self._splits:
            raise ConfigError(f"taskset {self.name!r}: split {which!r} is not known; use one of {list(SPLITS)}")
        return list(self._splits[which])

    def grade(self, task: Task, completion: str) -> float:
        """The grader's reward for `completion` on `task`; a GraderError (naming the task) when it raises
        or returns anything but a finite number."""
        try:
            reward = self._grader(task, completion)
        except Exception as exc:
            raise GraderError(f"taskset {self.name!r}: the grader raised {type(exc).__name__}: {exc} on "
                              f"task_id={task.task_id!r} (completion {completion[:80]!r}); fix the grader "
                              f"so it returns a number for every completion") from exc
        if isinstance(reward, bool) or not isinstance(reward, Real) or not math.isfinite(float(reward)):
            raise GraderError(f"taskset {self.name!r}: the grader returned {reward!r} on task_id="
                              f"{task.task_id!r} (completion {completion[:80]!r}); a reward must be a "
                              f"finite number (a pass is >= 1.0): fix the grader")
        return float(reward)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self._splits.items())
        return f"Taskset({self.name!r}, {sizes}, max_tokens={self.max_tokens})"


def _check_splits(name: str, splits: Mapping[str, Sequence[Task]]) -> None:
    """Task ids unique; no task id and no prompt in both splits."""
    for which, tasks in splits.items():
        ids = [t.task_id for t in tasks]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
            raise BatchError(f"taskset {name!r}: task_id values {dup} repeat in split {which!r}; "
                             f"task ids must be unique (fix the data or drop the task_id field)")
    train, test = splits["train"], splits["test"]
    shared_ids = {t.task_id for t in train} & {t.task_id for t in test}
    shared_prompts = {_key(t.prompt) for t in train} & {_key(t.prompt) for t in test}
    if shared_ids or shared_prompts:
        what = sorted(shared_ids)[:5] if shared_ids else sorted(shared_prompts)[:3]
        raise BatchError(f"taskset {name!r}: the train and test splits overlap ({len(shared_ids)} task ids, "
                         f"{len(shared_prompts)} prompts, e.g. {what}); a held-out split must never be "
                         f"trained on: fix the split field or remove the duplicates")


def _key(prompt: Prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\x00".join(f"{m.get('role')}\x01{m.get('content')}" for m in prompt)


def render_prompt(tokenizer: Any, task: Task) -> list[int]:
    """Token ids of `task.prompt` by the one tokenization rule (``whileai.prompts.prompt_ids``): through the
    tokenizer's chat template when it has one (with the generation prompt added); otherwise the text as the
    tokenizer itself encodes it (BOS where the tokenizer adds one; the built-in byte tokenizer does).

    Chat messages on a tokenizer without a template raise a ConfigError.
    """
    return prompt_ids(tokenizer, task.prompt, f"task_id={task.task_id!r}")
