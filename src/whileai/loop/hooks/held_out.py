"""Held-out evaluation: pass@1 on the taskset's test split with the library's interval, and the paired
before/after comparison from ``compare``. An episode's reward is graded like a completion's (a multi-turn
taskset's episodes are played by ``rollouts``, so pass@1 is on whole episodes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from whileai.loop.sources.rollouts import rollouts
from whileai.loop.types import PASS, Hook, Loop
from whileai.rows.stats import compare, pass_at

if TYPE_CHECKING:
    from whileai.engine.sampling import SamplingParams
    from whileai.envs.core import Task, Taskset
    from whileai.loop.sources.sampler import Sampler
    from whileai.loop.step import StepResult

if TYPE_CHECKING:  # the context evaluates with held_out, so the hook names it as a type only
    from whileai.loop.hooks.context import Context

EVAL_SEED = 1_000_003  # the same sampler seeds before and after: the two arms differ only in the weights


def held_out(engine: Sampler, taskset: Taskset, tasks: Sequence[Task], prompts: Sequence[list[int]], rollouts_per_prompt: int,
             sampling: SamplingParams, seed: int, *, cap_is_answer_length: bool) -> dict[str, Any]:
    """``rollouts_per_prompt`` episodes (completions) per held-out task at the method's temperature; pass@1 with its 95% interval."""
    rows = rollouts(engine, taskset, tasks, prompts, [rollouts_per_prompt] * len(tasks), sampling, seed + EVAL_SEED,
                    -1, cap_is_answer_length=cap_is_answer_length)
    graded = [{"task_id": r["task_id"], "reward": r["reward"], "completion": r["completion"]} for r in rows]
    result = pass_at([{"task_id": r["task_id"], "reward": r["reward"]} for r in rows], threshold=PASS)
    return {"pass_at_1": float(result.pass_at_1), "ci95": [float(x) for x in result.ci95],
            "mean_reward": float(np.mean([r["reward"] for r in rows])), "tasks": len(tasks),
            "samples": rollouts_per_prompt, "rows": graded}


def before_after(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The paired per-task difference of pass@1 (after minus before) with its 95% interval."""
    strip = [{"task_id": r["task_id"], "reward": r["reward"]} for r in before["rows"]]
    later = [{"task_id": r["task_id"], "reward": r["reward"]} for r in after["rows"]]
    result = compare(strip, later, threshold=PASS, baseline_name="before", treatment_name="after")
    low, high = (float(x) for x in result.ci95)
    return {"before": float(result.baseline), "after": float(result.treatment), "delta": float(result.delta),
            "ci95": [low, high], "excludes_zero": bool(low > 0 or high < 0), "tasks": int(result.n_tasks),
            "text": f"held-out pass@1 {result.baseline:.3f} -> {result.treatment:.3f}, paired delta "
                    f"{result.delta:+.3f} [{low:+.3f}, {high:+.3f}] over {result.n_tasks} tasks"}


def eval_line(result: Mapping[str, Any]) -> str:
    low, high = result["ci95"]
    return f"{result['pass_at_1']:.3f} [{low:.3f}, {high:.3f}] over {result['tasks']} tasks x {result['samples']}"


@dataclass
class HeldOut(Hook):
    """Held-out pass@1 before training (once) and every ``eval_every`` steps (the last one is the summary's)."""

    ctx: Context

    def before(self, loop: Loop) -> None:
        if self.ctx.can_eval() and not loop.state.evals:
            loop.state.evals.append({"step": 0, **self.ctx.evaluate()})
            self.ctx.metrics.scalar("eval/pass_at_1", loop.state.evals[-1]["pass_at_1"], 0)
            self.ctx.log.write(f"held-out pass@1 before: {eval_line(loop.state.evals[-1])}")
            self.ctx.stop_if_asked(loop.state)

    def after_step(self, loop: Loop, record: dict[str, Any], result: StepResult) -> None:
        step, every = record["step"], self.ctx.plan.eval_every
        if every and step % every == 0 and step < self.ctx.plan.steps and self.ctx.can_eval():
            loop.state.evals.append({"step": step, **self.ctx.evaluate()})
            record["eval/pass_at_1"] = loop.state.evals[-1]["pass_at_1"]
