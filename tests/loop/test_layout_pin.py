"""Pinned behaviour for the loop's move into rooms (issue 32): what the embedded default prints and records bit
for bit, the weights a trace file and pushed rows train to, and the plan ``dry_run`` resolves for each kind of
run, recorded at ef6f575 before any module moved (tests/loop/spine_pin.py pins four methods' weights).

Record again only for a change that means to move behaviour: PYTHONPATH=src python tests/loop/test_layout_pin.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from test_spine_pin import close, fingerprint

import whileai as wai
from whileai.loop import dry_run

GOLDEN = Path(__file__).with_name("layout_pin.json")
DEFAULT = dict(steps=3, warm_start_steps=2, eval_tasks=4, progress=False, threads=1)
# threads given: the rule reads $OMP_NUM_THREADS and the machine's load (issue 30), which a pin cannot hold
DRY = {  # name -> dry_run arguments: one per row source, trainer and method family
    "default": {},
    "grpo": dict(method="grpo", knobs={"generations": 4}),
    "dr_grpo": dict(method="dr_grpo"),
    "opd": dict(method="opd", teacher="builtin:mini"),
    "sft_rows": dict(method="sft", rows=[{"prompt": "a", "completion": "b"}] * 4),
    "lag": dict(method="flash_reinforce", lag=3, sync_every=2),
}


def _default(tmp: Path) -> dict[str, Any]:
    run = wai.train(**DEFAULT, run_dir=str(tmp / "run"))
    records = [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
               for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((tmp / "run" / "summary.json").read_text())
    kept = {k: summary[k] for k in ("run_spec", "steps", "resolved", "method", "plan", "eval_before", "eval_after",
                                    "compare", "preflight", "warm_start_steps_run")}
    return {"metrics": records, "summary": kept, "weights": fingerprint(run.weights)}


def _rows(tmp: Path) -> dict[str, Any]:
    rows = [{"prompt": f"Q{i}: say {c}", "completion": c} for i, c in enumerate("abcdefgh" * 2)]
    run = wai.train(method="sft", rows=rows, steps=3, progress=False, run_dir=str(tmp / "rows"))
    return fingerprint(run.weights)


def _plan(args: dict[str, Any]) -> str:
    plan = dry_run(**{"threads": 1, **args})
    return plan.table() + "\n" + json.dumps(plan.values(), sort_keys=True, default=str)


def _plans() -> dict[str, str]:
    return {name: _plan(args) for name, args in DRY.items()}


def record() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        return {"default": _default(Path(tmp) / "d"), "rows": _rows(Path(tmp)), "plans": _plans()}


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def same(got: Any, want: Any) -> bool:
    """Equal, except floats within 1e-12 relative: the last bits of a float64 reduction differ between CPUs (the
    pin was recorded on one machine and runs on others); any change of behaviour moves them far more."""
    if isinstance(got, float) and isinstance(want, float):
        return got == pytest.approx(want, rel=1e-12, abs=1e-15)
    if isinstance(got, dict) and isinstance(want, dict):
        return sorted(got) == sorted(want) and all(same(got[k], want[k]) for k in got)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(same(a, b) for a, b in zip(got, want))
    return bool(got == want)


def test_the_same_rule_catches_a_changed_metric():
    assert same([{"a": 0.1, "b": "x"}], [{"a": 0.1 * (1 + 1e-14), "b": "x"}])
    assert not same([{"a": 0.1}], [{"a": 0.1 * (1 + 1e-9)}])
    assert not same([{"a": 1}], [{"a": 1, "b": 2}])


def test_the_embedded_default_records_the_pinned_metrics(golden: dict[str, Any], tmp_path: Path):
    got = _default(tmp_path)
    assert same(got["metrics"], golden["default"]["metrics"])
    assert same(got["summary"], golden["default"]["summary"])
    assert close(got["weights"], golden["default"]["weights"], 1e-6) <= 1e-6


def test_pushed_rows_train_to_the_pinned_weights(golden: dict[str, Any], tmp_path: Path):
    assert close(_rows(tmp_path), golden["rows"], 1e-6) <= 1e-6


@pytest.mark.parametrize("name", sorted(DRY))
def test_the_plan_of_each_kind_of_run_is_the_pinned_text(golden: dict[str, Any], name: str):
    assert _plan(DRY[name]) == golden["plans"][name]


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
