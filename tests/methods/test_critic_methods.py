"""SAO and BPCO: the length-adaptive GAE over action tokens, SAO's ratio band, BPCO's DPPO clip.

Each: a hand-worked example, invariants, a slow per-token reference over seeds, and c = -dL/dlogpi
for the loss written in torch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import whileai as wai
from whileai.errors import BatchError, ConfigError
from whileai.methods._ops import reverse_scan, scan_by_depth, scan_padded
from whileai.methods.critic import BPCO, SAO
from whileai.simulations.reference import bpco as slow_bpco
from whileai.simulations.reference import gae as slow_gae
from whileai.simulations.reference import sao as slow_sao


def random_rows(seed: int, rows: int = 6, drift: float = 0.5, max_len: int = 12) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        n = int(rng.integers(1, max_len + 1))
        behavior = np.log(rng.uniform(0.02, 0.98, n))
        logprobs = np.minimum(behavior + rng.normal(0.0, drift, n), 0.0)
        mask = rng.random(n) < 0.75
        mask[rng.integers(n)] = True
        out.append({"reward": float(rng.integers(0, 2)), "logprobs": logprobs.tolist(),
                    "behavior_logprobs": behavior.tolist(), "action_mask": mask.tolist(),
                    "values": rng.uniform(0.0, 1.0, n).tolist()})
    return out


def assert_rows_close(got_rows, want_rows):
    for got, want in zip(got_rows, want_rows, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13)


# --------------------------------------------------------------------- reprs
def test_reprs_match_the_lesson_with_one_spelling_for_rates():
    """As the lesson prints them, except BPCO's rates: the lesson spells them lr / critic_lr, SAO
    critic_learning_rate; one spelling everywhere is learning_rate / critic_learning_rate (docs/decisions.md)."""
    assert str(wai.SAO()) == ("SAO(ratio=(0.7, 6.0), gae_alpha=1.5, critic_steps=2, critic_warmup=10, "
                              "temperature=1.0, max_tokens=131072, critic_learning_rate=5e-06)")
    assert str(wai.BPCO()) == ("BPCO(clip=0.2, gae_alpha=0.4, reward_range=(0.0, 1.0), critic_warmup=15, "
                               "temperature=1.0, max_tokens=12000, learning_rate=1e-06, critic_learning_rate=1e-05)")
    assert type(wai.method("sao")) is SAO and type(wai.method("bpco")) is BPCO


# --------------------------------------------------------------------- hand-worked
def test_sao_hand_worked():
    """Two trajectories, N = 4 action tokens.

    trajectory 0: R = 1, tokens [act, act, obs, act], values [0.2, 0.4, 0.9, 0.5]; L = 3,
    lambda = 1 - 1/(1.5*3) = 7/9. Action values V = [0.2, 0.4, 0.5] (the 0.9 is skipped):
      delta = [0.4 - 0.2, 0.5 - 0.4, 1 + 0 - 0.5] = [0.2, 0.1, 0.5]
      A_3 = 0.5;  A_2 = 0.1 + 7/9 * 0.5 = 0.488889;  A_1 = 0.2 + 7/9 * 0.488889 = 0.580247
    token 1 has rho = 8 > 6, outside the band -> masked; the rest rho = 1 -> c = A/4:
      c_0 = [0.145062, 0, 0, 0.125]
    trajectory 1: R = 0, one token, V = 0.3, rho = 0.9: A = 0 - 0.3 = -0.3, c = 0.9 * -0.3 / 4 = -0.0675.
    """
    rows = [
        {"reward": 1.0, "logprobs": [-1.0, math.log(0.8), -0.3, -0.2],
         "behavior_logprobs": [-1.0, math.log(0.1), -0.3, -0.2],
         "action_mask": [True, True, False, True], "values": [0.2, 0.4, 0.9, 0.5]},
        {"reward": 0.0, "logprobs": [math.log(0.45)], "behavior_logprobs": [math.log(0.5)], "values": [0.3]},
    ]
    update = SAO().update(rows)
    a2 = 0.1 + 7 / 9 * 0.5
    a1 = 0.2 + 7 / 9 * a2
    np.testing.assert_allclose(update.advantages[0], [a1, a2, 0.0, 0.5], rtol=1e-12)
    np.testing.assert_allclose(update.coefficients[0], [a1 / 4, 0.0, 0.0, 0.125], rtol=1e-12)
    np.testing.assert_allclose(update.coefficients[0][0], 0.145062, rtol=1e-5)
    np.testing.assert_allclose(update.coefficients[1], [-0.0675], rtol=1e-12)
    np.testing.assert_allclose(update.value_targets[0], [1.0, 1.0, 1.0, 1.0])  # R, the MC return, everywhere
    np.testing.assert_allclose(update.value_targets[1], [0.0])
    assert update.stats["masked_token_share"] == 0.25
    report = str(update)
    assert report.splitlines()[0] == "sao update: 2 of 2 trajectories admitted"
    assert "ratio 8 at token 1 of trajectory 0, 1.33x above 6" in report and "widen ratio" in report
    # strictly inside: trajectory 1's token at rho = 0.25 / 0.5 = 0.5 exactly sits on the edge of the band
    # (0.5, 6.0) and so is masked (trajectory 0 keeps its rho = 1 tokens)
    rows[1]["logprobs"], rows[1]["behavior_logprobs"] = [math.log(0.25)], [math.log(0.5)]
    assert float(np.exp(rows[1]["logprobs"][0] - rows[1]["behavior_logprobs"][0])) == 0.5
    edge = SAO(ratio=(0.5, 6.0)).update(rows)
    assert not edge.coefficients[1].any() and edge.coefficients[0][0] != 0.0
    assert list(edge.admitted) == [True, False]
    assert any("1 trajectory (1) had every action token outside the band" in n for n in edge.notes)
    # so a band with 1 on its edge would mask every on-policy token: refused with the reason
    with pytest.raises(ConfigError, match="with low < 1 < high"):
        SAO(ratio=(1.0, 6.0))


def test_bpco_hand_worked():
    """Two trajectories, B = 2, clip 0.2, gae_alpha 0.4.

    trajectory 0: R = 1, three action tokens, values [0.5, 0.5, 0.5]; lambda = 1 - 1/(0.4*3) = 1/6:
      delta = [0, 0, 0.5];  A = [0.5/36, 0.5/6, 0.5] = [0.013889, 0.083333, 0.5]
      token 0: mu = 0.1, range 1 +/- 0.2/0.1 = [-1, 3], rho = 2.5 with A > 0: 2.5 < 3, unclipped
               -> c = 2.5 * 0.013889 / 2 = 0.017361 (a plain PPO clip at 1.2 would have zeroed it)
      token 1: mu = 0.6, range [0.6667, 1.3333], rho = 1.5 with A > 0 -> clipped -> 0
      token 2: rho = 1 -> c = 0.5 / 2 = 0.25
    trajectory 1: R = 0, one token, V = 0.25, on-policy: A = -0.25, c = -0.125.
    """
    rows = [
        {"reward": 1.0, "logprobs": [math.log(0.25), math.log(0.9), -0.7],
         "behavior_logprobs": [math.log(0.1), math.log(0.6), -0.7], "values": [0.5, 0.5, 0.5]},
        {"reward": 0.0, "logprobs": [-0.4], "values": [0.25]},
    ]
    update = BPCO().update(rows)
    np.testing.assert_allclose(update.advantages[0], [0.5 / 36, 0.5 / 6, 0.5], rtol=1e-12)
    np.testing.assert_allclose(update.coefficients[0], [2.5 * 0.5 / 36 / 2, 0.0, 0.25], rtol=1e-12)
    np.testing.assert_allclose(update.coefficients[0][0], 0.017361, rtol=1e-4)
    np.testing.assert_allclose(update.coefficients[1], [-0.125], rtol=1e-12)
    assert update.stats["clipped_token_share"] == 0.25
    assert any("ratio 1.5 at token 1 of trajectory 0" in n and "[0.667, 1.33]" in n for n in update.notes)


def test_bound_is_eq9_on_class_and_object():
    """V = R_min + (R_max - R_min)(1/2 + arctan(z)/pi): z = 0 -> the middle, z = 1 -> 3/4 of the range."""
    assert BPCO.bound(0.0) == 0.5 and BPCO.bound(1.0) == pytest.approx(0.75)
    values = BPCO(reward_range=(-2.0, 4.0)).bound(np.array([-1e12, -1.0, 0.0, 1.0, 1e12]))
    np.testing.assert_allclose(values, [-2.0, -0.5, 1.0, 2.5, 4.0], atol=1e-9)
    assert np.all(np.diff(values) > 0)


# --------------------------------------------------------------------- invariants
def test_lambda_carries_the_reward_to_the_first_token_with_weight_exp_minus_one_over_alpha():
    """values 0, R = 1: A_1 = lambda^(L-1) with lambda = 1 - 1/(alpha L) -> ~ exp(-1/alpha) for any long L."""
    for length in (200, 2000):
        rows = [{"reward": 1.0, "logprobs": [-0.5] * length, "values": [0.0] * length}]
        for method in (SAO(), BPCO(gae_alpha=1.5)):
            first = method.update(rows).advantages[0][0]
            lam = 1 - 1 / (1.5 * length)
            assert first == pytest.approx(lam ** (length - 1), rel=1e-9)
            assert first == pytest.approx(math.exp(-1 / 1.5), rel=1 / length)  # error ~ 1/(alpha L)


@pytest.mark.parametrize("method", [SAO(), BPCO()])
def test_observation_tokens_are_skipped_not_scored(method):
    """Inserting tool tokens (any value) changes nothing on the action tokens, and they carry exactly 0."""
    rows = [{**r, "action_mask": [True] * len(r["logprobs"])} for r in random_rows(4, drift=0.2)]
    plain = method.update(rows)
    rng = np.random.default_rng(0)
    with_tools, keep = [], []
    for row in rows:
        n = len(row["logprobs"])
        where = np.sort(rng.choice(n + 3, 3, replace=False))
        is_action = np.ones(n + 3, dtype=bool)
        is_action[where] = False
        new = {"reward": row["reward"], "action_mask": is_action.tolist()}
        for key in ("logprobs", "behavior_logprobs", "values"):
            values = np.empty(n + 3)
            values[is_action] = row[key]
            values[~is_action] = -rng.uniform(0, 3, 3) if "logprobs" in key else rng.uniform(0, 1, 3)
            new[key] = values.tolist()
        with_tools.append(new)
        keep.append(is_action)
    tooled = method.update(with_tools)
    for a, c, a_tools, c_tools, is_action in zip(plain.advantages, plain.coefficients, tooled.advantages,
                                                 tooled.coefficients, keep):
        np.testing.assert_allclose(a_tools[is_action], a, rtol=1e-12)
        assert np.all(c_tools[~is_action] == 0.0) and np.all(a_tools[~is_action] == 0.0)
        # B and N (action tokens only) are unchanged, so the action tokens' c are too
        np.testing.assert_allclose(c_tools[is_action], c, rtol=1e-12)


@pytest.mark.parametrize("method,normalizer", [(SAO(), "N"), (BPCO(), "B")])
def test_splitting_a_batch_only_rescales_by_the_normalizer(method, normalizer):
    """GAE is per trajectory, so a part's c = the whole's c * N/N_part (SAO) or B/B_part (BPCO)."""
    rows = random_rows(8, rows=7)
    whole = method.update(rows).coefficients
    size = (lambda part: sum(sum(r["action_mask"]) for r in part)) if normalizer == "N" else len
    parts = []
    for part in (rows[:3], rows[3:]):
        parts += [c * size(part) / size(rows) for c in method.update(part).coefficients]
    assert_rows_close(parts, whole)


def test_zero_advantage_gives_zero_coefficients():
    """A critic that predicts R exactly everywhere leaves delta = 0 at every token, so c = 0."""
    rows = random_rows(6)
    for row in rows:
        row["values"] = [row["reward"]] * len(row["logprobs"])
    for method in (SAO(), BPCO()):
        update = method.update(rows)
        assert not np.concatenate(update.coefficients).any()


@pytest.mark.parametrize("scan", [reverse_scan, scan_padded, scan_by_depth])
@pytest.mark.parametrize("seed", range(3))
def test_both_scan_layouts_match_a_per_token_loop(scan, seed):
    """Ragged, single-token, equal-length (16 and 37: whole and partial chunks) segments; decay 0 and 1."""
    rng = np.random.default_rng(seed)
    for lengths in (np.array([1, 5, 1, 3, 40]), rng.integers(1, 50, 9), np.full(4, 16), np.full(3, 37)):
        delta = rng.normal(size=int(lengths.sum()))
        decay = rng.uniform(0, 1, len(lengths))
        decay[0], decay[-1] = 0.0, 1.0
        out = scan(delta, lengths, decay)
        start = 0
        for length, lam in zip(lengths, decay):
            running = 0.0
            for k in reversed(range(length)):
                running = delta[start + k] + lam * running
                assert out[start + k] == pytest.approx(running, rel=1e-12, abs=1e-12)
            start += length


# --------------------------------------------------------------------- slow reference over seeds
@pytest.mark.parametrize("seed", range(6))
def test_sao_and_bpco_match_the_slow_reference(seed):
    rows = random_rows(seed, rows=8, drift=0.6)
    assert_rows_close(SAO().update(rows).coefficients, slow_sao(rows))
    assert_rows_close(SAO(ratio=(0.9, 1.2), gae_alpha=0.5).update(rows).coefficients,
                      slow_sao(rows, band=(0.9, 1.2), alpha=0.5))
    assert_rows_close(BPCO().update(rows).coefficients, slow_bpco(rows))
    assert_rows_close(BPCO(clip=0.05, gae_alpha=2.0).update(rows).coefficients, slow_bpco(rows, 0.05, 2.0))
    for got, row in zip(BPCO().update(rows).advantages, rows):
        np.testing.assert_allclose(got, slow_gae(row, 0.4), rtol=1e-9, atol=1e-13)


# --------------------------------------------------------------------- c = -dL/dlogpi
def test_sao_coefficients_are_minus_the_autograd_gradient():
    """L = -(1/N) sum over action tokens of 1[rho inside band] rho A (the band mask held constant)."""
    torch = pytest.importorskip("torch")
    rows = random_rows(31, rows=8, drift=0.8)
    batch = wai.Batch.from_rows(rows)
    update = SAO().update(rows)
    logpi = torch.tensor(batch.logprobs_N, requires_grad=True)
    rho = torch.exp(logpi - torch.tensor(batch.behavior_logprobs_N))
    inside = ((rho > 0.7) & (rho < 6.0)).detach() & torch.tensor(batch.action_mask_N)
    adv = torch.tensor(np.concatenate(update.advantages))
    loss = -(rho * adv)[inside].sum() / batch.action_mask_N.sum()
    loss.backward()
    assert 0 < int(inside.sum()) < int(batch.action_mask_N.sum())
    np.testing.assert_allclose(np.concatenate(update.coefficients), -logpi.grad.numpy(), rtol=1e-10, atol=1e-15)


def test_bpco_coefficients_are_minus_the_autograd_gradient():
    """L = -(1/B) sum over action tokens of min(rho A, clip(rho, 1 - eps/mu, 1 + eps/mu) A) (DPPO, Eq. 2)."""
    torch = pytest.importorskip("torch")
    rows = random_rows(32, rows=8, drift=0.8)
    batch = wai.Batch.from_rows(rows)
    update = BPCO().update(rows)
    logpi = torch.tensor(batch.logprobs_N, requires_grad=True)
    behavior = torch.tensor(batch.behavior_logprobs_N)
    rho = torch.exp(logpi - behavior)
    mu = torch.exp(behavior)
    adv = torch.tensor(np.concatenate(update.advantages))
    surrogate = torch.minimum(rho * adv, torch.clamp(rho, 1 - 0.2 / mu, 1 + 0.2 / mu) * adv)
    loss = -surrogate[torch.tensor(batch.action_mask_N)].sum() / batch.size
    loss.backward()
    assert 0 < update.stats["clipped_token_share"] < 1
    np.testing.assert_allclose(np.concatenate(update.coefficients), -logpi.grad.numpy(), rtol=1e-10, atol=1e-15)


# --------------------------------------------------------------------- errors
def test_rows_without_values_are_refused():
    rows = random_rows(1)
    for row in rows:
        del row["values"]
    for method in (SAO(), BPCO()):
        with pytest.raises(BatchError, match="row 0: field 'values' is missing.*" + method.name):
            method.update(rows)


def test_bpco_refuses_values_outside_reward_range_naming_row_and_token():
    rows = random_rows(2)
    rows[3]["values"][len(rows[3]["values"]) - 1] = 1.25
    with pytest.raises(BatchError, match=r"row 3: field 'values' is 1.25 at token \d+, outside BPCO's reward_range "
                                         r"\(0, 1\).*bound\(z\)"):
        BPCO().update(rows)
    BPCO(reward_range=(0.0, 2.0)).update(rows)  # inside a wider range: fine


@pytest.mark.parametrize("make,field,value,text", [
    (lambda: SAO(ratio=(6.0, 0.7)), "ratio", "(6.0, 0.7)", "low < high"),
    (lambda: SAO(gae_alpha=0.0), "gae_alpha", "0.0", "(0.0, inf)"),
    (lambda: SAO().replace(critic_steps=0), "critic_steps", "0", "integer >= 1"),
    (lambda: BPCO(clip=-0.2), "clip", "-0.2", "(0.0, inf)"),
    (lambda: BPCO(reward_range=(1.0, 1.0)), "reward_range", "(1.0, 1.0)", "low < high"),
    (lambda: BPCO().replace(critic_learning_rate=float("inf")), "critic_learning_rate", "inf", "finite"),
])
def test_bad_values_name_field_value_and_range(make, field, value, text):
    with pytest.raises(ValueError) as info:
        make()
    assert f".{field}={value} is invalid" in str(info.value) and text in str(info.value)


def test_rows_without_behavior_logprobs_are_said_to_give_the_ratio_nothing():
    rows = [{k: v for k, v in row.items() if k != "behavior_logprobs"} for row in random_rows(4)]
    assert any("the ratio band had nothing to act on" in n for n in SAO().update(rows).notes)
    bounded = [{**row, "values": np.clip(row["values"], 0.0, 1.0).tolist()} for row in rows]
    assert any("the DPPO clip had nothing to act on" in n for n in BPCO().update(bounded).notes)
    assert not any("no row carries behavior_logprobs" in n for n in SAO().update(random_rows(4)).notes)
