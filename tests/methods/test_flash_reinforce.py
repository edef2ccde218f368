"""FlashReinforce: the lesson's report, a hand-worked case, invariants, a slow reference, autograd."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

import whileai as wai
from whileai.methods.flash_reinforce import FlashReinforce, bernoulli_kl
from whileai.simulations.reference import flash_reinforce as slow_reference

from ._kit import random_rows

LESSON_BATCH = [
    {"reward": 1.0, "logprobs": [-0.4, -0.7, -0.2], "behavior_logprobs": [-0.41, -0.7, -0.21]},
    {"reward": 0.0, "logprobs": [-1.1, -0.3], "behavior_logprobs": [-1.0, -0.3]},
    {"reward": 1.0, "logprobs": [-0.2, -0.9, -0.6, -0.1], "behavior_logprobs": [-0.2, -0.9, -0.6, -0.1],
     "action_mask": [True, True, False, True]},
    {"reward": 0.0, "logprobs": [-3.0, -0.5], "behavior_logprobs": [-0.4, -0.5]},
]

LESSON_REPORT = """flash_reinforce update: 3 of 4 trajectories admitted
  batch mean reward: 0.5
  admitted share: 0.75
  mean sequence kl: 0.1746
  max sequence kl: 0.6969
  mean ratio: 0.9906
  1 trajectory (3) over trust 0.003 masked whole (max mean KL 0.697); the sampler drifted further than the gate \
allows: check behavior_logprobs are the sampler's own, then lower off_policy_steps or raise trust"""


def test_lesson_four_traces_print_exactly_the_report():
    update = wai.FlashReinforce().update(LESSON_BATCH)
    assert str(update) == LESSON_REPORT
    assert update.admitted.tolist() == [True, True, True, False]
    # trace 2's tool token carries nothing; trace 3 is out whole
    assert update.coefficients[2][2] == 0.0
    assert np.all(update.coefficients[3] == 0.0)


def test_repr_lists_every_field_with_the_lesson_defaults():
    assert repr(wai.FlashReinforce()) == "FlashReinforce(trust=0.003, off_policy_steps=8, temperature=1.0, max_tokens=8192)"


def test_hand_worked_example():
    """Two trajectories, trust 0.02.

    Row 0: R = 1, pi = (0.5, 0.5), mu = (0.4, 0.5). Row 1: R = 0, one token with pi = mu.
    B = 2, mean R = 0.5, so A_0 = +0.5 and A_1 = -0.5.
    d_0,0 = 0.4 ln(0.4/0.5) + 0.6 ln(0.6/0.5) = -0.0892574 + 0.1093929 = 0.0201355; d_0,1 = 0;
    D_0 = 0.0100678 <= 0.02, so row 0 is admitted; D_1 = 0.
    rho_0 = (0.5/0.4, 1) = (1.25, 1); c_0 = 0.5 * rho / (T=2 * B=2) = (0.15625, 0.125).
    c_1 = -0.5 * 1 / (1 * 2) = -0.25.
    """
    rows = [
        {"reward": 1.0, "logprobs": [math.log(0.5)] * 2, "behavior_logprobs": [math.log(0.4), math.log(0.5)]},
        {"reward": 0.0, "logprobs": [-1.0], "behavior_logprobs": [-1.0]},
    ]
    update = FlashReinforce(trust=0.02).update(rows)
    np.testing.assert_allclose(update.coefficients[0], [0.15625, 0.125], rtol=1e-12)
    np.testing.assert_allclose(update.coefficients[1], [-0.25], rtol=1e-12)
    assert update.stats["mean_sequence_kl"] == pytest.approx(0.0100678 / 2, rel=1e-5)
    # at the default trust 0.003 the same row 0 is over the gate and dropped whole
    dropped = FlashReinforce().update(rows)
    assert dropped.admitted.tolist() == [False, True]
    np.testing.assert_array_equal(dropped.coefficients[0], [0.0, 0.0])


