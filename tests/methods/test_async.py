"""Async: ipo / icepop / tis corrections by hand, against a per-token reference, and construction."""

from __future__ import annotations

import math

import numpy as np
import pytest

import whileai as wai
from whileai.errors import ConfigError
from whileai.methods.async_ import Async
from whileai.methods.critic import SAO
from whileai.methods.grouped import GRPO, RLOO
from whileai.simulations.reference import async_correction
from whileai.simulations.reference import grpo as slow_grpo

# one group of two, B = 2, one action token each (T = 1), so GRPO's w = 1/2 and
# A = +-0.5 / (sqrt(0.5) + 1e-6) = +-0.70710578
A = 0.5 / (math.sqrt(0.5) + 1e-6)


def two_rows(pi: tuple[float, float], mu: tuple[float, float]) -> list[dict]:
    return [{"reward": r, "task_id": "q", "logprobs": [math.log(p)], "behavior_logprobs": [math.log(m)]}
            for r, p, m in zip((1.0, 0.0), pi, mu)]


def test_ipo_masks_tokens_whose_probability_moved_more_than_the_threshold():
    """Row 0: pi 0.55, mu 0.5 -> |0.05| <= 0.3, kept: c = A rho / 2 = 0.70710578 * 1.1 / 2 = 0.38890818.
    Row 1: pi 0.9, mu 0.5 -> |0.4| > 0.3, masked. GRPO alone keeps it: rho = 1.8 with A < 0, the unclipped
    branch -1.8|A| is the min, c = -A * 1.8 / 2 = -0.6363952; ipo zeroes it."""
    rows = two_rows((0.55, 0.9), (0.5, 0.5))
    inner = GRPO().update(rows)
    np.testing.assert_allclose(np.concatenate(inner.coefficients), [A * 1.1 / 2, -A * 1.8 / 2], rtol=1e-12)
    update = Async("grpo", correction="ipo").update(rows)
    np.testing.assert_allclose(np.concatenate(update.coefficients), [A * 1.1 / 2, 0.0], rtol=1e-12)
    assert update.stats["correction_masked_share"] == 0.5
    assert str(update).splitlines()[0] == "async(grpo, ipo) update: 2 of 2 trajectories admitted"
    assert any("masked by ipo (largest move 0.4)" in n and "off_policy_steps" in n for n in update.notes)
    loose = Async("grpo", correction="ipo", threshold=0.45).update(rows)
    np.testing.assert_allclose(np.concatenate(loose.coefficients), np.concatenate(inner.coefficients))


def test_icepop_masks_a_ratio_outside_the_band_inclusive_ends():
    """RLOO on R = [1, 0]: A = +-1, w = 1/2.
    Row 0: pi 0.2, mu 0.5, rho = 0.4 with A > 0: PPO keeps it (0.4 < 1.2), c = 0.4 / 2 = 0.2;
    icepop's band [0.5, 5] masks it. Row 1: rho = exp(0) = 1 exactly, c = -1/2, kept; with the band
    (1.0, 5.0) it sits on the low edge and is still kept (the band is inclusive)."""
    rows = two_rows((0.2, 0.5), (0.5, 0.5))
    inner = RLOO().update(rows)
    np.testing.assert_allclose(np.concatenate(inner.coefficients), [0.2, -0.5], rtol=1e-12)
    update = Async(RLOO(), correction="icepop").update(rows)
    np.testing.assert_allclose(np.concatenate(update.coefficients), [0.0, -0.5], rtol=1e-12)
    edge = Async(RLOO(), correction="icepop", ratio=(1.0, 5.0)).update(rows)
    np.testing.assert_allclose(np.concatenate(edge.coefficients), [0.0, -0.5], rtol=1e-12)
    wide = Async(RLOO(), correction="icepop", ratio=(0.3, 5.0)).update(rows)
    np.testing.assert_allclose(np.concatenate(wide.coefficients), [0.2, -0.5], rtol=1e-12)
    assert any("1 action token in 1 trajectory (0) had a ratio outside [0.5, 5] and was masked by icepop" in n for n in update.notes)


