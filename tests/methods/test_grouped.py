"""GRPO (grpo/bnpo/dr_grpo weights, truncation, k3 KL), DrGRPO, RLOO, MaxRL and RAE.

Each: a hand-worked example, invariants, a slow per-token reference over seeds, and c = -dL/dlogpi
for the clipped surrogate written in torch.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

import whileai as wai
from whileai.errors import BatchError, ConfigError
from whileai.methods.grouped import GRPO, RAE, RLOO, DrGRPO, MaxRL
from whileai.simulations.reference import action_tokens
from whileai.simulations.reference import grpo as slow_grpo
from whileai.simulations.reference import max_rl as slow_max_rl
from whileai.simulations.reference import rae as slow_rae
from whileai.simulations.reference import rloo as slow_rloo

GROUPED = ("grpo", "dr_grpo", "rloo", "max_rl")


def random_rows(seed: int, groups: int = 4, per_group: int = 4, drift: float = 0.3, truncated: float = 0.0,
                binary: bool = False, ref: bool = False) -> list[dict]:
    """Groups of rollouts with ragged lengths, tool tokens, drift between sampler and policy."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(groups):
        for _ in range(per_group):
            n = int(rng.integers(1, 9))
            behavior = np.log(rng.uniform(0.05, 0.95, n))
            logprobs = np.minimum(behavior + rng.normal(0.0, drift, n), 0.0)
            mask = rng.random(n) < 0.8
            mask[rng.integers(n)] = True
            reward = float(rng.integers(0, 2)) if binary else float(np.round(rng.uniform(0, 1), 2))
            row = {"reward": reward, "logprobs": logprobs.tolist(), "behavior_logprobs": behavior.tolist(),
                   "action_mask": mask.tolist(), "task_id": f"t{g}", "truncated": bool(rng.random() < truncated)}
            if ref:
                row["ref_logprobs"] = np.minimum(behavior + rng.normal(0.0, 0.2, n), 0.0).tolist()
            rows.append(row)
    return rows


def assert_rows_close(update, expected, atol=1e-12):
    assert len(update.coefficients) == len(expected)
    for got, want in zip(update.coefficients, expected):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=atol)


# --------------------------------------------------------------------- hand-worked
HAND_ROWS = [
    # group "a": R = 1 and 0. mean 0.5, sample std sqrt((0.25 + 0.25) / 1) = 0.70710678
    # A = +-0.5 / (0.70710678 + 1e-6) = +-0.70710578
    {"reward": 1.0, "task_id": "a", "logprobs": [math.log(0.6), math.log(0.5)],
     "behavior_logprobs": [math.log(0.4), math.log(0.5)]},  # rho = 1.5, 1
    {"reward": 0.0, "task_id": "a", "logprobs": [math.log(0.2), math.log(0.6), math.log(0.3), math.log(0.9)],
     "behavior_logprobs": [math.log(0.4), math.log(0.4), math.log(0.3), math.log(0.9)],  # rho = 0.5, 1.5, 1, 1
     "action_mask": [True, True, False, True]},  # T = 3 action tokens
]
A = 0.5 / (math.sqrt(0.5) + 1e-6)


