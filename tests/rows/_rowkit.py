"""Rows made for the tests: graded rows with known per-task pass rates."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def make_rows(passes: Sequence[int], k: int | Sequence[int], *, model: str = "student",
              prefix: str = "t", truncated_passes: int = 0, seed: int = 0) -> list[dict[str, Any]]:
    """Task i gets k rows of which ``passes[i]`` pass (reward 1.0); every row has a few tokens.

    ``truncated_passes`` marks that many passing rows (from the first task on) as truncated.
    """
    rng = np.random.default_rng(seed)
    ks = [k] * len(passes) if isinstance(k, int) else list(k)
    rows, cut = [], truncated_passes
    for i, (c, n) in enumerate(zip(passes, ks)):
        for j in range(n):
            passed = j < c
            row = {"task_id": f"{prefix}{i}", "reward": 1.0 if passed else 0.0, "truncated": False,
                   "model": model, "tokens": [int(t) for t in rng.integers(0, 100, size=3 + j)]}
            if passed and cut:
                row["truncated"], cut = True, cut - 1
            rows.append(row)
    return rows


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
