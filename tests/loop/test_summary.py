"""The end-of-run summary names the method as the run plan ran it: a knob the plan resolved (the sampling cap, the
temperature, the rates) is shown at the plan's value, not at the method object's own default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import whileai as wai
from whileai.errors import ConfigError
from whileai.loop.hooks.summary import as_run
from whileai.methods import method, method_names

PARITY = Path(__file__).resolve().parents[2] / "examples" / "tasksets" / "parity.jsonl"


@pytest.mark.parametrize("name", method_names())
def test_with_nothing_planned_it_is_the_repr(name: str) -> None:
    try:
        obj = method(name)
    except ConfigError:  # needs an argument (a wrapped method, a function, a grader)
        pytest.skip(f"{name} has no default construction")
    assert as_run(obj, {}) == repr(obj)


def test_a_planned_knob_shows_the_plan_value_in_a_wrapped_method_too() -> None:
    grpo = wai.GRPO(rollouts_per_prompt=4)
    assert as_run(grpo, {"max_tokens": 3, "steps": 9}) == repr(grpo).replace("max_tokens=1024", "max_tokens=3")
    wrapped = wai.Async(grpo, correction="tis")
    assert as_run(wrapped, {"max_tokens": 3}) == repr(wrapped).replace("max_tokens=1024", "max_tokens=3")
    assert as_run(wai.BPCO(), {"learning_rate": 0.01}).count("learning_rate=0.01") == 1  # critic_learning_rate kept


def test_a_rule_set_cap_is_the_same_in_the_plan_and_the_summary(tmp_path: Path, quick) -> None:
    """parity's cap comes from the answer-length rule (3), while FlashReinforce's own max_tokens is 8192."""
    run = wai.train(**{**quick, "steps": 1, "eval_tasks": 4, "eval_samples": 1}, taskset=str(PARITY),
                    run_dir=str(tmp_path / "run"), force=True)
    plan = json.loads((tmp_path / "run" / "summary.json").read_text())["plan"]
    assert plan["values"]["max_tokens"] == 3 and plan["sources"]["max_tokens"].startswith("rule")
    assert wai.FlashReinforce().max_tokens == 8192
    assert run.summary["method"] == ("FlashReinforce(trust=0.003, off_policy_steps=8, temperature=1.0, "
                                     "max_tokens=3)")
    assert run.summary["report"].splitlines()[0] == run.summary["method"]
    assert "max_tokens=8192" not in run.summary["report"]