def test_grpo_hand_worked():
    """B = 2; row 0 has T = 2, row 1 has T = 3 (one tool token); loss_type grpo: w_i = 1/(B T_i).

    row 0, A = +0.70710578, w = 1/4: token 0 rho 1.5 > 1.2 with A > 0, the clipped branch 1.2 A is the
    min -> 0; token 1 rho 1 -> w A = 0.17677645.
    row 1, A = -0.70710578, w = 1/6: token 0 rho 0.5 < 0.8 with A < 0, the clipped branch -0.8|A| is
    the min -> 0; token 1 rho 1.5 with A < 0: rho A = -1.0607 < 1.2 A = -0.8485, unclipped is the min
    -> w rho A = -0.17677645; token 2 is a tool token -> 0; token 3 rho 1 -> w A = -0.11785096.
    """
    update = GRPO().update(HAND_ROWS)
    np.testing.assert_allclose(update.coefficients[0], [0.0, A / 4], rtol=1e-12)
    np.testing.assert_allclose(update.coefficients[1], [0.0, -1.5 * A / 6, 0.0, -A / 6], rtol=1e-12)
    np.testing.assert_allclose(update.coefficients[0][1], 0.17677645, rtol=1e-7)
    np.testing.assert_allclose(update.advantages[1], [-A, -A, 0.0, -A])
    assert update.stats["clipped_token_share"] == pytest.approx(2 / 5)
    assert str(update).splitlines()[0] == "grpo update: 2 of 2 trajectories admitted"
    assert any("2 action tokens in 2 trajectories (0, 1) sat past the clip band [0.8, 1.2]" in n for n in update.notes)


def test_bnpo_and_dr_grpo_hand_worked():
    """bnpo: w = 1/N = 1/5 for every row. dr_grpo (max_tokens = 10): A = +-0.5 (no std), w = 1/(2*10)."""
    bnpo = GRPO(loss_type="bnpo").update(HAND_ROWS)
    np.testing.assert_allclose(bnpo.coefficients[0], [0.0, A / 5], rtol=1e-12)
    np.testing.assert_allclose(bnpo.coefficients[1], [0.0, -1.5 * A / 5, 0.0, -A / 5], rtol=1e-12)
    dr = DrGRPO(max_tokens=10).update(HAND_ROWS)
    np.testing.assert_allclose(dr.coefficients[0], [0.0, 0.5 / 20], rtol=1e-12)
    np.testing.assert_allclose(dr.coefficients[1], [0.0, -1.5 * 0.5 / 20, 0.0, -0.5 / 20], rtol=1e-12)
    same = GRPO(loss_type="dr_grpo", max_tokens=10).update(HAND_ROWS)
    assert_rows_close(same, dr.coefficients)
    assert wai.method("dr_grpo").loss_type == "dr_grpo"


def test_bnpo_under_mask_counts_only_the_tokens_that_can_carry_gradient():
    """HAND_ROWS plus a truncated row of 3 action tokens in group "a" (masked: c = 0, left out of the
    group's statistics). N counts the 5 action tokens of the two admitted rows, not 8, as TRL and verl
    count it: row 0 token 1 gets A/5 = 0.14142116 (A/8 if the masked row's tokens were counted)."""
    cut = {"reward": 1.0, "task_id": "a", "truncated": True, "logprobs": [-0.1, -0.2, -0.3]}
    update = GRPO(loss_type="bnpo").update([*HAND_ROWS, cut])
    np.testing.assert_allclose(update.coefficients[0], [0.0, A / 5], rtol=1e-12)
    np.testing.assert_allclose(update.coefficients[1], [0.0, -1.5 * A / 5, 0.0, -A / 5], rtol=1e-12)
    assert not update.coefficients[2].any()
    # masking a row is the same as dropping it, for bnpo exactly (N and the groups are the same)
    assert_rows_close(update, [*GRPO(loss_type="bnpo").update(HAND_ROWS).coefficients, np.zeros(3)])


