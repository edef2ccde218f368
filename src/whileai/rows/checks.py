"""The guide's questions, asked of graded rows (the guide "pick a method", sections 1-5).

Each takes rows as dicts, ``GradedRows`` or a file path. A pass is ``reward >= threshold``;
``threshold`` may be left out only when every reward is 0 or 1 (``pass_threshold``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import numpy as np

from whileai.errors import BatchError, ConfigError
from whileai.rows.io import as_graded, pass_threshold
from whileai.rows.stats import Rows, pass_at

# The gap a teacher must clear over the student before OPD is worth a run: engineering, not a
# result from the literature (the guide, section 5).
PROVE_EFFECT = 0.05


def truncated_passes(rows: Rows, threshold: float | None = None) -> int:
    """Rows cut at the token cap that still pass. Above zero, fix the reward before reading anything else."""
    graded = as_graded(rows)
    threshold = pass_threshold(graded.reward_R, threshold, graded.source)
    return int(np.count_nonzero(graded.truncated_R & (graded.reward_R >= threshold)))


def rollouts_per_task(rows: Rows) -> int:
    """The fewest rows any task has: k. At 1, no grouped method has a baseline to subtract."""
    graded = as_graded(rows)
    return int(np.bincount(graded.task_R, minlength=graded.n_tasks).min())


def band(rows: Rows, threshold: float | None = None) -> str:
    """"floor" if every task always fails, "saturated" if every task always passes, else "mixed"."""
    rates = pass_at(rows, threshold=threshold).rates_T
    if (rates == 0.0).all():
        return "floor"
    if (rates == 1.0).all():
        return "saturated"
    return "mixed"


def split_share(rows: Rows, threshold: float | None = None) -> float:
    """The share of tasks with both a pass and a fail: the only ones a grouped method learns from."""
    rates = pass_at(rows, threshold=threshold).rates_T
    return float(np.count_nonzero((rates > 0.0) & (rates < 1.0)) / len(rates))


def on_policy(rows: Rows, model: str) -> bool:
    """True when every row was written by ``model`` (a row without ``model`` is not)."""
    graded = as_graded(rows)
    if model not in graded.models:
        return False
    return bool((graded.model_R == graded.models.index(model)).all())


def model_mix(rows: Rows) -> dict[str, int]:
    """Rows per ``model``, most first; rows without one are counted under "(none)"."""
    graded = as_graded(rows)
    counts = np.bincount(graded.model_R + 1, minlength=len(graded.models) + 1)
    mix = {str(name): int(counts[i + 1]) for i, name in enumerate(graded.models)}
    if counts[0]:
        mix["(none)"] = int(counts[0])
    return dict(sorted(mix.items(), key=lambda item: -item[1]))


def teacher_gap(teacher_rows: Rows, student_rows: Rows, threshold: float | None = None) -> dict[str, Any]:
    """The numbers ``teacher_clears`` decides on: both pass@1s, their intervals, the gap, overlap."""
    t, s = pass_at(teacher_rows, threshold=threshold), pass_at(student_rows, threshold=threshold)
    return {"teacher_pass_at_1": t.pass_at_1, "teacher_ci95": t.ci95, "teacher_tasks": t.n_tasks,
            "student_pass_at_1": s.pass_at_1, "student_ci95": s.ci95, "student_tasks": s.n_tasks,
            "gap": t.pass_at_1 - s.pass_at_1, "apart": t.ci95[0] > s.ci95[1]}


def teacher_clears(teacher_rows: Rows, student_rows: Rows, effect: float = PROVE_EFFECT,
                   threshold: float | None = None) -> bool:
    """True when the teacher beats the student by at least ``effect`` in pass@1 *and* the two 95%
    intervals do not overlap. Score both on the same held-out tasks, at the student's max_tokens."""
    gap = teacher_gap(teacher_rows, student_rows, threshold)
    return bool(gap["gap"] >= effect and gap["apart"])


@overload
def expected_split_share(p: float, k: int) -> float: ...
@overload
def expected_split_share(p: Sequence[float] | np.ndarray, k: int) -> np.ndarray: ...
def expected_split_share(p: Any, k: int) -> Any:
    """The chance a task with pass rate ``p`` is split (a pass and a fail) among ``k`` rollouts:
    ``1 - p**k - (1 - p)**k``. Per task for an array of rates; 0 at p = 0 or 1 whatever k is."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"expected_split_share: k={k!r} must be an integer >= 1.")
    rates = np.asarray(p, dtype=np.float64)
    bad = ~((rates >= 0) & (rates <= 1))
    if bad.any():
        raise BatchError(f"expected_split_share: a pass rate must be in [0, 1], got {rates[bad].ravel()[0]!r}.")
    share = 1.0 - rates**k - (1.0 - rates) ** k
    return float(share) if share.ndim == 0 else share
