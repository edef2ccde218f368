"""compare's seed-paired verdict on rows tagged as a recipe tags them (one seed label per run), worked by hand."""

from __future__ import annotations

import math

import pytest

from whileai.rows.stats import compare

T3 = 3.182446  # t(0.975, 3)


def _rows(passes_by_seed: list[tuple[int, int]], samples: int = 2) -> list[dict]:
    """Two held-out tasks ('a', 'b') per seed, ``samples`` samples each, the first ``passes`` of them passing;
    every row tagged with its seed as the recipe runner tags them."""
    return [{"task_id": task, "reward": float(j < passes), "seed": str(seed)}
            for seed, per_task in enumerate(passes_by_seed) for task, passes in zip("ab", per_task)
            for j in range(samples)]


BASE = [(0, 0), (1, 1), (0, 0), (1, 1)]  # per seed, passes of 2 on tasks a, b: seed scores 0, .5, 0, .5
TREAT = [(1, 0), (2, 2), (1, 0), (2, 2)]  # seed scores .25, 1, .25, 1


def test_the_seed_paired_verdict_by_hand():
    """Per-seed deltas: seed 0 ((.5 - 0) + (0 - 0)) / 2 = .25; seed 1 ((1 - .5) + (1 - .5)) / 2 = .5; then .25, .5.
    Mean .375, sd sqrt((4 * .125^2) / 3) = .144338; half-width t(.975, 3) * .144338 / 2 = .229671:
    [+.145329, +.604671] excludes 0 -> gain shown. The seeds overlap (treatment seeds 0 and 2 score .25, below
    baseline seeds 1 and 3 at .5), which the rule this replaced called unresolved.
    The task-pooled interval: task a .75 - .25 = .5, task b .5 - .25 = .25; mean .375, sd .176777, t(.975, 1) =
    12.7062 * .176777 / sqrt(2) = 1.588 -> clipped to [-1, +1]: it holds 0, and is shown beside."""
    result = compare(_rows(BASE), _rows(TREAT), threshold=1.0)
    sd = math.sqrt(4 * 0.125**2 / 3)
    assert sd == pytest.approx(0.144338, abs=1e-6)
    assert result.paired_seeds == 4 and result.seed_delta == pytest.approx(0.375)
    assert result.seed_ci95 == pytest.approx((0.375 - T3 * sd / 2, 0.375 + T3 * sd / 2), abs=1e-6)
    assert result.seed_ci95[0] == pytest.approx(0.145329, abs=1e-5)
    assert result.delta == pytest.approx(0.375) and result.ci95 == (-1.0, 1.0)
    assert result.verdict == "gain shown" and "seed-paired 95% interval [+0.145, +0.605] over 4 seeds" in result.reason
    assert "task-pooled interval holds 0" in result.reason
    row = result.row()
    assert row[3] == "+0.38 [-1.00, +1.00]" and row[4] == "+0.38 [+0.15, +0.60] (4 seeds)" and row[5] == "gain shown"
    flipped = compare(_rows(TREAT), _rows(BASE), threshold=1.0)
    assert flipped.verdict == "loss shown" and flipped.seed_ci95[1] == pytest.approx(-0.145329, abs=1e-5)


def test_three_seeds_of_the_same_deltas_are_unresolved():
    """Seeds 0-2 only: deltas .25, .5, .25, mean 1/3, sd .144338, t(.975, 2) = 4.302653:
    half-width .358551 -> [-.025218, +.691885] holds 0 -> unresolved."""
    result = compare(_rows(BASE[:3]), _rows(TREAT[:3]), threshold=1.0)
    assert result.seed_ci95[0] == pytest.approx(1 / 3 - 4.302653 * 0.144338 / math.sqrt(3), abs=1e-5)
    assert result.seed_ci95[0] == pytest.approx(-0.025218, abs=1e-5)
    assert result.verdict == "unresolved" and "holds 0" in result.reason


def test_pairs_are_seeds_in_both_arms():
    """A seed in one arm only is left out of the pairs and counted in the reason; one pair is unresolved."""
    extra = _rows(TREAT) + [dict(r, seed="9") for r in _rows(TREAT[:1])]
    result = compare(_rows(BASE), extra, threshold=1.0)
    assert result.paired_seeds == 4 and "1 seed in one arm only left out" in result.reason
    one = compare(_rows(BASE[:1]), _rows(TREAT[:1]), threshold=1.0)
    assert one.verdict == "unresolved" and one.paired_seeds == 1 and "1 seed in both arms" in one.reason