def test_clip_high_and_dual_clip_hand_worked():
    """HAND_ROWS with clip_high = 0.6 (band [0.8, 1.6]) and dual_clip = 1.4.

    row 0 (A > 0) token 0: rho 1.5 <= 1.6, so the upper end no longer binds: c = w rho A = 1.5 A / 4.
    row 1 (A < 0) token 1: rho 1.5 > dual_clip 1.4, its loss is the constant -1.4 A: c = 0 (it was
    -1.5 A / 6 without the dual clip); token 0 (rho 0.5 < 0.8) stays clipped; token 3 rho 1: -A / 6.
    """
    update = GRPO(clip_high=0.6, dual_clip=1.4).update(HAND_ROWS)
    np.testing.assert_allclose(update.coefficients[0], [1.5 * A / 4, A / 4], rtol=1e-12)
    np.testing.assert_allclose(update.coefficients[1], [0.0, 0.0, 0.0, -A / 6], rtol=1e-12)
    assert update.stats["clipped_token_share"] == pytest.approx(2 / 5)
    assert any("1 action token in 1 trajectory (1) sat past the clip band [0.8, 1.6]" in n for n in update.notes)
    assert any("1 action token with a negative advantage in 1 trajectory (1) had a ratio above dual_clip=1.4 "
               "(largest 1.5)" in n for n in update.notes)
    # the defaults are the symmetric band without dual clip: exactly the plain GRPO coefficients
    assert_rows_close(GRPO(clip_high=None, dual_clip=None).update(HAND_ROWS), GRPO().update(HAND_ROWS).coefficients)
    assert_rows_close(GRPO(clip_high=0.2).update(HAND_ROWS), GRPO().update(HAND_ROWS).coefficients)


def test_k3_kl_term_hand_worked():
    """beta = 0.5, one on-policy row in a unanimous group (A = 0): c = -beta w (1 - exp(ref - logpi)).

    T = 2, B = 1, w = 1/2. token 0: ref = log 0.4, logpi = log 0.5 -> 1 - 0.8 = 0.2 -> c = -0.05;
    token 1: ref = log 0.5, logpi = log 0.25 -> 1 - 2 = -1 -> c = +0.25 (pulled back up toward the ref).
    """
    row = {"reward": 1.0, "task_id": "a", "logprobs": [math.log(0.5), math.log(0.25)],
           "ref_logprobs": [math.log(0.4), math.log(0.5)]}
    update = GRPO(beta=0.5).update([row])
    np.testing.assert_allclose(update.coefficients[0], [-0.05, 0.25], rtol=1e-12)
    k3 = [0.8 - math.log(0.8) - 1, 2 - math.log(2) - 1]
    assert update.stats["mean_kl"] == pytest.approx(sum(k3) / 2)
    with pytest.raises(BatchError, match="ref_logprobs"):
        GRPO(beta=0.5).update([{k: v for k, v in row.items() if k != "ref_logprobs"}])


def test_rloo_max_rl_rae_hand_worked():
    """One group R = [1, 0, 0, 1] (4 rows, one token each, on-policy, B = 4, w = 1/4).

    RLOO: A_0 = 1 - (0 + 0 + 1)/3 = 2/3, A_1 = 0 - 2/3 = -2/3 -> c = [1/6, -1/6, -1/6, 1/6].
    MaxRL: mean 0.5, A = (1 - 0.5)/0.5 = 1 or -1 -> c = [0.25, -0.25, -0.25, 0.25].
    RAE (decay 0.5, b = 0): A_0 = 1, b = 0.5; A_1 = -0.5, b = 0.25; A_2 = -0.25, b = 0.125;
    A_3 = 0.875, b = 0.5625 -> c = A/4.
    """
    rows = [{"reward": r, "task_id": "q", "logprobs": [-0.5]} for r in (1.0, 0.0, 0.0, 1.0)]
    rloo = RLOO().update(rows)
    np.testing.assert_allclose(np.concatenate(rloo.coefficients), [1 / 6, -1 / 6, -1 / 6, 1 / 6], rtol=1e-12)
    max_rl = MaxRL().update(rows)
    np.testing.assert_allclose(np.concatenate(max_rl.coefficients), [0.25, -0.25, -0.25, 0.25], rtol=1e-12)
    rae = RAE(decay=0.5)
    update = rae.update(rows)
    np.testing.assert_allclose(np.concatenate(update.coefficients), np.array([1, -0.5, -0.25, 0.875]) / 4)
    assert rae.baselines == {None: pytest.approx(0.5625)}


