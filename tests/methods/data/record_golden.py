"""Record data/golden.json from the code as it was BEFORE the fold (whileai.methods + whileai.algorithms).

Run once, before moving anything: python tests/methods/data/record_golden.py. Kept in the history only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.methods.golden_cases import (  # noqa: E402
    MAX_TOKENS,
    METHOD_CASES,
    SEEDS,
    SERVICE_CASES,
    case_id,
    grader,
    method_batch,
    service_batch,
)


def plain(x: Any) -> Any:
    return np.asarray(x, dtype=np.float64).tolist()


def record_method(name: str, options: dict[str, Any], seed: int) -> dict[str, Any]:
    from whileai.methods.registry import method

    opts = {k: (grader if v == "grader" else v) for k, v in options.items()}
    update = method(name, **opts).update(method_batch(seed))
    out = {"coefficients": [plain(c) for c in update.coefficients], "advantages": [plain(a) for a in update.advantages],
           "admitted": [bool(a) for a in update.admitted], "stats": {k: float(v) for k, v in update.stats.items()}}
    if update.value_targets is not None:
        out["value_targets"] = [plain(v) for v in update.value_targets]
    return out


class RowTeacher:
    """A teacher whose log-probabilities are the rows' own field, in the order the sample lists completions."""

    def __init__(self, values: list[list[float]]) -> None:
        self.values = values

    def logprobs(self, prompts, completions):
        assert len(completions) == len(self.values)
        return [list(v) for v in self.values]


def record_service(name: str, options: dict[str, Any], seed: int) -> dict[str, Any]:
    from whileai.algorithms import algorithm
    from whileai.algorithms.core import Completion, Group, LossContext, Sample, SampleRequest
    from whileai.engine import capabilities
    from whileai.engine.losses import resolve_config
    from whileai.engine.models import byte_tokenizer
    from whileai.envs import Task, load_taskset

    rows = service_batch(seed)
    order: list[int] = []
    groups = []
    for task_id in dict.fromkeys(r["task_id"] for r in rows):
        members = [i for i, r in enumerate(rows) if r["task_id"] == task_id]
        order += members
        comps = [Completion([97 + (i % 20)] * len(rows[i]["logprobs"]), list(rows[i]["behavior_logprobs"]),
                            "length" if rows[i].get("truncated") else "stop", rows[i]["reward"], "ab",
                            bool(rows[i].get("truncated"))) for i in members]
        groups.append(Group(Task(task_id, "abc", "abca"), [1, 2, 3], comps))
    field = "ref_logprobs" if name == "reinforce_pp" else "teacher_logprobs"
    teacher = RowTeacher([rows[i][field] for i in order])
    algo = algorithm(name)
    ctx = LossContext(None, {"provider": "local", "losses": capabilities()}, byte_tokenizer(),
                      load_taskset("builtin:case"), algo.make_options(options), teacher)
    request = SampleRequest(4, {"max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": 0}, 0)
    out = algo.build_loss(Sample(groups, 0), 0, request, ctx)
    # which row each datum is: datums come in sample order, one per completion carrying a signal
    sent: dict[int, list[float]] = {}
    it = iter(out.data)
    kept = [i for i in order]
    if name == "dapo":  # DAPO drops groups; match datums by their advantages' row order among kept rows
        kept = []
    datums = list(it)
    advantages = {}
    if name != "dapo":
        j = 0
        for i in kept:
            n = len(rows[i]["logprobs"])
            if j < len(datums) and _matches(datums[j], rows[i]):
                advantages[i] = datums[j]["loss_fn_inputs"]["advantages"][-n:]
                j += 1
        assert j == len(datums), (name, j, len(datums))
    else:
        advantages = _dapo_rows(datums, rows, order)
    for i, adv in advantages.items():
        sent[i] = plain(adv)
    return {"loss": out.loss_fn, "loss_config": resolve_config(out.loss_fn, out.loss_fn_config),
            "advantages": {str(i): v for i, v in sorted(sent.items())},
            "metrics": {k: float(v) for k, v in out.metrics.items()}}


def _matches(datum: dict[str, Any], row: dict[str, Any]) -> bool:
    n = len(row["logprobs"])
    lp = datum["loss_fn_inputs"]["logprobs"][-n:]
    return len(datum["model_input"]) == 2 + n and np.allclose(lp, row["behavior_logprobs"])


def _dapo_rows(datums, rows, order) -> dict[int, list[float]]:
    out, j = {}, 0
    for i in order:
        if j < len(datums) and _matches(datums[j], rows[i]) and not rows[i].get("truncated"):
            out[i] = datums[j]["loss_fn_inputs"]["advantages"][-len(rows[i]["logprobs"]):]
            j += 1
    assert j == len(datums)
    return out


def main() -> None:
    table: dict[str, Any] = {}
    for seed in SEEDS:
        for name, options in METHOD_CASES:
            table[case_id("method", name, options, seed)] = record_method(name, options, seed)
        for name, options in SERVICE_CASES:
            table[case_id("service", name, options, seed)] = record_service(name, options, seed)
    path = Path(__file__).with_name("golden.json")
    path.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {len(table)} cases to {path}")


if __name__ == "__main__":
    main()
