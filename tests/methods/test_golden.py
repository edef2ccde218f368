"""The golden table: every registry method and every service-page algorithm, on fixed random batches, gives
the coefficients, advantages, admitted rows and stats recorded before the fold (data/golden.json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.methods.data.record_golden import record_method, record_service
from tests.methods.golden_cases import METHOD_CASES, SEEDS, SERVICE_CASES, case_id

GOLDEN = json.loads((Path(__file__).parent / "data" / "golden.json").read_text(encoding="utf-8"))


def close(got, want, where):
    assert len(got) == len(want), where
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(g, dtype=float), np.asarray(w, dtype=float), rtol=1e-9, atol=1e-12,
                                   err_msg=f"{where}[{i}]")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("name", "options"), METHOD_CASES, ids=[f"{n}{o}" for n, o in METHOD_CASES])
def test_method_matches_the_golden_table(name, options, seed):
    key = case_id("method", name, options, seed)
    want, got = GOLDEN[key], record_method(name, options, seed)
    for part in ("coefficients", "advantages", "value_targets"):
        assert (part in got) == (part in want), key
        if part in want:
            close(got[part], want[part], f"{key} {part}")
    assert got["admitted"] == want["admitted"], key
    assert got["stats"].keys() == want["stats"].keys(), key
    close([got["stats"][k] for k in want["stats"]], list(want["stats"].values()), f"{key} stats")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("name", "options"), SERVICE_CASES, ids=[f"{n}{o}" for n, o in SERVICE_CASES])
def test_service_algorithm_matches_the_golden_table(name, options, seed):
    key = case_id("service", name, options, seed)
    want, got = GOLDEN[key], record_service(name, options, seed)
    assert (got["loss"], got["loss_config"]) == (want["loss"], want["loss_config"]), key
    assert got["advantages"].keys() == want["advantages"].keys(), key
    close([got["advantages"][k] for k in want["advantages"]], list(want["advantages"].values()), key)