def test_tis_caps_the_ratio_inside_c():
    """Row 1 has A < 0 and rho = 3: PPO keeps the unclipped branch, c = w rho A = -A * 3 / 2 = -1.06065867.
    tis: c * min(3, 2)/3 = -A * 2 / 2 = -0.70710578. Row 0 (rho = 1) is unchanged."""
    rows = two_rows((0.5, 0.9), (0.5, 0.3))
    inner = GRPO().update(rows)
    np.testing.assert_allclose(np.concatenate(inner.coefficients), [A / 2, -A * 3 / 2], rtol=1e-12)
    update = Async("grpo", correction="tis").update(rows)
    np.testing.assert_allclose(np.concatenate(update.coefficients), [A / 2, -A], rtol=1e-12)
    assert update.stats["correction_capped_share"] == 0.5
    assert any("capped at max_ratio 2 by tis (largest 3)" in n for n in update.notes)


def test_passes_through_admitted_advantages_and_value_targets():
    rows = [{"reward": 1.0, "logprobs": [-0.2, -1.0, -0.1], "behavior_logprobs": [-0.2, -3.0, -0.3],
             "action_mask": [True, False, True], "values": [0.4, 0.1, 0.6]}]
    inner = SAO().update(rows)
    update = Async(SAO(), correction="icepop").update(rows)
    assert update.value_targets is not None and inner.value_targets is not None
    np.testing.assert_array_equal(update.value_targets[0], inner.value_targets[0])
    np.testing.assert_array_equal(update.advantages[0], inner.advantages[0])
    np.testing.assert_array_equal(update.admitted, inner.admitted)
    assert update.coefficients[0][1] == 0.0  # the tool token stays 0 whatever its ratio


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("correction", ["ipo", "icepop", "tis"])
def test_matches_a_per_token_reference(seed, correction):
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(3):
        for _ in range(4):
            n = int(rng.integers(1, 7))
            behavior = np.log(rng.uniform(0.05, 0.95, n))
            rows.append({"reward": float(rng.integers(0, 2)), "task_id": g,
                         "logprobs": np.minimum(behavior + rng.normal(0, 1.0, n), 0).tolist(),
                         "behavior_logprobs": behavior.tolist(), "action_mask": (rng.random(n) < 0.8).tolist()})
            rows[-1]["action_mask"][0] = True
    method = Async(GRPO(clip=0.5), correction=correction)
    want = async_correction(rows, slow_grpo(rows, clip=0.5), correction)
    for got, expected in zip(method.update(rows).coefficients, want):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("correction", ["ipo", "icepop", "tis"])
def test_coefficients_are_minus_the_autograd_gradient(correction):
    """L = -sum_i w_i sum_t f_t min(rho A_i, clip(rho, 1 - eps, 1 + eps) A_i) over action tokens, with the
    correction's factor f_t held constant: 1[|pi - mu| <= 0.3], 1[0.5 <= rho <= 5] or min(rho, 2)/rho."""
    torch = pytest.importorskip("torch")
    rows = []
    rng = np.random.default_rng(7)
    for g in range(3):
        for _ in range(4):
            n = int(rng.integers(2, 7))
            behavior = np.log(rng.uniform(0.05, 0.95, n))
            rows.append({"reward": float(rng.integers(0, 2)), "task_id": g, "behavior_logprobs": behavior.tolist(),
                         "logprobs": np.minimum(behavior + rng.normal(0, 1.0, n), 0).tolist()})
    method = Async(GRPO(clip=0.5), correction=correction)
    update = method.update(rows)
    batch = wai.Batch.from_rows(rows)
    logpi = torch.tensor(batch.logprobs_N, requires_grad=True)
    behavior = torch.tensor(batch.behavior_logprobs_N)
    rho = torch.exp(logpi - behavior)
    with torch.no_grad():
        factor = {"ipo": (torch.exp(logpi) - torch.exp(behavior)).abs() <= 0.3,
                  "icepop": (rho >= 0.5) & (rho <= 5.0), "tis": torch.clamp(rho, max=2.0) / rho}[correction].double()
    adv = torch.tensor(np.concatenate(update.advantages))
    w = torch.tensor(batch.spread(1 / (batch.size * batch.action_tokens_B)))
    loss = -(factor * w * torch.minimum(rho * adv, torch.clamp(rho, 0.5, 1.5) * adv)).sum()
    loss.backward()
    # the correction acted: tis capped some ratio, ipo / icepop zeroed some token GRPO alone keeps
    if correction == "tis":
        assert bool((factor < 1).any())
    else:
        kept_by_grpo = np.count_nonzero(GRPO(clip=0.5).update(rows).coefficients_flat)
        assert 0 < np.count_nonzero(update.coefficients_flat) < kept_by_grpo
    np.testing.assert_allclose(update.coefficients_flat, -logpi.grad.numpy(), rtol=1e-10, atol=1e-15)


