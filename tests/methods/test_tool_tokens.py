"""Every method ignores the environment's tokens (action_mask false): c = 0 there, and nothing it reports
depends on what a row carries at those tokens (docs/environments.md, "What the environment's tokens get").

For each method in the registry: the same batch twice, the second with ``logprobs``, ``behavior_logprobs``,
``values``, ``ref_logprobs`` and ``teacher_logprobs`` replaced by other values at every masked token. The
two updates must agree on every coefficient, advantage, admitted flag, value target, statistic and note.
"""

from __future__ import annotations

import numpy as np
import pytest

import whileai as wai
from whileai.methods.registry import method, method_names

from ._kit import random_rows

WRAPPED = {
    "async": [wai.Async("grpo", correction=c) for c in ("ipo", "icepop", "tis")],
    "groupwise_grading": [wai.GroupwiseGrading(grader=lambda rows: [len(r["logprobs"]) for r in rows])],
    "custom_loss": [wai.CustomLoss(advantages=lambda batch: batch.rewards_B - batch.rewards_B.mean(), loss=loss)
                    for loss in ("importance_sampling", "ppo", "gspo")],
}


def every_method() -> list:
    out = []
    for name in method_names():
        out += [(name, m) for m in WRAPPED[name]] if name in WRAPPED else [(name, None)]
    return out


def fresh(name: str, obj):
    """A new object for each update (RAE keeps its running baselines on the object)."""
    return method(name) if obj is None else obj


def batch(seed: int) -> list[dict]:
    rows = random_rows(seed, 12, values=True, ref=True, teacher=True, tasks=3)
    for i, row in enumerate(rows):
        row["score"] = 0.1 * i  # RM reads a scalar score per row
    return rows


def with_env_tokens_changed(rows: list[dict], seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for row in rows:
        row = dict(row)
        env = ~np.asarray(row["action_mask"])
        for name in ("logprobs", "behavior_logprobs", "values", "ref_logprobs", "teacher_logprobs"):
            values = np.asarray(row[name], dtype=np.float64)
            values[env] = rng.random(int(env.sum())) if name == "values" else -rng.exponential(4.0, int(env.sum()))
            row[name] = values.tolist()
        out.append(row)
    return out


@pytest.mark.parametrize(("name", "obj"), every_method(), ids=lambda x: x if isinstance(x, str) else "")
@pytest.mark.parametrize("seed", range(4))
def test_nothing_a_method_reports_depends_on_environment_tokens(name, obj, seed):
    rows = batch(seed)
    assert sum(not m for r in rows for m in r["action_mask"]) >= 3  # the batch has environment tokens
    a = fresh(name, obj).update(rows)
    b = fresh(name, obj).update(with_env_tokens_changed(rows, seed + 100))
    # a scalar score head (RM) puts its c on the row's last position whoever wrote it: that c weights the
    # head's output there, not a log-probability, so it is no gradient through the environment's token
    if fresh(name, obj).run_spec().head == "policy":
        for row, c in zip(rows, a.coefficients):
            assert np.all(np.asarray(c)[~np.asarray(row["action_mask"])] == 0.0), name
    for field in ("coefficients", "advantages", "value_targets"):
        x, y = getattr(a, field), getattr(b, field)
        assert (x is None) == (y is None)
        for p, q in zip(x or [], y or []):
            np.testing.assert_array_equal(p, q, err_msg=f"{name} {field}")
    np.testing.assert_array_equal(a.admitted, b.admitted)
    assert a.stats == b.stats, name
    assert a.notes == b.notes, name