# --------------------------------------------------------------------- invariants
@pytest.mark.parametrize("name", GROUPED)
def test_unanimous_groups_and_groups_of_one_give_zero(name):
    rows = random_rows(3, drift=0.5)
    for row in rows:
        row["reward"] = 0.3 if row["task_id"] in ("t0", "t2") else row["reward"]
    update = wai.method(name).update(rows)
    for row, c in zip(rows, update.coefficients):
        if row["task_id"] in ("t0", "t2"):
            assert not c.any()
    singles = [{**row, "task_id": i} for i, row in enumerate(rows)]
    alone = wai.method(name).update(singles)
    assert not np.concatenate(alone.coefficients).any()
    assert any(all(m in n for m in ("FlashReinforce", "SAO", "BPCO", "RAE")) for n in alone.notes)


@pytest.mark.parametrize("name", (*GROUPED, "rae"))
def test_tool_tokens_get_exactly_zero(name):
    rows = random_rows(5, drift=0.4)
    assert any(not all(r["action_mask"]) for r in rows)
    update = wai.method(name).update(rows)
    for row, c, a in zip(rows, update.coefficients, update.advantages):
        off = ~np.asarray(row["action_mask"])
        assert np.all(c[off] == 0.0) and np.all(a[off] == 0.0)
        assert len(c) == len(row["logprobs"])


@pytest.mark.parametrize("name,normalizer", [("grpo", "B"), ("dr_grpo", "B"), ("rloo", "B"), ("max_rl", "B"),
                                             ("bnpo", "N")])
def test_splitting_along_groups_only_rescales_by_the_normalizer(name, normalizer):
    """Advantages depend on the group only; c for a part = c for the whole * (B/B_part) or (N/N_part)."""
    rows = random_rows(11, groups=4, drift=0.3)
    method = GRPO(loss_type="bnpo") if name == "bnpo" else wai.method(name)
    whole = method.update(rows)
    first, second = rows[:8], rows[8:]  # groups t0, t1 | t2, t3
    size = (lambda part: len(part)) if normalizer == "B" else (lambda part: sum(action_tokens(r) for r in part))
    parts = []
    for part in (first, second):
        scale = size(part) / size(rows)
        parts += [c * scale for c in method.update(part).coefficients]
    assert_rows_close(whole, parts, atol=1e-15)


def test_truncated_mask_equals_dropping_the_row_and_zero_equals_reward_zero():
    rows = random_rows(7, truncated=0.3)
    assert any(r["truncated"] for r in rows)
    masked = GRPO().update(rows)
    kept = [r for r in rows if not r["truncated"]]
    alone = GRPO().update(kept)
    kept_c = iter(alone.coefficients)
    for row, c, ok in zip(rows, masked.coefficients, masked.admitted):
        assert ok == (not row["truncated"])
        if row["truncated"]:
            assert not c.any()
        else:  # same advantage; w_i = 1/(B T_i) with B counting every row of the batch
            np.testing.assert_allclose(c, next(kept_c) * len(kept) / len(rows), rtol=1e-12, atol=1e-15)
    assert any("truncated='zero'" in n for n in masked.notes)
    zeroed = [{**r, "reward": 0.0 if r["truncated"] else r["reward"], "truncated": False} for r in rows]
    assert_rows_close(GRPO(truncated="zero").update(rows), GRPO().update(zeroed).coefficients)


