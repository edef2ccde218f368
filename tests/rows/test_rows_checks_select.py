"""The guide's checks, select() and selection_report(), on rows whose answers are worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

import whileai as wai
from whileai import ConfigError
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
from whileai.rows.select import select, selection_report

from ._rowkit import make_rows


def test_guide_checks_by_hand():
    rows = make_rows([0, 2, 4, 1], [4, 4, 4, 3], truncated_passes=2)  # task 1's two passes are cut
    assert truncated_passes(rows) == 2
    assert rollouts_per_task(rows) == 3
    assert band(rows) == "mixed"
    assert split_share(rows) == pytest.approx(2 / 4)  # t1 (2 of 4) and t3 (1 of 3)
    assert band(make_rows([0, 0], 3)) == "floor"
    assert band(make_rows([3, 2], [3, 2])) == "saturated"
    assert split_share(make_rows([3, 0], 3)) == 0.0


def test_truncated_pass_uses_threshold():
    rows = [{"task_id": "a", "reward": 0.6, "truncated": True}, {"task_id": "a", "reward": 0.4, "truncated": True}]
    with pytest.raises(ConfigError, match="threshold="):  # 0.6 and 0.4 are not pass/fail: say where a pass is
        truncated_passes(rows)
    assert truncated_passes(rows, threshold=0.5) == 1
    assert truncated_passes(rows, threshold=1.0) == 0


def test_on_policy_and_model_mix():
    rows = make_rows([1, 1], 2, model="a") + make_rows([1], 2, model="b", prefix="u")
    assert on_policy(make_rows([1], 2, model="a"), "a")
    assert not on_policy(rows, "a") and not on_policy(rows, "zzz")
    no_model = [{"task_id": "t", "reward": 1.0}]
    assert not on_policy(no_model, "a")  # a row that does not say who wrote it is not on-policy
    assert model_mix(rows) == {"a": 4, "b": 2}
    assert model_mix(no_model) == {"(none)": 1}


def test_teacher_clears_needs_gap_and_separate_intervals():
    student = make_rows([1] * 40, 4)  # every task 0.25: interval is the point [0.25, 0.25]
    strong = make_rows([2] * 40, 4)  # 0.5: gap 0.25, intervals apart
    close = make_rows([1] * 39 + [2], 4)  # 0.25625, apart, gap 0.006
    assert teacher_clears(strong, student)
    assert not teacher_clears(close, student)  # intervals apart, but the gap is under PROVE_EFFECT
    noisy = make_rows([4] * 20 + [0] * 20, 4)  # 0.5 but the interval [0.34, 0.66] ...
    wide_student = make_rows([4] * 9 + [0] * 31, 4)  # ... overlaps 0.225's [0.09, 0.36]
    assert not teacher_clears(noisy, wide_student)
    assert PROVE_EFFECT == 0.05


def test_expected_split_share_formula_and_simulation():
    """p = 0.5, k = 4: 1 - 1/16 - 1/16 = 0.875; p = 0 or 1: never split whatever k is."""
    assert expected_split_share(0.5, 4) == pytest.approx(0.875)
    np.testing.assert_allclose(expected_split_share([0.0, 1.0, 0.2], 8), [0.0, 0.0, 1 - 0.2**8 - 0.8**8])
    rng = np.random.default_rng(0)
    draws = rng.random((50_000, 6)) < 0.3
    split = np.mean(draws.any(axis=1) & ~draws.all(axis=1))
    assert split == pytest.approx(expected_split_share(0.3, 6), abs=0.01)
    with pytest.raises(ConfigError):
        expected_split_share(0.5, 0)


# --------------------------------------------------------------------------- select
def test_select_rl_drops_unanimous_groups_and_says_how_many():
    rows = make_rows([0, 2, 4, 1, 1], [4, 4, 4, 1, 3])
    chosen = select(rows, mode="rl")
    assert [r["task_id"] for r in chosen] == ["t1"] * 4 + ["t4"] * 3
    assert chosen.kept_R.tolist() == [4, 5, 6, 7, 13, 14, 15]
    assert "dropped 9 rows of 3 unanimous tasks (1 all fail, 2 all pass)" in chosen.notes[0]
    assert "1 task has a single rollout" in chosen.notes[1]
    assert str(chosen).startswith("select(mode='rl'): kept 7 of 16 rows (5 tasks)")


def test_select_sft_keeps_untruncated_passes():
    rows = make_rows([2, 0, 3], 3, truncated_passes=1)
    chosen = select(rows, mode="sft")
    assert len(chosen) == 4  # 5 passes, one of them truncated
    assert all(r["reward"] == 1.0 and not r["truncated"] for r in chosen)
    assert any("dropped 1 truncated pass:" in n for n in chosen.notes)


def test_select_dpo_pairs_closest_lengths_and_feeds_dpo():
    """Task a: passes of length 10 and 3, fails of length 4, 11, 20. Closest gaps first:
    (10, 11) gap 1 and (3, 4) gap 1; the fail of length 20 is left over. Task b has no pass."""
    def row(task, reward, n):
        return {"task_id": task, "reward": reward, "logprobs": [-0.5] * n, "ref_logprobs": [-0.6] * n}

    rows = [row("a", 1.0, 10), row("a", 0.0, 4), row("a", 1.0, 3), row("a", 0.0, 11), row("a", 0.0, 20),
            row("b", 0.0, 5)]
    chosen = select(rows, mode="dpo")
    assert chosen.pairs == ((0, 3), (2, 1))
    assert [(r["pair"], r["chosen"], len(r["logprobs"])) for r in chosen] == [
        (0, True, 10), (0, False, 11), (1, True, 3), (1, False, 4)]
    assert "built 2 pairs" in chosen.notes[0] and "2 rows left unpaired" in chosen.notes[0]
    dpo = wai.method("dpo")
    update = dpo.update(list(chosen))
    assert update.admitted.all()  # the DPO method reads the explicit 'pair'/'chosen' fields


def test_select_refuses_unknown_mode_and_dpo_without_length():
    with pytest.raises(ConfigError, match="'rl', 'sft', 'dpo'"):
        select(make_rows([1], 2), mode="ppo")
    with pytest.raises(ValueError, match="row 0: no length to match pairs on"):
        select([{"task_id": "a", "reward": 1.0}], mode="dpo")


def test_selection_report_counts_by_hand():
    rows = make_rows([0, 2, 4, 1], 4, truncated_passes=1) + make_rows([1], 4, model="other", prefix="u")
    report = selection_report(rows)
    assert (report.n_rows, report.n_tasks, report.rollouts_min) == (20, 5, 4)
    assert (report.tasks_all_fail, report.tasks_split, report.tasks_all_pass) == (1, 3, 1)
    assert report.split_share == pytest.approx(0.6) and report.band == "mixed"
    assert (report.truncated_rows, report.truncated_passes) == (1, 1)
    assert report.model_mix == {"student": 16, "other": 4}
    # rl: t1, t3, u0 (12 rows); sft: 8 passes minus 1 truncated; dpo: min(clean passes, fails) per task:
    # t1 min(1, 2) = 1 (its first pass is truncated), t3 min(1, 3) = 1, u0 min(1, 3) = 1 -> 3
    assert report.keeps == {"rl": {"rows": 12, "tasks": 3}, "sft": {"rows": 7}, "dpo": {"pairs": 3}}
    rates = np.array([0, 0.5, 1, 0.25, 0.25])
    assert list(report.expected_split_share) == [4, 8, 16]  # k, 2k, 4k: like with like
    assert report.expected_split_share[8] == pytest.approx(np.mean(1 - rates**8 - (1 - rates) ** 8))
    text = str(report)
    assert "split     3      60.0%" in text and "fix the reward first" in text
