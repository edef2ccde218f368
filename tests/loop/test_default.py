"""The embedded default: `wai train` with no arguments, as a user runs it (seed 0; scripts/check_default.py
checks more seeds and the 5-minute budget, docs/train.md has its table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from whileai.cli import main


@pytest.mark.slow
def test_wai_train_with_no_arguments_learns_and_says_so(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "FlashReinforce(trust=0.003, off_policy_steps=8" in out
    assert "held-out pass@1" in out and "paired delta" in out
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.1 <= summary["eval_before"]["pass_at_1"] <= 0.6  # the warm start lands RL in the useful range
    low, high = summary["compare"]["ci95"]
    assert low > 0  # the paired before/after interval excludes zero, on the gain side
    assert summary["steps"] == 40 and "lag up to 8" in summary["run_spec"]
    assert {p.name for p in run_dir.iterdir()} >= {"config.toml", "metrics.jsonl", "tensorboard", "checkpoint",
                                                  "final", "summary.json", "curves.png", "evals.json"}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["lag"] == 2 for r in records) and records[-1]["sampled_at_step"] == 37  # trained 2 steps stale
