"""GroupwiseGrading (GRS / GAR) and ReinforceAda: hand-worked cases, references and autograd."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import whileai as wai
from whileai.methods.shaping import GroupwiseGrading, ReinforceAda, outscored_by, rank_factors

from ._kit import random_rows


def group(rewards, scores=None, task="a", length=1, drift=0.0):
    rows = []
    for i, r in enumerate(rewards):
        lp = [-0.5 - 0.1 * i] * length
        rows.append({"reward": float(r), "logprobs": lp, "behavior_logprobs": [x - drift for x in lp],
                     "task_id": task, "quality": None if scores is None else scores[i]})
    return rows


def by_quality(rows):
    return [row["quality"] for row in rows]


def first_token(update, rows=None):
    """Each row's advantage, read on its first action token."""
    masks = [row.get("action_mask", [True]) for row in rows] if rows else [[True]] * len(update.advantages)
    return np.array([a[list(m).index(True)] for a, m in zip(update.advantages, masks)])


def test_rank_helpers():
    """Scores (3, 1, 3, 2): outscored by (0, 3, 0, 2) others; spread 0.5, n_p = 4:
    f = 1 - 0.5 * h / 3 = (1, 0.5, 1, 2/3)."""
    scores = np.array([3.0, 1.0, 3.0, 2.0])
    assert outscored_by(scores).tolist() == [0, 3, 0, 2]
    np.testing.assert_allclose(rank_factors(scores, 0.5), [1.0, 0.5, 1.0, 2 / 3], rtol=1e-15)


# --------------------------------------------------------------------- GRS: mode="reward" (Eq. 2, R' = f R)
def test_reward_mode_hand_worked_equals_grpo_on_shaped_rewards():
    """Passes scored 3, 2, 1 and one fail; spread 0.5, n_p = 3 passes.

    Outscored by 0, 1, 2 others: f = 1 - 0.5 * (0, 1, 2)/2 = (1, 0.75, 0.5), R' = f R = (1, 0.75, 0.5); the
    fail keeps 0. GRPO then sees (1, 0.75, 0.5, 0): mean 0.5625, sample std sqrt(0.546875/3) = 0.4269563,
    so A = (1.0246950, 0.4391550, -0.1463850, -1.3174650), and c = A / (B = 4 * T = 1).
    """
    rows = group([1, 1, 1, 0], scores=[3, 2, 1, None])
    update = GroupwiseGrading(by_quality).update(rows)
    want = np.array([1.0246950, 0.4391550, -0.1463850, -1.3174650]) / 4
    np.testing.assert_allclose(update.coefficients_flat, want, rtol=1e-5)
    shaped = [{**row, "reward": r} for row, r in zip(rows, [1.0, 0.75, 0.5, 0.0])]
    np.testing.assert_allclose(update.coefficients_flat, wai.GRPO().update(shaped).coefficients_flat, rtol=1e-12)
    assert update.stats["graded_groups"] == 1.0
    assert str(update).startswith("groupwise_grading update:")


