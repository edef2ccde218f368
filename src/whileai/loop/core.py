"""The loop `wai train` runs, in one function: sample -> grade -> method.update -> forward_backward ->
optim_step, with the sampler ``lag`` steps behind, then the hooks (evaluation, traces, metrics, progress,
checkpoints).

    run_loop(trainer, method, plan, batches, state, hooks, teacher)

``trainer`` is anything with the ``whileai.loop.trainers.backends.Trainer`` operations (the in-process engine, the
service's ``RunClient``); ``plan`` is the run's resolved ``RunPlan``; ``batches`` hands out the batch of
each step (``Rollouts``: sampled from the taskset and graded; ``Pushed``: rows read from a file). The loop
reads the method only through ``run_spec()`` and ``update()`` and never branches on its name. A hook is any
object with some of ``before(loop)``, ``before_update(loop)`` (the step's batch is in ``loop.batch``),
``after_step(loop, record, result)`` and ``failed(loop, error)`` (a step raised; the hook may stop the run its own
way). Where rollouts come from is the ``Batches``: ``Rollouts`` samples in process with the trainer; the
server sampler's (``whileai.loop.sources.sampler.AheadRollouts``) samples ahead from an inference server.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from whileai.envs import render_prompt
from whileai.errors import WhileaiError
from whileai.loop.plan.run_plan import RunPlan
from whileai.loop.sources.rollouts import LagQueue, sample_batch, step_tasks
from whileai.loop.step import train_step


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


class Batches(Protocol):
    """Where each step's rows come from."""

    def next(self, step: int, queue: LagQueue) -> list[dict[str, Any]]: ...

    def rescore(self, batch: Sequence[dict[str, Any]], step: int) -> bool: ...


@dataclass
class Loop:
    """What the hooks see of a running loop."""

    trainer: Any
    method: Any
    plan: RunPlan
    state: LoopState
    teacher: Any = None
    batch: list[dict[str, Any]] = field(default_factory=list)


def prompts(tokenizer: Any, tasks: Sequence[Any]) -> list[list[int]]:
    """The tokens of each task's prompt (one rendering, ``whileai.envs.render_prompt``, everywhere)."""
    return [render_prompt(tokenizer, t) for t in tasks]


@dataclass
class Rollouts:
    """Each step's batch sampled from the taskset with the current weights and graded; the queue holds
    ``plan.lag`` batches, so the batch trained at step t was sampled with the weights of step t - lag."""

    trainer: Any
    taskset: Any
    method: Any
    plan: RunPlan

    def next(self, step: int, queue: LagQueue) -> list[dict[str, Any]]:
        while len(queue.batches) < self.plan.lag:  # fill the pipeline with the starting weights
            queue.push(self.sample(len(queue.batches), step))
        batch = queue.push(self.sample(step + self.plan.lag, step))
        if batch is None:  # cannot happen: the queue holds lag batches, so a push returns the oldest
            raise WhileaiError(f"the lag queue returned no batch at step {step}")
        return batch

    def sample(self, draw: int, sampler_step: int) -> list[dict[str, Any]]:
        """The ``draw``-th batch of the run, sampled now with the current weights."""
        spec = self.method.run_spec()
        tasks = step_tasks(self.taskset.split("train"), self.plan.rollouts_per_step // self.plan.rollouts_per_prompt,
                           self.plan.seed, draw)
        return sample_batch(self.trainer, self.taskset, tasks, prompts(self.trainer.tokenizer, tasks), spec,
                            self.plan.sampling(), self.plan.seed * 1_000_003 + draw * 101, sampler_step)

    def rescore(self, batch: Sequence[dict[str, Any]], step: int) -> bool:
        """Skip the scoring forward when the sampler's log-probabilities are the policy's: sampled by the
        current weights (lag 0, in this step) at the temperature the trainer scores with."""
        return any(r.get("sampler_step") != step for r in batch)


