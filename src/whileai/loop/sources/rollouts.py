"""Rollouts: play episodes for tasks (one completion each for a plain taskset), grade them, hand back rows;
``Rollouts``, the in-process source (each step's batch sampled with the trainer, ``lag`` steps ahead).

A row here is the library's row (``reward``, ``behavior_logprobs``, ``tokens``, ``task_id``, ``truncated``, and
``action_mask`` when an environment wrote tokens) plus the loop's bookkeeping (``prompt_tokens``,
``completion``, ``sampler_step``). Sampling and grading read the method's run spec only: rollouts per
prompt, temperature, max tokens, and an adaptive plan if it has one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from whileai.envs.episode import is_episodic, play
from whileai.errors import BatchError, WhileaiError
from whileai.loop.types import LagQueue, Tokenizer, prompts

if TYPE_CHECKING:
    from whileai.envs.core import Task, Taskset
    from whileai.loop.sources.sampler import Sampler
    from whileai.methods.run_spec import RunSpec

if TYPE_CHECKING:  # the plan is resolved above the sources; they read it
    from whileai.engine.sampling import SamplingParams
    from whileai.loop.plan.run_plan import RunPlan
    from whileai.methods.base import Method
    from whileai.trainers import Trainer


def completion_text(tokenizer: Tokenizer, tokens: Sequence[int]) -> str:
    """The decoded completion with special tokens (EOS) removed, as graders receive it."""
    return tokenizer.decode(list(tokens), skip_special_tokens=True)


def rollouts(engine: Sampler, taskset: Taskset, tasks: Sequence[Task], prompts: Sequence[list[int]],
             rollouts_per_prompt: Sequence[int], sampling: SamplingParams, seed: int, sampler_step: int, *,
             cap_is_answer_length: bool) -> list[dict[str, Any]]:
    """``rollouts_per_prompt[i]`` graded episodes of ``tasks[i]``, sampled with the engine's current weights under
    ``sampling`` (the run's: ``RunPlan.sampling()``; each turn gets its own cap, stops and seed).
    ``cap_is_answer_length``: the taskset sets the cap, so a reply that reaches it is complete, not truncated.

    A plain taskset's episode is one completion; an ``EnvTaskset``'s alternates model turns and environment
    replies (``whileai.envs.episode``), every turn one batched ``engine.sample`` call for all live episodes."""
    def sampler(contexts: list[list[int]], n: int, max_tokens: int, stop: list[str], seed: int) -> list[Any]:
        turn = dataclasses.replace(sampling, max_tokens=max_tokens or sampling.max_tokens, stop=list(stop), seed=seed)
        return engine.sample(contexts, n, turn)

    rows = play(sampler, engine.tokenizer, taskset, tasks, prompts, rollouts_per_prompt, max_tokens=sampling.max_tokens,
                seed=seed, context=getattr(engine, "max_context", None),
                cap_ends_turn=cap_is_answer_length and not is_episodic(taskset))
    for row in rows:
        row["sampler_step"] = sampler_step
    return rows


def sample_batch(engine: Sampler, taskset: Taskset, tasks: Sequence[Task], prompts: Sequence[list[int]], spec: RunSpec,
                 run_plan: RunPlan, seed: int, sampler_step: int) -> list[dict[str, Any]]:
    """One step's rows: ``rollouts_per_prompt`` per task, then more rounds while the method's plan asks; sampled
    as ``run_plan`` says."""
    sampling, cap_is_answer_length = run_plan.sampling(), run_plan.cap_is_answer_length
    rows = rollouts(engine, taskset, tasks, prompts, [spec.rollouts_per_prompt] * len(tasks), sampling, seed,
                    sampler_step, cap_is_answer_length=cap_is_answer_length)
    if spec.plan is None:
        return rows
    index = {t.task_id: i for i, t in enumerate(tasks)}
    for round_number in range(1, 1000):
        plan = spec.plan(rows, list(index))
        if not plan.resample:
            break
        more = [0] * len(tasks)
        for task_id, n in plan.resample.items():
            more[index[task_id]] = int(n)
        rows += rollouts(engine, taskset, tasks, prompts, more, sampling, seed + 7919 * round_number,
                         sampler_step, cap_is_answer_length=cap_is_answer_length)
    return rows


def step_tasks(train: Sequence[Task], n: int, seed: int, step: int) -> list[Task]:
    """The ``n`` training tasks of a step: a fixed function of (seed, step), so a resumed run draws the same."""
    if n > len(train):
        raise BatchError(f"a step needs {n} distinct training tasks but the taskset's train split has "
                         f"{len(train)}; lower rollouts_per_step or use a larger taskset")
    rng = np.random.default_rng([seed, step])
    return [train[i] for i in rng.choice(len(train), size=n, replace=False)]


@dataclass
class Rollouts:
    """Each step's batch sampled from the taskset with the current weights and graded; the queue holds
    ``plan.lag`` batches, so the batch trained at step t was sampled with the weights of step t - lag."""

    trainer: Trainer
    taskset: Taskset
    method: Method
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
                            self.plan, self.plan.seed * 1_000_003 + draw * 101, sampler_step)

    def rescore(self, batch: Sequence[dict[str, Any]], step: int) -> bool:
        """Skip the scoring forward when the sampler's log-probabilities are the policy's: sampled by the
        current weights (lag 0, in this step) at the temperature the trainer scores with."""
        return any(r.get("sampler_step") != step for r in batch)
