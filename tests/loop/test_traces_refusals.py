"""Refusals of `wai train --rows` that must come before any model loads, with the fix in the message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import whileai as wai
from whileai.errors import ConfigError


def _traces(path: Path, per_task: int, tasks: int = 4) -> Path:
    with path.open("w") as f:
        for t in range(tasks):
            for k in range(per_task):
                f.write(json.dumps({"prompt_tokens": [1, 72], "tokens": [105, 2], "behavior_logprobs": [-0.1, -0.2],
                                    "reward": float(k % 2), "task_id": f"t{t}"}) + "\n")
    return path


def test_a_group_method_on_one_trace_per_task_is_refused_and_leaves_no_run(tmp_path: Path) -> None:
    rows = _traces(tmp_path / "one.jsonl", per_task=1)
    with pytest.raises(ConfigError, match=r"no task_id has 2 or more traces \(4 traces, 4 tasks\).*flash_reinforce"):
        wai.train(method="grpo", rows=str(rows), model="builtin:tiny", run_dir=str(tmp_path / "run"), steps=1)
    assert not (tmp_path / "run").exists()


def test_a_group_method_on_groups_is_accepted_by_the_check(tmp_path: Path) -> None:
    from whileai.loop.sources.traces import _check_groups, load_vocab, scan

    rows = _traces(tmp_path / "two.jsonl", per_task=2)
    _check_groups(scan(rows, load_vocab("builtin:tiny"), True), wai.GRPO(rollouts_per_prompt=2))  # no error


@pytest.mark.parametrize("model, says", [("./no-such-model", "no such directory"),
                                         ("no-such-hub-id", "not a directory")])
def test_a_missing_model_is_named_with_the_fix(tmp_path: Path, model: str, says: str) -> None:
    rows = _traces(tmp_path / "t.jsonl", per_task=1)
    with pytest.raises(ConfigError, match=f"model = '{model}'.*{says}.*Fix: give a local model directory"):
        wai.train(method="flash_reinforce", rows=str(rows), model=model, run_dir=str(tmp_path / "run"), steps=1)
