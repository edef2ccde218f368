"""The failed-reply length of a recipe's runs: a hand-worked folder of two arms at two seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from whileai.errors import ConfigError
from whileai.evidence.lengths import failed_length, recipe_lengths


def write(path: Path, rows: list[tuple[str, float]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"task_id": "t", "reward": r, "completion": c}) + "\n" for c, r in rows))


def test_only_replies_below_a_pass_count(tmp_path):
    write(tmp_path / "h.jsonl", [("aa=2", 1.0), ("aaaa=1", 0.5), ("=3", 0.0)])  # the pass (4 chars) is left out
    assert failed_length(tmp_path / "h.jsonl") == (6 + 2) / 2
    write(tmp_path / "all.jsonl", [("a=1", 1.0)])
    assert failed_length(tmp_path / "all.jsonl") != failed_length(tmp_path / "all.jsonl")  # NaN: none failed


def test_each_arm_is_paired_with_the_baseline_at_its_seed(tmp_path):
    """Baseline fails with lengths 4 (seed 0) and 6 (seed 1); the arm with 3 and 4: deltas -1 and -2, mean -1.5,
    t-interval -1.5 +/- 12.706 * 0.5 (sd 0.707 / sqrt 2 = 0.5), clipped to the longest reply, 6 characters."""
    runs = {"grpo": [], "dr_grpo": []}
    for label, lengths in (("grpo", (4, 6)), ("dr_grpo", (3, 4))):
        for seed, n in enumerate(lengths):
            run = tmp_path / f"{label}-seed{seed}"
            write(run / "heldout.jsonl", [("a" * n, 0.2), ("aa=2", 1.0)])
            write(run / "heldout-before.jsonl", [("a" * 5, 0.1)])
            runs[label].append(str(run))
    (tmp_path / "recipe.json").write_text(json.dumps({"runs": runs}))
    report = recipe_lengths(tmp_path).splitlines()
    assert report[1] == "  before RL: 5.000 (5.00 5.00)"
    assert report[2:4] == ["  grpo: 5.000 (4.00 6.00)", "  dr_grpo: 3.500 (3.00 4.00)"]
    assert report[4] == f"  dr_grpo minus grpo: -1.500 [-6.000, {-1.5 + 12.706 * 0.5:+.3f}] (95%, seeds paired)"
    with pytest.raises(ConfigError, match="holds no recipe.json"):
        recipe_lengths(tmp_path / "nowhere")