def test_reward_mode_multiplies_the_reward_by_the_factor():
    """scores='factor', the paper's R = R_test * S (Eq. 2): rewards (2, 2, 0), pass_reward 1, factors
    (0.9 * 0.8 = 0.72, 0.5): R' = (1.44, 1.0, 0). The old additive rank rule would have given (2, 1.5, 0);
    with GRPO the two differ: mean 0.8133333, sample std of (1.44, 1, 0) = sqrt(1.0890667/2) = 0.7379250,
    so A = (0.8492270, 0.2529612, -1.1021882), not the (0.8006400, 0.3202560, -1.1208960) of (2, 1.5, 0)."""
    rows = group([2, 2, 0], scores=[0.72, 0.5, None])
    update = GroupwiseGrading(by_quality, scores="factor", pass_reward=1.0).update(rows)
    np.testing.assert_allclose(first_token(update), [0.8492270, 0.2529612, -1.1021882], rtol=1e-5)
    shaped = [{**row, "reward": r} for row, r in zip(rows, [1.44, 1.0, 0.0])]
    np.testing.assert_allclose(update.coefficients_flat, wai.GRPO().update(shaped).coefficients_flat, rtol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_reward_mode_matches_a_slow_reference(seed):
    """Shape rewards with loops (R' = R * (1 - spread * above / (n_p - 1))), then run the wrapped method."""
    rows = random_rows(seed, n=12, tasks=3)
    rng = np.random.default_rng(seed)
    for row in rows:
        row["quality"] = float(rng.integers(0, 3))  # ties happen
    shaped = []
    for row in rows:
        peers = [r for r in rows if r["task_id"] == row["task_id"] and r["reward"] >= 1.0]
        reward = row["reward"]
        if reward >= 1.0 and len(peers) >= 2:
            above = sum(1 for r in peers if r["quality"] > row["quality"])
            reward *= 1 - 0.3 * above / (len(peers) - 1)
        shaped.append({**row, "reward": reward})
    for inner in ("grpo", "rloo", "max_rl"):
        got = GroupwiseGrading(by_quality, method=inner, spread=0.3).update(rows).coefficients_flat
        np.testing.assert_allclose(got, wai.method(inner).update(shaped).coefficients_flat, rtol=1e-12, atol=1e-15)


def test_saturated_group_trains_only_with_the_grader():
    rows = group([1, 1, 1, 1], scores=[4, 1, 3, 2])
    assert np.all(wai.GRPO().update(rows).coefficients_flat == 0.0)
    shaped = GroupwiseGrading(by_quality).update(rows).coefficients_flat
    assert np.argmax(shaped) == 0 and np.argmin(shaped) == 1
    ties = GroupwiseGrading(lambda rs: [1.0] * len(rs)).update(rows)
    assert np.all(ties.coefficients_flat == 0.0)  # a grader that cannot tell passes apart changes nothing


def test_which_groups_the_grader_sees():
    """rank: groups with two or more passes; factor: every group with a pass (a lone pass has a quality
    too); advantage mode: only passes with A > 0 (a unanimous group has none)."""
    calls = []

    def grader(rows):
        calls.append([r["task_id"] for r in rows])
        return [1.0] * len(rows)
    rows = group([1, 0, 1], task="a") + group([1, 0], task="b") + group([0, 0], task="c") + group([1, 1], task="d")
    assert GroupwiseGrading(grader).update(rows).stats["graded_groups"] == 2.0
    assert calls == [["a", "a"], ["d", "d"]]
    calls.clear()
    GroupwiseGrading(grader, scores="factor").update(rows)
    assert calls == [["a", "a"], ["b"], ["d", "d"]]
    calls.clear()
    GroupwiseGrading(grader, mode="advantage").update(rows)
    assert calls == [["a", "a"]]


# --------------------------------------------------------------------- GAR: mode="advantage" (Eq. 3)
def test_advantage_mode_hand_worked():
    """Two passes scored 2 and 1 and a fail, spread 0.5: f = (1, 0.5). Dr. GRPO's A = R - mean =
    (1/3, 1/3, -2/3). lam = (1/3 + 1/3) / (1/3 + 0.5/3) = 4/3 (below cap 2), A' = lam f A =
    (4/9, 2/9) on the passes, the fail keeps -2/3; the passes' total stays 2/3, so no re-centring.
    The old additive rule (A + 0.5 (u - 1/2)) would have given (7/12, 1/12, -2/3)."""
    rows = group([1, 1, 0], scores=[2, 1, None])
    update = GroupwiseGrading(by_quality, mode="advantage", method="dr_grpo").update(rows)
    np.testing.assert_allclose(first_token(update), [4 / 9, 2 / 9, -2 / 3], rtol=1e-12)
    # GRPO's std-divided A scales by 1/0.5773503 and lam f A scales with it: (0.7698004, 0.3849002, -1.1547005)
    grpo = GroupwiseGrading(by_quality, mode="advantage").update(rows)
    np.testing.assert_allclose(first_token(grpo), [0.7698004, 0.3849002, -1.1547005], rtol=1e-5)
    np.testing.assert_allclose(grpo.coefficients_flat, first_token(grpo) / 3, rtol=1e-12)  # w = 1/(B=3 * T=1)


def test_advantage_mode_cap_and_recentre():
    """Three passes and a fail, factors (1, 0, 0): Dr. GRPO's A = (1/4, 1/4, 1/4, -3/4). lam = (3/4) / (1/4)
    = 3 > cap 2, so A'_P = 2 * (1, 0, 0) * 1/4 = (1/2, 0, 0): the passes lost 1/4 in total, a mean change of
    -1/16 over the group, so every row gets + 1/16: A' = (9/16, 1/16, 1/16, -11/16), mean 0."""
    rows = group([1, 1, 1, 0], scores=[1.0, 0.0, 0.0, None])
    update = GroupwiseGrading(by_quality, mode="advantage", method="dr_grpo", scores="factor").update(rows)
    np.testing.assert_allclose(first_token(update), [9 / 16, 1 / 16, 1 / 16, -11 / 16], rtol=1e-12)
    assert any("1 group: the grader's factors asked for lam above cap=2" in note for note in update.notes)
    uncapped = GroupwiseGrading(by_quality, mode="advantage", method="dr_grpo", scores="factor", cap=3.0)
    np.testing.assert_allclose(first_token(uncapped.update(rows)), [3 / 4, 0, 0, -3 / 4], rtol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_advantage_mode_matches_a_slow_reference(seed):
    """Per group, loops over the passes with A > 0: lam = min(cap, sum A / sum f A), A' = lam f A, then the
    group shifted by its mean change; f from the rank rule (spread 0.4), cap 1.3 so it sometimes binds."""
    rows = random_rows(seed, n=16, tasks=3)
    rng = np.random.default_rng(seed)
    for row in rows:
        row["quality"] = float(rng.integers(0, 3))
    base = list(first_token(wai.RLOO().update(rows), rows))
    want = list(base)
    for task in {r["task_id"] for r in rows}:
        members = [i for i, r in enumerate(rows) if r["task_id"] == task]
        pos = [i for i in members if rows[i]["reward"] >= 1.0 and base[i] > 0]
        if len(pos) < 2:
            continue
        f = {i: 1 - 0.4 * sum(rows[j]["quality"] > rows[i]["quality"] for j in pos) / (len(pos) - 1) for i in pos}
        lam = min(1.3, sum(base[i] for i in pos) / sum(f[i] * base[i] for i in pos))
        for i in pos:
            want[i] = lam * f[i] * base[i]
        shift = sum(want[i] - base[i] for i in members) / len(members)
        for i in members:
            want[i] -= shift
    got = GroupwiseGrading(by_quality, mode="advantage", method="rloo", spread=0.4, cap=1.3).update(rows)
    np.testing.assert_allclose(first_token(got, rows), want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("seed", range(3))
def test_advantage_mode_is_minus_the_gradient_of_the_clipped_surrogate(seed):
    """L = -sum_i w_i sum_t min(rho A', clip(rho, 0.8, 1.2) A'), A' held fixed, w_i = 1/(B T_i)."""
    rows = random_rows(seed, n=12, tasks=2, drift=0.3)
    rng = np.random.default_rng(seed)
    for row in rows:
        row["quality"] = float(rng.random())
    update = GroupwiseGrading(by_quality, mode="advantage").update(rows)
    loss, leaves = torch.zeros((), dtype=torch.float64), []
    for row, adv in zip(rows, update.advantages):
        lp = torch.tensor(row["logprobs"], dtype=torch.float64, requires_grad=True)
        mask = torch.tensor(row["action_mask"], dtype=torch.float64)
        a = torch.tensor(adv, dtype=torch.float64)
        ratio = torch.exp(lp - torch.tensor(row["behavior_logprobs"], dtype=torch.float64))
        surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 0.8, 1.2) * a)
        loss = loss - (mask * surrogate).sum() / (len(rows) * mask.sum())
        leaves.append(lp)
    loss.backward()
    for c, lp in zip(update.coefficients, leaves):
        np.testing.assert_allclose(c, -lp.grad.numpy(), rtol=1e-9, atol=1e-14)


# --------------------------------------------------------------------- GroupwiseGrading config
def test_groupwise_grading_config_errors():
    with pytest.raises(wai.ConfigError, match="GroupwiseGrading.grader=None is invalid"):
        GroupwiseGrading()
    with pytest.raises(wai.ConfigError, match="unknown method 'grpoo'; valid names: .*grpo"):
        GroupwiseGrading(by_quality, method="grpoo")
    with pytest.raises(wai.ConfigError, match="GroupwiseGrading.mode='rank'"):
        GroupwiseGrading(by_quality, mode="rank")
    with pytest.raises(wai.ConfigError, match="GroupwiseGrading.scores='rubric'"):
        GroupwiseGrading(by_quality, scores="rubric")
    with pytest.raises(wai.ConfigError, match="GroupwiseGrading.cap=0.5"):
        GroupwiseGrading(by_quality, cap=0.5)
    with pytest.raises(wai.ConfigError, match="beta must be 0"):
        GroupwiseGrading(by_quality, mode="advantage", method=wai.GRPO(beta=0.1))
    assert GroupwiseGrading(by_quality, method="rloo").method == wai.RLOO()


def test_grader_returning_bad_scores_is_refused():
    rows = group([1, 1, 0], scores=[1, 2, None])
    with pytest.raises(wai.BatchError, match=r"row 0: the grader returned \[1.0\] for the 2 passes of task 'a'"):
        GroupwiseGrading(lambda rs: [1.0]).update(rows)
    with pytest.raises(wai.BatchError, match="one finite score per passing row"):
        GroupwiseGrading(lambda rs: [1.0, float("nan")]).update(rows)
    with pytest.raises(wai.BatchError, match=r"scores='factor' takes each score as a quality factor in \[0, 1\]"):
        GroupwiseGrading(by_quality, scores="factor").update(rows)  # 2 is not a factor


# --------------------------------------------------------------------- ReinforceAda: sampling side
def test_plan_hand_worked():
    """group_size 2 (balance needs 1 pass and 1 fail), round_size 8, max_rounds 4.

    a: a pass and a fail: done. b: 3 passes in one round: resample 8. c: 32 fails = 4 rounds, no exit:
    out of budget. d: no rows yet: a first round of 8.
    """
    rows = ([{"task_id": "a", "reward": 1.0}, {"task_id": "a", "reward": 0.0}]
            + [{"task_id": "b", "reward": 1.0}] * 3 + [{"task_id": "c", "reward": 0.0}] * 32)
    plan = ReinforceAda(group_size=2).plan(rows, tasks=["d"])
    assert plan.resample == {"d": 8, "b": 8}
    assert plan.done == ("a",) and plan.exhausted == ("c",)
    assert "resample 2 prompts (16 rollouts); 1 done; 1 out of budget" in str(plan)
    assert not plan.finished
    # exit="pos" stops b (it has a pass) and leaves c out of budget
    pos = ReinforceAda(exit="pos", group_size=2).plan(rows)
    assert pos.resample == {} and set(pos.done) == {"a", "b"} and pos.finished


def test_balance_exit_needs_n_half_passes_and_the_rest_fails():
    """The authors' rule: n // 2 passes and n - n // 2 fails. n = 4: 2 and 2. n = 3: 1 pass and 2 fails,
    so (1 pass, 1 fail) does not exit (the old rule, n // 2 of each, let it)."""
    ada = ReinforceAda(group_size=4)
    assert not ada.has_exited(passes=1, fails=5)
    assert ada.has_exited(passes=2, fails=2)
    odd = ReinforceAda(group_size=3)
    assert not odd.has_exited(passes=1, fails=1)
    assert odd.has_exited(passes=1, fails=2) and not odd.has_exited(passes=5, fails=1)
    assert ReinforceAda(exit="pos").has_exited(passes=1, fails=0)
    with pytest.raises(wai.BatchError, match="row 0: ReinforceAda.plan needs 'task_id' and 'reward'"):
        ada.plan([{"reward": 1.0}])


def test_keep_hand_worked():
    """group_size 4. Task a: 5 passes, 1 fail -> 2 passes, the fail, then one more pass (3 + 1).
    Task b: 1 pass, 6 fails -> the pass and 3 fails. Rows are taken first come, in batch order."""
    rows = group([1, 1, 1, 1, 1, 0], task="a") + group([0, 0, 1, 0, 0, 0, 0], task="b")
    keep = ReinforceAda().keep(rows)
    assert np.flatnonzero(keep).tolist() == [0, 1, 2, 5, 6, 7, 8, 9]


def downsample_cache(passes, fails, n):
    """The authors' rule, transcribed (RLHFlow/Reinforce-Ada, ray_trainer.py): how many of each to keep."""
    target_pos = min(n // 2, passes)
    target_neg = min(n - target_pos, fails)
    if target_pos + target_neg < n:
        if passes > target_pos:
            target_pos += min(passes - target_pos, n - (target_pos + target_neg))
        elif fails > target_neg:
            target_neg += min(fails - target_neg, n - (target_pos + target_neg))
    return target_pos, target_neg


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_keep_is_the_authors_downsample_for_every_pool(n):
    for passes in range(0, 9):
        for fails in range(0, 9):
            if passes + fails == 0:
                continue
            rows = group([1] * passes + [0] * fails)
            kept = ReinforceAda(group_size=n).keep(rows)
            assert (int(kept[:passes].sum()), int(kept[passes:].sum())) == downsample_cache(passes, fails, n)


# --------------------------------------------------------------------- ReinforceAda: update side
def test_update_hand_worked_uses_the_pool_baseline():
    """One prompt, 6 rows collected, rewards (1, 0, 0, 0, 0, 0); group_size 2 keeps rows 0 and 1.

    Pool mean 1/6 (the pass rate), sample std sqrt((25/36 + 5/36)/5) = sqrt(1/6) = 0.4082483.
    Default (divide_by_std): A_0 = (5/6)/0.4082483 = 2.0412415, A_1 = (-1/6)/0.4082483 = -0.4082483;
    B_kept = 2, T = 1: c = (1.0206207, -0.2041241) (up to the 1e-6 added to the std).
    divide_by_std=False (the authors' run): A = (5/6, -1/6), c = (0.4166667, -0.0833333).
    A baseline from the 2 kept rows alone would give A = (0.5, -0.5) / std; rows 2-5 get 0 and a note.
    """
    rows = group([1, 0, 0, 0, 0, 0])
    update = ReinforceAda(group_size=2).update(rows)
    np.testing.assert_allclose(update.coefficients_flat, [1.0206207, -0.2041241, 0, 0, 0, 0], rtol=1e-5, atol=1e-12)
    assert update.admitted.tolist() == [True, True, False, False, False, False]
    assert "4 trajectories (2, 3, 4, 5) not kept" in update.notes[0]
    plain = ReinforceAda(group_size=2, divide_by_std=False).update(rows)
    np.testing.assert_allclose(plain.coefficients_flat, [5 / 12, -1 / 12, 0, 0, 0, 0], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("divide", [True, False])
def test_update_matches_slow_reference(seed, divide):
    rows = random_rows(seed, n=14, tasks=3, drift=0.3)
    ada = ReinforceAda(group_size=2, clip=0.2, divide_by_std=divide)
    update = ada.update(rows)
    keep = ada.keep(rows)
    n_kept = int(keep.sum())
    for i, row in enumerate(rows):
        peers = [r["reward"] for r in rows if r["task_id"] == row["task_id"]]
        mean = sum(peers) / len(peers)
        std = math.sqrt(sum((p - mean) ** 2 for p in peers) / (len(peers) - 1)) if len(peers) > 1 else 0.0
        adv = (row["reward"] - mean) if max(peers) > min(peers) else 0.0
        if divide:
            adv /= max(std, 1e-6) + 1e-6
        tokens = sum(row["action_mask"])
        want = []
        for lp, blp, m in zip(row["logprobs"], row["behavior_logprobs"], row["action_mask"]):
            rho = math.exp(lp - blp)
            unclipped = rho * adv <= min(max(rho, 0.8), 1.2) * adv
            want.append(rho * adv / (n_kept * tokens) if (m and keep[i] and unclipped) else 0.0)
        np.testing.assert_allclose(update.coefficients[i], want, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("make", [lambda: ReinforceAda(), lambda: GroupwiseGrading(grader=lambda rows: [0.0] * len(rows))])
def test_groups_of_one_give_zero_and_point_to_the_single_rollout_methods(make):
    rows = [{"reward": r, "logprobs": [-0.2, -0.4], "task_id": f"t{i}"} for i, r in enumerate([1.0, 0.0, 1.0])]
    update = make().update(rows)
    assert np.count_nonzero(update.coefficients_flat) == 0
    assert any("single rollout" in note and "wai.FlashReinforce, wai.SAO, wai.BPCO or wai.RAE" in note
               for note in update.notes), update.notes


def test_reprs_and_registry():
    assert repr(ReinforceAda()) == ("ReinforceAda(exit='balance', group_size=4, round_size=8, max_rounds=4, "
                                    "pass_reward=1.0, divide_by_std=True, clip=0.2, clip_high=None, "
                                    "dual_clip=None)")
    assert wai.method("reinforce_ada") == ReinforceAda()
    assert wai.methods.ReinforceAda is ReinforceAda
    with pytest.raises(wai.ConfigError, match="ReinforceAda.group_size=1"):
        ReinforceAda(group_size=1)
    with pytest.raises(wai.ConfigError, match="ReinforceAda.divide_by_std='yes'"):
        ReinforceAda(divide_by_std="yes")