@pytest.mark.parametrize("seed", range(6))
def test_matches_slow_reference(seed):
    rows = random_rows(seed, n=10, drift=0.05)
    trust = [0.0005, 0.003, 0.01][seed % 3]
    update = FlashReinforce(trust=trust).update(rows)
    for got, want in zip(update.coefficients, slow_reference(rows, trust)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("seed", range(4))
def test_coefficients_are_minus_the_gradient_of_eq9(seed):
    """L = -(1/B) sum_i m_i A_i (1/T_i) sum_t mask * rho_i,t, rho = exp(lp - blp), with A and m constants."""
    rows = random_rows(seed, n=9, drift=0.02)
    update = FlashReinforce(trust=0.002).update(rows)
    B = len(rows)
    rewards = torch.tensor([r["reward"] for r in rows], dtype=torch.float64)
    advantages = rewards - rewards.mean()
    loss = torch.zeros((), dtype=torch.float64)
    leaves = []
    for i, row in enumerate(rows):
        lp = torch.tensor(row["logprobs"], dtype=torch.float64, requires_grad=True)
        blp = torch.tensor(row["behavior_logprobs"], dtype=torch.float64)
        mask = torch.tensor(row["action_mask"], dtype=torch.float64)
        m = float(update.admitted[i])  # m is held fixed (detached) in Eq. 9's gradient
        loss = loss - m * advantages[i] / (mask.sum() * B) * (mask * torch.exp(lp - blp)).sum()
        leaves.append(lp)
    loss.backward()
    for c, lp in zip(update.coefficients, leaves):
        np.testing.assert_allclose(c, -lp.grad.numpy(), rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("seed", range(3))
def test_invariants(seed):
    rows = random_rows(seed, n=12)
    update = FlashReinforce(trust=0.05).update(rows)
    for row, c, a in zip(rows, update.coefficients, update.advantages):
        tool = ~np.asarray(row["action_mask"])
        assert np.all(c[tool] == 0.0) and np.all(a[tool] == 0.0)
    for i in np.flatnonzero(~update.admitted):
        assert np.all(update.coefficients[i] == 0.0)
    # equal rewards: every advantage is zero, so is every coefficient, and a note says why
    flat = [{**r, "reward": 1.0} for r in rows]
    empty = FlashReinforce(trust=0.05).update(flat)
    assert all(np.all(c == 0.0) for c in empty.coefficients)
    assert any("every advantage is 0" in note for note in empty.notes)
    # the sign of a coefficient is the sign of its advantage (rho > 0)
    for c, a in zip(update.coefficients, update.advantages):
        assert np.all(np.sign(c) * np.sign(a) >= 0)


def test_never_mutates_input_rows():
    rows = random_rows(0, n=6)
    before = copy.deepcopy(rows)
    FlashReinforce().update(rows)
    assert rows == before


def test_bernoulli_kl_is_finite_at_certainty():
    kl = bernoulli_kl(np.array([-1e-9, -0.5]), np.array([0.0, -0.5]))
    assert np.all(np.isfinite(kl)) and kl[1] == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("field, value, phrase", [
    ("trust", 0.0, "trust=0.0"),
    ("trust", -1.0, "trust=-1.0"),
    ("trust", float("nan"), "trust=nan"),
    ("off_policy_steps", 1.5, "off_policy_steps=1.5"),
    ("off_policy_steps", -1, "an integer >= 0"),
    ("max_tokens", 0, "max_tokens=0"),
    ("temperature", "hot", "temperature='hot'"),
])
def test_bad_values_name_the_field_value_and_range(field, value, phrase):
    with pytest.raises(ValueError, match="FlashReinforce") as err:
        FlashReinforce(**{field: value})
    assert phrase in str(err.value) and "must be" in str(err.value)
    with pytest.raises(wai.ConfigError, match=field):
        FlashReinforce().replace(**{field: value})


def test_replace_refuses_an_unknown_field_and_lists_the_fields():
    with pytest.raises(wai.ConfigError, match="trust, off_policy_steps, temperature, max_tokens"):
        FlashReinforce().replace(trsut=0.1)


def test_every_bad_field_is_reported_at_once():
    with pytest.raises(wai.ConfigError) as err:
        FlashReinforce(trust=-1.0, max_tokens=0)
    assert "trust=-1.0" in str(err.value) and "max_tokens=0" in str(err.value)


def test_by_name():
    assert wai.method("flash_reinforce", trust=0.01) == FlashReinforce(trust=0.01)
    with pytest.raises(wai.ConfigError, match="valid names: .*flash_reinforce"):
        wai.method("flash_reinfroce")


def test_rows_without_behavior_logprobs_are_said_to_give_the_gate_nothing_to_measure():
    """No behavior_logprobs: drift 0 and admitted share 1 are assumed, not measured, and the report says so;
    a batch where only some rows lack them names those rows."""
    rows = random_rows(2, n=4)
    plain = [{k: v for k, v in row.items() if k != "behavior_logprobs"} for row in rows]
    update = FlashReinforce().update(plain)
    assert update.stats["mean_sequence_kl"] == 0.0 and update.stats["admitted_share"] == 1.0
    assert any(n.startswith("no row carries behavior_logprobs, so every token counts as on-policy (rho = 1) and "
                            "the trust gate (it measured no drift and admitted them) had nothing to act on")
               for n in update.notes)
    mixed = FlashReinforce().update([rows[0], plain[1], rows[2], plain[3]])
    assert any(n.startswith("2 of 4 trajectories (1, 3) carry no behavior_logprobs") for n in mixed.notes)
    assert not any("behavior_logprobs" in n and "carry no" in n for n in FlashReinforce().update(rows).notes)