def test_rae_two_consecutive_updates_equal_one_and_state_saves():
    rows = random_rows(9, groups=3, per_group=4)
    for i, row in enumerate(rows):
        row["agent"] = ("solver", "critic")[i % 2]
    whole = RAE()
    one = whole.update(rows)
    split = RAE()
    first, second = split.update(rows[:5]), split.update(rows[5:])
    np.testing.assert_allclose(np.concatenate(one.advantages),
                               np.concatenate(first.advantages + second.advantages), rtol=1e-12)
    assert split.baselines == pytest.approx(whole.baselines)
    saved = json.loads(json.dumps(split.state_dict()))
    restored = RAE()
    restored.load_state_dict(saved)
    more = random_rows(10, groups=2, per_group=3)
    for i, row in enumerate(more):
        row["agent"] = ("solver", "critic")[i % 2]
    assert_rows_close(restored.update(more), split.update(more).coefficients)
    assert RAE().replace(decay=0.9).baselines == {}
    with pytest.raises(ConfigError, match="agent 'solver'.*finite"):
        RAE().load_state_dict({"baselines": {"solver": float("nan")}})


def test_rae_refuses_a_batch_mixing_rows_with_and_without_agent():
    rows = random_rows(2, groups=1, per_group=3)
    rows[0]["agent"] = "solver"
    with pytest.raises(BatchError, match="row 1: field 'agent' is missing"):
        RAE().update(rows)
    rows[1]["agent"], rows[2]["agent"] = "solver", {"not": "hashable"}
    with pytest.raises(BatchError, match="row 2: field 'agent'"):
        RAE().update(rows)


# --------------------------------------------------------------------- slow reference over seeds
@pytest.mark.parametrize("seed", range(5))
def test_grpo_matches_the_slow_reference(seed):
    rows = random_rows(seed, truncated=0.2, binary=seed % 2 == 0, ref=True, drift=0.4)
    for kwargs in ({}, {"loss_type": "bnpo"}, {"loss_type": "dr_grpo", "max_tokens": 16}, {"truncated": "zero"},
                   {"beta": 0.04, "clip": 0.3}, {"clip_high": 0.28, "dual_clip": 1.3},
                   {"loss_type": "bnpo", "clip": 0.1, "clip_high": 0.5, "dual_clip": 1.1}):
        assert_rows_close(GRPO(**kwargs).update(rows), slow_grpo(rows, **kwargs))


@pytest.mark.parametrize("seed", range(5))
def test_rloo_max_rl_rae_match_the_slow_reference(seed):
    rows = random_rows(seed, binary=seed % 2 == 1, drift=0.4)
    assert_rows_close(RLOO().update(rows), slow_rloo(rows))
    assert_rows_close(MaxRL(clip=0.1).update(rows), slow_max_rl(rows, clip=0.1))
    assert_rows_close(RLOO(clip_high=0.3, dual_clip=1.2).update(rows), slow_rloo(rows, clip_high=0.3, dual_clip=1.2))
    assert_rows_close(MaxRL(clip_high=0.4, dual_clip=1.3).update(rows),
                      slow_max_rl(rows, clip_high=0.4, dual_clip=1.3))
    assert_rows_close(RAE(clip_high=0.3, dual_clip=1.2).update(rows), slow_rae(rows, clip_high=0.3, dual_clip=1.2))
    for i, row in enumerate(rows):
        row["agent"] = i % 3
    rae = RAE(decay=0.8)
    assert_rows_close(rae.update(rows), slow_rae(rows, decay=0.8))
    previous = rae.baselines
    assert_rows_close(rae.update(rows), slow_rae(rows, decay=0.8, baselines=previous))