def test_construction_resolves_names_and_refuses_bad_input():
    by_name = wai.method("async", method="rloo", correction="icepop")
    assert isinstance(by_name.method, RLOO) and by_name.correction == "icepop"
    inner = GRPO(clip=0.3)
    assert Async(inner).method is inner and Async(inner).correction == "ipo"
    assert isinstance(Async("grpo").replace(method="sao").method, SAO)
    assert str(Async("rae")).startswith("Async(method=RAE(decay=0.95")
    assert set(Async.knobs()) == {"correction", "off_policy_steps", "threshold", "ratio", "max_ratio"}
    with pytest.raises(ConfigError, match="Async.method=None is invalid"):
        Async()
    with pytest.raises(ConfigError, match="unknown method 'gpro'; valid names: .*grpo"):
        Async("gpro")
    with pytest.raises(ConfigError, match="itself an Async"):
        Async(Async("grpo"))
    for kwargs, field, text in (({"correction": "clip"}, "correction", "'ipo', 'icepop', 'tis'"),
                                ({"threshold": 1.5}, "threshold", "(0.0, 1.0]"),
                                ({"ratio": (5.0, 0.5)}, "ratio", "low < high"),
                                ({"max_ratio": 0.5}, "max_ratio", "[1.0, inf)"),
                                ({"off_policy_steps": -1}, "off_policy_steps", "integer >= 0")):
        with pytest.raises(ValueError) as info:
            Async("grpo", **kwargs)
        assert f"Async.{field}=" in str(info.value) and text in str(info.value)


def test_async_delegates_its_run_spec_to_the_wrapped_method_explicitly():
    import copy

    import whileai as wai

    wrapped = wai.Async(wai.GRPO(rollouts_per_prompt=4, temperature=0.7), correction="tis", off_policy_steps=3)
    spec = wrapped.run_spec()
    assert (spec.rollouts_per_prompt, spec.temperature, spec.max_lag) == (4, 0.7, 3)
    with pytest.raises(AttributeError):  # no attribute forwarding: a loop reads run_spec(), never a name
        wrapped.rollouts_per_prompt  # noqa: B018
    assert wai.Async("sao", correction="ipo").run_spec().critic is not None
    assert wai.Async("grpo").run_spec().critic is None
    assert copy.deepcopy(wrapped) == wrapped


@pytest.mark.parametrize("correction", ["ipo", "icepop", "tis"])
def test_rows_without_behavior_logprobs_are_said_to_give_the_correction_nothing(correction):
    rows = [{"reward": r, "task_id": "a", "logprobs": [-0.5, -1.0]} for r in (0.0, 1.0)]
    update = Async(GRPO(), correction=correction).update(rows)
    assert any(f"no row carries behavior_logprobs, so every token counts as on-policy (rho = 1) and the "
               f"{correction} correction had nothing to act on" in n for n in update.notes)
    stale = [{**row, "behavior_logprobs": [-0.5, -1.0]} for row in rows]
    assert not any("no row carries behavior_logprobs" in n for n in Async(GRPO(), correction=correction).update(stale).notes)
