"""GroupwiseGrading (GRS / GAR) and ReinforceAda: hand-worked cases, references and autograd."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import whileai as wai
from whileai.methods.shaping import GroupwiseGrading, ReinforceAda, average_ranks, outscored_by

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


def test_rank_helpers():
    scores = np.array([3.0, 1.0, 3.0, 2.0])
    assert outscored_by(scores).tolist() == [0, 3, 0, 2]
    assert average_ranks(scores).tolist() == [2.5, 0.0, 2.5, 1.0]


# --------------------------------------------------------------------- GroupwiseGrading, reward mode (GRS)
def test_reward_mode_hand_worked_equals_grpo_on_shaped_rewards():
    """Passes scored 3, 2, 1 and one fail; spread 0.5, n_p = 3 passes.

    Outscored by 0, 1, 2 others: R' = 1 - 0.5 * (0, 1, 2)/2 = (1, 0.75, 0.5); the fail keeps 0.
    GRPO then sees (1, 0.75, 0.5, 0): mean 0.5625, sample std sqrt(0.546875/3) = 0.4269563, so
    A = (1.0246950, 0.4391550, -0.1463850, -1.3174650), and c = A / (B = 4 * T = 1).
    """
    rows = group([1, 1, 1, 0], scores=[3, 2, 1, None])
    update = GroupwiseGrading(by_quality).update(rows)
    want = np.array([1.0246950, 0.4391550, -0.1463850, -1.3174650]) / 4
    np.testing.assert_allclose(update.coefficients_flat, want, rtol=1e-5)
    shaped = [{**row, "reward": r} for row, r in zip(rows, [1.0, 0.75, 0.5, 0.0])]
    np.testing.assert_allclose(update.coefficients_flat, wai.GRPO().update(shaped).coefficients_flat, rtol=1e-12)
    assert update.stats["graded_groups"] == 1.0
    assert str(update).startswith("groupwise_grading update:")


@pytest.mark.parametrize("seed", range(4))
def test_reward_mode_matches_a_slow_reference(seed):
    """Shape rewards with loops, then run the wrapped method on them: same coefficients."""
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
            reward -= 0.3 * above / (len(peers) - 1)
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


def test_grader_sees_only_groups_with_two_or_more_passes():
    calls = []

    def grader(rows):
        calls.append([r["task_id"] for r in rows])
        return [0.0] * len(rows)
    rows = group([1, 0, 1], task="a") + group([1, 0], task="b") + group([0, 0], task="c")
    update = GroupwiseGrading(grader).update(rows)
    assert calls == [["a", "a"]]
    assert update.stats["graded_groups"] == 1.0


# --------------------------------------------------------------------- advantage mode (GAR)
def test_advantage_mode_hand_worked():
    """Passes scored 3, 2, 1 and one fail. GRPO: mean 0.75, sample std 0.5, A = (0.5, 0.5, 0.5, -1.5)
    (up to the 1e-6 in the std). Average ranks (2, 1, 0) / 2 = u = (1, 0.5, 0): bonus 0.5 (u - 1/2) =
    (0.25, 0, -0.25), so A' = (0.75, 0.5, 0.25, -1.5) and c = A' / (B = 4 * T = 1).
    """
    rows = group([1, 1, 1, 0], scores=[3, 2, 1, None])
    update = GroupwiseGrading(by_quality, mode="advantage").update(rows)
    np.testing.assert_allclose(update.coefficients_flat, np.array([0.75, 0.5, 0.25, -1.5]) / 4, rtol=1e-5)
    np.testing.assert_allclose(np.concatenate(update.advantages), [0.75, 0.5, 0.25, -1.5], rtol=1e-5)


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
    with pytest.raises(wai.ConfigError, match="beta must be 0"):
        GroupwiseGrading(by_quality, mode="advantage", method=wai.GRPO(beta=0.1))
    assert GroupwiseGrading(by_quality, method="rloo").method == wai.RLOO()


def test_grader_returning_the_wrong_count_is_refused():
    rows = group([1, 1, 0], scores=[1, 2, None])
    with pytest.raises(wai.BatchError, match=r"row 0: the grader returned \[1.0\] for the 2 passes of task 'a'"):
        GroupwiseGrading(lambda rs: [1.0]).update(rows)
    with pytest.raises(wai.BatchError, match="one finite score per passing row"):
        GroupwiseGrading(lambda rs: [1.0, float("nan")]).update(rows)


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


def test_balance_exit_needs_half_of_the_group_on_each_side():
    ada = ReinforceAda(group_size=4)
    assert not ada.has_exited(passes=1, fails=5)
    assert ada.has_exited(passes=2, fails=2)
    with pytest.raises(wai.BatchError, match="row 0: ReinforceAda.plan needs 'task_id' and 'reward'"):
        ada.plan([{"reward": 1.0}])


def test_keep_balances_passes_and_fails():
    """group_size 4. Task a: 5 passes, 1 fail -> 3 passes (as many as the fails leave room for) + 1 fail.
    Task b: 1 pass, 6 fails -> 1 pass + 3 fails. Rows are taken in batch order."""
    rows = group([1, 1, 1, 1, 1, 0], task="a") + group([0, 0, 1, 0, 0, 0, 0], task="b")
    keep = ReinforceAda().keep(rows)
    assert np.flatnonzero(keep).tolist() == [0, 1, 2, 5, 6, 7, 8, 9]


# --------------------------------------------------------------------- ReinforceAda: update side
def test_update_hand_worked_uses_the_global_baseline():
    """One prompt, 6 rows collected, rewards (1, 0, 0, 0, 0, 0); group_size 2 keeps rows 0 and 1.

    Global mean 1/6, sample std sqrt((25/36 + 5/36)/5) = sqrt(1/6) = 0.4082483.
    A_0 = (5/6)/0.4082483 = 2.0412415, A_1 = (-1/6)/0.4082483 = -0.4082483; B_kept = 2, T = 1:
    c = (1.0206207, -0.2041241) (up to the 1e-6 added to the std); rows 2-5 get 0 and a note.
    """
    rows = group([1, 0, 0, 0, 0, 0])
    update = ReinforceAda(group_size=2).update(rows)
    np.testing.assert_allclose(update.coefficients_flat, [1.0206207, -0.2041241, 0, 0, 0, 0], rtol=1e-5, atol=1e-12)
    assert update.admitted.tolist() == [True, True, False, False, False, False]
    assert "4 trajectories (2, 3, 4, 5) not kept" in update.notes[0]


@pytest.mark.parametrize("seed", range(4))
def test_update_matches_slow_reference(seed):
    rows = random_rows(seed, n=14, tasks=3, drift=0.3)
    ada = ReinforceAda(group_size=2, clip=0.2)
    update = ada.update(rows)
    keep = ada.keep(rows)
    n_kept = int(keep.sum())
    for i, row in enumerate(rows):
        peers = [r["reward"] for r in rows if r["task_id"] == row["task_id"]]
        mean = sum(peers) / len(peers)
        std = math.sqrt(sum((p - mean) ** 2 for p in peers) / (len(peers) - 1)) if len(peers) > 1 else 0.0
        adv = (row["reward"] - mean) / (std + 1e-6) if max(peers) > min(peers) else 0.0
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
                                    "pass_reward=1.0, clip=0.2)")
    assert wai.method("reinforce_ada") == ReinforceAda()
    assert wai.methods.ReinforceAda is ReinforceAda
    with pytest.raises(wai.ConfigError, match="ReinforceAda.group_size=1"):
        ReinforceAda(group_size=1)
