"""The loop's shared types, at the bottom of ``whileai.loop`` (every room imports these; these import no room).

    LoopState   what a checkpoint holds besides the trainer
    Loop        what a hook sees of the running loop
    Hook        the base of every hook: four no-op methods, a hook overrides the ones it needs
    Batches     where each step's rows come from (a source: ``whileai.loop.sources``)
    Source      a source's batches and the hooks it brings
    LagQueue    the batches in flight between sampler and trainer
    prompts()   the tokens of each task's prompt
    Scoring, Adam, Tokenizer, LogprobsFor   the types of the trainer's operations (whileai.trainers.base)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from whileai.envs import render_prompt
from whileai.errors import ConfigError
from whileai.trainers.base import Adam as Adam  # the trainer's types, where the loop's rooms read them
from whileai.trainers.base import LogprobsFor as LogprobsFor
from whileai.trainers.base import Scoring as Scoring
from whileai.trainers.base import Tokenizer as Tokenizer

if TYPE_CHECKING:  # the plan is resolved above the loop's types; a Loop only carries it
    from whileai.engine.training import TrainingEngine
    from whileai.envs.core import Task
    from whileai.loop.hooks.teacher import RunTeacher
    from whileai.loop.plan.run_plan import RunPlan
    from whileai.loop.step import StepResult
    from whileai.methods.base import Method
    from whileai.trainers import Trainer

PASS = 1.0  # a pass is reward >= 1.0 (the taskset contract)


@dataclass
class LoopState:
    """What a checkpoint holds besides the trainer: step, the method's state, the rows in flight, evals."""

    step: int = 0
    method_state: dict[str, Any] | None = None
    queue: list[list[dict[str, Any]]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    warm_start_done: bool = False
    warm_start_steps_done: int = 0
    engine_step: int = 0
    preflight: dict[str, Any] | None = None
    """the preflight's report on the first rollouts (whileai.loop.hooks.preflight), once measured"""
    source: dict[str, Any] | None = None
    """what the batches source resumes from (a recorder's cursor: whileai.loop.sources.recorder)"""


class LagQueue:
    """Batches in flight: the batch trained at step t was sampled ``lag`` steps earlier with that step's weights.

    Holding the rows (not weight snapshots) keeps one set of weights in memory whatever the lag: this is
    how an asynchronous system is stale, a queue of ``lag`` batches between sampler and trainer.
    """

    def __init__(self, lag: int, batches: Sequence[list[dict[str, Any]]] = ()) -> None:
        self.lag = lag
        self.batches: deque[list[dict[str, Any]]] = deque(batches)

    def push(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """Add a fresh batch; return the one to train on now (None while the queue fills)."""
        self.batches.append(rows)
        return self.batches.popleft() if len(self.batches) > self.lag else None

    def state(self) -> list[list[dict[str, Any]]]:
        return [list(b) for b in self.batches]


class Batches(Protocol):
    """Where each step's rows come from."""

    def next(self, step: int, queue: LagQueue) -> list[dict[str, Any]]: ...

    def rescore(self, batch: Sequence[dict[str, Any]], step: int) -> bool: ...


@dataclass
class Loop:
    """What the hooks see of a running loop."""

    trainer: Trainer
    method: Method
    plan: RunPlan
    state: LoopState
    teacher: RunTeacher | None = None
    batch: list[dict[str, Any]] = field(default_factory=list)


class Hook:
    """What runs around the steps. ``before`` once before the first step, ``before_update`` with the step's
    batch in ``loop.batch``, ``after_step`` after each step, ``failed`` when a step raised (the hook may stop the
    run its own way; the error is raised again after every hook's ``failed``). Each does nothing here."""

    def before(self, loop: Loop) -> None:
        return None

    def before_update(self, loop: Loop) -> None:
        return None

    def after_step(self, loop: Loop, record: dict[str, Any], result: StepResult) -> None:
        return None

    def failed(self, loop: Loop, error: BaseException) -> None:
        return None


@dataclass
class Source:
    """A source of rows: its batches, its hooks (``feed`` run before the preflight, ``pushing`` after the metrics
    are written and before the checkpoint) and what closes it when the run ends."""

    batches: Batches
    feed: list[Hook] = field(default_factory=list)
    pushing: list[Hook] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)


def engine_of(trainer: Trainer, needs: str) -> TrainingEngine:
    """``trainer`` as the in-process engine, for what reads its weights (``needs``: which part, for the error):
    weight sync to an inference server, an EMA teacher."""
    from whileai.engine.training import TrainingEngine

    if not isinstance(trainer, TrainingEngine):
        raise ConfigError(f"{needs} reads the weights of the trainer in this process, and the trainer is a "
                          f"{type(trainer).__name__} (--url): train in-process (drop --url) for it")
    return trainer


def prompts(tokenizer: Tokenizer, tasks: Sequence[Task]) -> list[list[int]]:
    """The tokens of each task's prompt (one rendering, ``whileai.envs.render_prompt``, everywhere)."""
    return [render_prompt(tokenizer, t) for t in tasks]