@dataclass
class Pushed:
    """Each step's rows read from a file (``whileai.loop.sources.traces.RowsFile``), whole groups together where the
    method takes them, in a seeded order; always scored (the file's log-probabilities are not the policy's)."""

    rows: Any
    grouped: bool
    plan: RunPlan
    lines: list[int] = field(default_factory=list)

    def next(self, step: int, queue: LagQueue) -> list[dict[str, Any]]:
        batch, self.lines = self.rows.batch(step, self.plan.rollouts_per_step, self.plan.seed, self.grouped)
        return batch

    def rescore(self, batch: Sequence[dict[str, Any]], step: int) -> bool:
        return True


def run_loop(trainer: Any, method: Any, plan: RunPlan, batches: Batches, state: LoopState,
             hooks: Sequence[Any], teacher: Any = None) -> None:
    """Train from ``state.step`` to ``plan.steps``. Every hook's ``before`` runs first and ``after_step`` after
    each step, in order (the last, the checkpoint, may stop the run)."""
    loop = Loop(trainer, method, plan, state, teacher)
    for hook in hooks:  # warm start, held-out before, the teacher (it may set loop.teacher), traces
        if hasattr(hook, "before"):
            hook.before(loop)
    spec = method.run_spec()
    warmup = spec.critic.warmup if spec.critic is not None else 0  # critic-only steps before the policy moves
    queue = LagQueue(plan.lag, state.queue)
    scoring = plan.sampling().scoring()
    started = time.perf_counter()
    while state.step < plan.steps:
        try:
            _step(loop, batches, hooks, queue, scoring, warmup, started)
        except Exception as error:
            for hook in hooks:  # the server sampler's stops a run whose server died with a checkpoint
                if hasattr(hook, "failed"):
                    hook.failed(loop, error)
            raise


def _step(loop: Loop, batches: Batches, hooks: Sequence[Any], queue: LagQueue, scoring: Any, warmup: int,
          started: float) -> None:
    """One step of ``run_loop``: the batch, the update and optimizer step, the record, the hooks."""
    trainer, method, plan, state, teacher = loop.trainer, loop.method, loop.plan, loop.state, loop.teacher
    t = state.step
    began = time.perf_counter()
    adam = {"learning_rate": plan.learning_rate_at(t)}
    loop.batch = batches.next(t, queue)  # sample with the weights of step t - lag, and grade
    for hook in hooks:  # the preflight reads the first batch before its update (and may stop the run)
        if hasattr(hook, "before_update"):
            hook.before_update(loop)
    trained = time.perf_counter()
    result = train_step(trainer, method, loop.batch, adam=adam, state=state.method_state,
                        sampling_params=scoring, rescore=batches.rescore(loop.batch, t),
                        train_policy=t >= warmup, single_pass_tokens=plan.micro_batch_tokens, teacher=teacher)
    if teacher is not None:  # an EMA teacher follows the weights after every optimizer step
        teacher.after_step(trainer)
    state.method_state, state.step, state.queue = result.state, t + 1, queue.state()
    record = {"step": t + 1, **result.metrics, "lag": plan.lag, "policy_trained": t >= warmup,
              "sampled_at_step": int(loop.batch[0].get("sampler_step", t)) if loop.batch else t,
              "learning_rate": adam["learning_rate"], "time/sample_s": trained - began,
              "time/train_s": time.perf_counter() - trained, "time/step_s": time.perf_counter() - began,
              "time/elapsed_s": time.perf_counter() - started, **staleness(loop.batch, t)}
    for hook in hooks:
        if hasattr(hook, "after_step"):
            hook.after_step(loop, record, result)


def staleness(batch: Sequence[dict[str, Any]], step: int) -> dict[str, float]:
    """The version gaps of a step's rows: trained at ``step``, sampled with the weights of ``sampler_step``."""
    gaps = [step - int(r["sampler_step"]) for r in batch if "sampler_step" in r]
    if not gaps:
        return {}
    return {"staleness/mean": sum(gaps) / len(gaps), "staleness/max": float(max(gaps))}
