"""Random rows for method tests: ragged lengths, tool tokens, a stale sampler, optional extra fields."""

from __future__ import annotations

from typing import Any

import numpy as np


def random_rows(seed: int, n: int = 8, *, drift: float = 0.3, values: bool = False, ref: bool = False,
                teacher: bool = False, tasks: int = 3, binary: bool = True) -> list[dict[str, Any]]:
    """``n`` trajectories of 1-7 tokens, ~20% tool tokens, behavior = logprobs + noise of scale ``drift``."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        length = int(rng.integers(1, 8))
        logprobs = -rng.exponential(0.8, size=length) - 1e-3
        behavior = np.minimum(logprobs + drift * rng.standard_normal(length), -1e-4)
        mask = rng.random(length) > 0.2
        mask[rng.integers(0, length)] = True  # at least one action token
        row: dict[str, Any] = {
            "reward": float(rng.integers(0, 2)) if binary else float(rng.random()),
            "logprobs": logprobs.tolist(),
            "behavior_logprobs": behavior.tolist(),
            "action_mask": mask.tolist(),
            "task_id": f"t{i % tasks}",
            "agent": f"a{i % 2}",
        }
        if values:
            row["values"] = rng.random(length).tolist()
        if ref:
            row["ref_logprobs"] = np.minimum(logprobs + 0.2 * rng.standard_normal(length), -1e-4).tolist()
        if teacher:
            row["teacher_logprobs"] = np.minimum(logprobs + 0.5 * rng.standard_normal(length), -1e-4).tolist()
        rows.append(row)
    return rows