# --------------------------------------------------------------------- c = -dL/dlogpi
@pytest.mark.parametrize("name", ("grpo", "bnpo", "dr_grpo", "rloo", "max_rl", "rae", "grpo_kl", "reinforce_ada"))
def test_coefficients_are_minus_the_autograd_gradient(name):
    """L = -sum_i w_i sum_t min(rho A_i, clip(rho, 1-eps, 1+eps) A_i) + beta sum_i w_i sum_t k3, over
    admitted action tokens, rho = exp(logpi - logmu), k3 = exp(ref - logpi) - (ref - logpi) - 1."""
    torch = pytest.importorskip("torch")
    rows = random_rows(21, truncated=0.2, ref=True, drift=0.4)
    method = {"bnpo": GRPO(loss_type="bnpo"), "dr_grpo": DrGRPO(max_tokens=12), "grpo_kl": GRPO(beta=0.1),
              "reinforce_ada": wai.ReinforceAda(group_size=2, pass_reward=0.5)}.get(name) or wai.method(name)
    update = method.update(rows)
    batch = wai.Batch.from_rows(rows)
    tokens = batch.action_tokens_B.astype(float)
    # bnpo's N: action tokens of the admitted rows (the truncated rows are masked)
    weight = {"bnpo": np.full(batch.size, 1 / tokens[update.admitted].sum()), "dr_grpo": np.full(batch.size, 1 / (batch.size * 12)),
              # ReinforceAda: w_i = 1/(B_kept T_i) over the rows it keeps (admitted)
              "reinforce_ada": 1 / (update.admitted.sum() * tokens)}.get(name, 1 / (batch.size * tokens))
    live = torch.tensor(batch.action_mask_N & batch.spread(update.admitted))
    logpi = torch.tensor(batch.logprobs_N, requires_grad=True)
    rho = torch.exp(logpi - torch.tensor(batch.behavior_logprobs_N))
    adv = torch.tensor(np.concatenate(update.advantages))
    w = torch.tensor(batch.spread(weight))
    eps = method.clip
    surrogate = torch.minimum(rho * adv, torch.clamp(rho, 1 - eps, 1 + eps) * adv)
    loss = -(w * surrogate)[live].sum()
    if name == "grpo_kl":
        log_ratio = torch.tensor(batch.token_fields["ref_logprobs"]) - logpi
        loss = loss + 0.1 * (w * (torch.exp(log_ratio) - log_ratio - 1))[live].sum()
    loss.backward()
    assert np.count_nonzero(update.coefficients_flat) > 10
    np.testing.assert_allclose(np.concatenate(update.coefficients), -logpi.grad.numpy(), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name", ("grpo", "bnpo", "rloo", "max_rl", "rae", "reinforce_ada"))
def test_asymmetric_and_dual_clip_are_minus_the_autograd_gradient_of_verls_loss(name):
    """verl's vanilla policy loss (core_algos compute_policy_loss_vanilla) written as verl writes it:
    loss1 = max(-A rho, -A clip(rho, 1 - low, 1 + high)); for A < 0, min(-A c_dual, loss1); summed with w_i
    over admitted action tokens. Here low 0.2, high 0.28 (DAPO), c_dual 1.3 (low enough to bind at drift 0.6)."""
    torch = pytest.importorskip("torch")
    rows = random_rows(33, truncated=0.2, drift=0.6)
    if name == "rae":  # RAE's baselines start at 0: centre the rewards so some advantages are negative
        rows = [{**row, "reward": row["reward"] - 0.5} for row in rows]
    knobs = {"clip": 0.2, "clip_high": 0.28, "dual_clip": 1.3}
    method = {"bnpo": GRPO(loss_type="bnpo", **knobs),
              "reinforce_ada": wai.ReinforceAda(group_size=2, pass_reward=0.5, **knobs)}.get(name) \
        or wai.method(name, **knobs)
    update = method.update(rows)
    batch = wai.Batch.from_rows(rows)
    tokens = batch.action_tokens_B.astype(float)
    weight = {"bnpo": np.full(batch.size, 1 / tokens[update.admitted].sum()),
              "reinforce_ada": 1 / (update.admitted.sum() * tokens)}.get(name, 1 / (batch.size * tokens))
    live = torch.tensor(batch.action_mask_N & batch.spread(update.admitted))
    logpi = torch.tensor(batch.logprobs_N, requires_grad=True)
    ratio = torch.exp(logpi - torch.tensor(batch.behavior_logprobs_N))
    adv = torch.tensor(np.concatenate(update.advantages))
    pg_losses1 = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1 - 0.2, 1 + 0.28)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    clip_pg_losses2 = torch.minimum(-adv * 1.3, clip_pg_losses1)
    pg_losses = torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)
    loss = (torch.tensor(batch.spread(weight)) * pg_losses)[live].sum()
    loss.backward()
    c = np.concatenate(update.coefficients)
    np.testing.assert_allclose(c, -logpi.grad.numpy(), rtol=1e-10, atol=1e-14)
    # both ends did something: the dual clip zeroed tokens the symmetric surrogate keeps, and the higher
    # upper end kept tokens it clips
    symmetric = np.concatenate(method.replace(clip_high=None, dual_clip=None).update(rows).coefficients)
    assert np.count_nonzero((c == 0) & (symmetric != 0)) > 0
    assert np.count_nonzero((c != 0) & (symmetric == 0)) > 0
    assert any("dual_clip=1.3" in n for n in update.notes) or name == "reinforce_ada"


