"""The golden table: every registry method and every service-page algorithm, on fixed random batches, gives
the coefficients, advantages, admitted rows and stats recorded before the fold (data/golden.json, written by
the since-removed ``whileai.algorithms`` and the methods as they were; the recorder is in the git history,
tests/methods/data/record_golden.py).

The service page's algorithms now run as methods; each old case maps to one method with options
(``SERVICE_METHODS``). The per-token advantage the step sends must equal what the old build_loss put in its
datums, for the same rows (a row not sent then carries all-zero advantages now), with the same loss and the
same resolved loss config. One recorded value is a bug, fixed here: ``grpo_len_norm`` and ``dapo`` divided
by the population std; they now divide by the sample std as GRPO, verl and TRL do, so their recorded values
are checked times (std_pop + 1e-6) / (std_sample + 1e-6) of their group (hand-worked in test_policy.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.methods.golden_cases import (
    MAX_TOKENS,
    METHOD_CASES,
    SEEDS,
    SERVICE_CASES,
    case_id,
    grader,
    method_batch,
    service_batch,
)
from whileai.methods import method

GOLDEN = json.loads((Path(__file__).parent / "data" / "golden.json").read_text(encoding="utf-8"))
SERVICE = {"loss": "importance_sampling", "max_ratio": None}
SERVICE_METHODS: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("grpo_nostd", "{}"): ("grpo_nostd", {}),
    ("grpo_len_norm", "{}"): ("grpo_len_norm", {}),
    ("drgrpo", "{}"): ("dr_grpo", {"loss": "importance_sampling", "truncated": "keep", "max_tokens": MAX_TOKENS}),
    ("drgrpo", "{'length': 'own'}"): ("dr_grpo", {"loss": "importance_sampling", "truncated": "keep",
                                                  "length": "own"}),
    ("ppo", "{}"): ("ppo", {}),
    ("ppo", "{'clip_low': 0.7, 'clip_high': 1.3}"): ("ppo", {"clip": 0.3}),
    ("cispo", "{}"): ("cispo", {}),
    ("cispo", "{'clip_low': 0.5}"): ("cispo", {"clip": 0.5}),
    ("gspo", "{}"): ("gspo", {}),
    ("dppo", "{}"): ("dppo", {}),
    ("dppo", "{'delta_low': 0.1, 'divergence': 'binary_kl'}"): ("dppo", {"delta_low": 0.1, "divergence": "binary_kl"}),
    ("dapo", "{'max_rounds': 0}"): ("dapo", {"max_rounds": 0}),
    ("dapo", "{'max_rounds': 0, 'dynamic_sampling': False}"): ("dapo", {"max_rounds": 0, "dynamic_sampling": False}),
    ("sapo", "{}"): ("sapo", {}),
    ("sapo", "{'tau_pos': 2.0}"): ("sapo", {"tau_pos": 2.0}),
    ("rloo", "{}"): ("rloo", {"loss": "importance_sampling"}),
    ("reinforce_pp", "{}"): ("reinforce_pp", {}),
    ("reinforce_pp", "{'kl_in': 'token', 'kl_coef': 0.1}"): ("reinforce_pp", {"kl_in": "token", "kl_coef": 0.1}),
    ("maxrl", "{}"): ("max_rl", {"loss": "importance_sampling"}),
    ("maxrl", "{'estimator': 'beat_the_best'}"): ("max_rl", {"loss": "importance_sampling",
                                                             "estimator": "beat_the_best"}),
    ("opd", "{}"): ("opd", SERVICE),
    ("opd", "{'kl_coef': 0.5}"): ("opd", {**SERVICE, "kl_coef": 0.5}),
    ("opsd", "{}"): ("opsd", {**SERVICE, "anchor": "initial"}),
    ("sdpo", "{}"): ("sdpo", {}),
}
SAMPLE_STD_FIX = ("grpo_len_norm", "dapo")  # bug (a): the population std, now the sample std


def close(got, want, where):
    assert len(got) == len(want), where
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(g, dtype=float), np.asarray(w, dtype=float), rtol=1e-9, atol=1e-12,
                                   err_msg=f"{where}[{i}]")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("name", "options"), METHOD_CASES, ids=[f"{n}{o}" for n, o in METHOD_CASES])
def test_method_matches_the_golden_table(name, options, seed):
    key = case_id("method", name, options, seed)
    want = GOLDEN[key]
    update = method(name, **{k: (grader if v == "grader" else v) for k, v in options.items()}).update(
        method_batch(seed))
    close(update.coefficients, want["coefficients"], f"{key} coefficients")
    close(update.advantages, want["advantages"], f"{key} advantages")
    assert (update.value_targets is None) == ("value_targets" not in want), key
    if update.value_targets is not None:
        close(update.value_targets, want["value_targets"], f"{key} value_targets")
    assert [bool(a) for a in update.admitted] == want["admitted"], key
    for stat, value in want["stats"].items():
        assert update.stats[stat] == pytest.approx(value, rel=1e-9, abs=1e-12), (key, stat)


def sample_std_factor(rows: list[dict[str, Any]], i: int, name: str) -> float:
    """(std_pop + 1e-6) / (std_sample + 1e-6) over the rows row i's group counted (DAPO: the untruncated ones)."""
    rewards = np.array([r["reward"] for r in rows if r["task_id"] == rows[i]["task_id"]
                        and not (name == "dapo" and r.get("truncated"))])
    return (rewards.std() + 1e-6) / (rewards.std(ddof=1) + 1e-6)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("name", "options"), SERVICE_CASES, ids=[f"{n}{o}" for n, o in SERVICE_CASES])
def test_service_algorithm_matches_the_golden_table(name, options, seed):
    from whileai.engine.losses import resolve_config

    key = case_id("service", name, options, seed)
    want = GOLDEN[key]
    new_name, new_options = SERVICE_METHODS[(name, str(options))]
    chosen = method(new_name, **new_options)
    rows = service_batch(seed)
    update = chosen.update(rows)
    spec = chosen.run_spec()
    assert spec.loss == want["loss"], key
    config = resolve_config(spec.loss, dict(spec.loss_config))
    assert config.keys() == want["loss_config"].keys(), key
    for k, v in want["loss_config"].items():
        assert config[k] == (pytest.approx(v, abs=1e-12) if isinstance(v, float) else v), (key, k)
    sent = {str(i): a for i, a in enumerate(update.advantages) if np.any(a != 0)}
    assert sorted(sent, key=int) == sorted(want["advantages"], key=int), key
    for i, recorded in want["advantages"].items():
        factor = sample_std_factor(rows, int(i), name) if name in SAMPLE_STD_FIX else 1.0
        np.testing.assert_allclose(sent[i], np.asarray(recorded) * factor, rtol=1e-9, atol=1e-12, err_msg=f"{key} row {i}")
