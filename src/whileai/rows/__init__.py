"""Graded rows: the batch contract, loading, pass rates, checks and selection.

numpy only: importing this never imports torch. ``route`` (which returns method objects) lives one
layer up, in ``whileai.routing``.
"""

from whileai.rows.batch import Batch, as_batch
from whileai.rows.checks import (
    PROVE_EFFECT,
    band,
    expected_split_share,
    model_mix,
    on_policy,
    rollouts_per_task,
    split_share,
    teacher_clears,
    truncated_passes,
)
from whileai.rows.io import GradedRows, iter_rows, load_graded, load_rows
from whileai.rows.select import Selection, SelectionReport, select, selection_report
from whileai.rows.stats import Comparison, HoldoutSize, PassAt, compare, holdout_size, pass_at

__all__ = [
    "PROVE_EFFECT", "Batch", "Comparison", "GradedRows", "HoldoutSize", "PassAt", "Selection",
    "SelectionReport", "as_batch", "band", "compare", "expected_split_share", "holdout_size", "iter_rows",
    "load_graded", "load_rows", "model_mix", "on_policy", "pass_at", "rollouts_per_task", "select",
    "selection_report", "split_share", "teacher_clears", "truncated_passes",
]
