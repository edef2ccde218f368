"""Held-out evaluation: pass@1 on the taskset's test split with the library's interval, and the paired
before/after comparison from ``compare``. An episode's reward is graded like a completion's (a multi-turn
taskset's episodes are played by ``rollouts``, so pass@1 is on whole episodes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from whileai.loop.sources.rollouts import Sampling, rollouts
from whileai.rows.stats import compare, pass_at

EVAL_SEED = 1_000_003  # the same sampler seeds before and after: the two arms differ only in the weights
PASS = 1.0  # a pass is reward >= 1.0 (the taskset contract)


def held_out(engine: Any, taskset: Any, tasks: Sequence[Any], prompts: Sequence[list[int]], rollouts_per_prompt: int,
             sampling: Sampling, seed: int) -> dict[str, Any]:
    """``rollouts_per_prompt`` episodes (completions) per held-out task at the method's temperature; pass@1 with its 95% interval."""
    rows = rollouts(engine, taskset, tasks, prompts, [rollouts_per_prompt] * len(tasks), sampling, seed + EVAL_SEED,
                    -1)
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