# --------------------------------------------------------------------- configuration and batch errors
@pytest.mark.parametrize("make,field,value,text", [
    (lambda: GRPO(clip=-0.1), "clip", "-0.1", "(0.0, inf)"),
    (lambda: GRPO(loss_type="token_mean"), "loss_type", "'token_mean'", "'grpo', 'bnpo', 'dr_grpo'"),
    (lambda: GRPO(truncated="drop"), "truncated", "'drop'", "'mask', 'zero'"),
    (lambda: GRPO().replace(rollouts_per_prompt=0), "rollouts_per_prompt", "0", "integer >= 1"),
    (lambda: GRPO(beta=float("nan")), "beta", "nan", "finite"),
    (lambda: RAE(decay=1.0), "decay", "1.0", "[0.0, 1.0)"),
    (lambda: RLOO(max_tokens=0), "max_tokens", "0", "integer >= 1"),
    (lambda: MaxRL(temperature=0.0), "temperature", "0.0", "(0.0, inf)"),
    (lambda: DrGRPO(loss_type="grpo"), "loss_type", "'grpo'", "'dr_grpo'"),
    (lambda: GRPO(clip_high=0.0), "clip_high", "0.0", "None (symmetric; null from the shell) or a finite number in (0.0, inf)"),
    (lambda: RLOO(dual_clip=1.0), "dual_clip", "1.0", "None (off; null from the shell) or a finite number in (1.0, inf)"),
    (lambda: RAE(dual_clip="3"), "dual_clip", "'3'", "None (off; null from the shell) or a finite number in (1.0, inf)"),
])
def test_bad_values_name_field_value_and_range(make, field, value, text):
    with pytest.raises(ValueError) as info:
        make()
    message = str(info.value)
    assert f".{field}={value} is invalid" in message and text in message


def test_missing_task_id_is_refused_naming_the_row():
    rows = random_rows(1, groups=1, per_group=3)
    del rows[2]["task_id"]
    for name in GROUPED:
        with pytest.raises(BatchError, match="row 2: field 'task_id' is missing"):
            wai.method(name).update(rows)
    rows[2]["task_id"] = ["not", "hashable"]
    with pytest.raises(BatchError, match="row 2: field 'task_id'"):
        GRPO().update(rows)


def test_every_class_is_reachable_by_name_and_prints_its_fields():
    assert str(GRPO()) == ("GRPO(rollouts_per_prompt=8, clip=0.2, clip_high=None, dual_clip=None, beta=0.0, "
                           "loss_type='grpo', truncated='mask', max_tokens=1024, temperature=1.0, loss='cross_entropy')")
    for name, cls in (("grpo", GRPO), ("dr_grpo", DrGRPO), ("rloo", RLOO), ("max_rl", MaxRL), ("rae", RAE)):
        assert type(wai.method(name)) is cls and name in wai.method_names()
        assert set(cls.knobs()) == {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
    assert wai.method("grpo", clip=0.3).clip == 0.3
