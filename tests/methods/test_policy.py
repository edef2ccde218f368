"""The service page's algorithms as methods, on hand-worked rows: the advantages they send, the loss and its
config, and the two fixes of the fold (the sample std in length-normalized GRPO and DAPO).

Rows are on-policy (no behavior_logprobs) with every token an action token unless said otherwise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import whileai as wai
from whileai.errors import BatchError, ConfigError


def rows(rewards, lengths=None, task="q", truncated=(), **fields):
    lengths = lengths or [1] * len(rewards)
    out = []
    for i, (r, n) in enumerate(zip(rewards, lengths)):
        row = {"reward": float(r), "logprobs": [-1.0] * n, "task_id": task, "truncated": i in truncated}
        row.update({k: v[i] for k, v in fields.items()})
        out.append(row)
    return out


def sent(update) -> list[list[float]]:
    return [a.tolist() for a in update.advantages]


# --------------------------------------------------------------------- the sample std (bug a)
def test_length_normalized_grpo_divides_by_the_sample_std():
    """rewards [1, 0, 0, 0]: mean 0.25, sample std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5, so A = [1.5, -0.5,
    -0.5, -0.5] as wai.GRPO, verl and TRL (the population std, 0.433, gave [1.732, -0.577, ...]); one token
    each, so A / T = A."""
    update = wai.method("grpo_len_norm").update(rows([1, 0, 0, 0]))
    assert np.concatenate(update.advantages) == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-5)
    assert wai.method("grpo_len_norm").run_spec().loss == "importance_sampling"
    two = wai.method("grpo_len_norm").update(rows([1, 0, 0, 0], lengths=[2, 4, 1, 1]))
    assert sent(two)[0] == pytest.approx([0.75, 0.75], rel=1e-5) and sent(two)[1] == pytest.approx([-0.125] * 4, rel=1e-5)


def test_dapo_groups_of_unequal_size_are_not_reweighted_against_each_other():
    """Group a: 3 rollouts, one truncated, so rewards [1, 0] count: mean 0.5, sample std 0.70711, A = +-0.70711.
    Group b: [1, 0, 0, 0]: A = [1.5, -0.5, -0.5, -0.5]. Each is GRPO's advantage for its own group; the
    population std made them +-1 and [1.732, -0.577, ...], scaling the smaller group by sqrt(2) and the other by
    sqrt(4/3). One token each; N = 6 kept action tokens, so every sent advantage is A / 6. Loss ppo, 0.8 / 1.28."""
    batch = rows([1, 0, 1], task="a", truncated=(2,)) + rows([1, 0, 0, 0], task="b")
    update = wai.DAPO().update(batch)
    s = 1 / math.sqrt(2)
    want = [s / 6, -s / 6, 0.0, 1.5 / 6, -0.5 / 6, -0.5 / 6, -0.5 / 6]
    assert np.concatenate(update.advantages) == pytest.approx(want, rel=1e-5)
    assert update.admitted.tolist() == [True, True, False, True, True, True, True]
    spec = wai.DAPO().run_spec()
    assert (spec.loss, dict(spec.loss_config)) == ("ppo", {"clip_low_threshold": 0.8,
                                                           "clip_high_threshold": pytest.approx(1.28)})


def test_dapo_drops_short_and_unanimous_groups_and_asks_for_more():
    """min_retained 2: group a keeps one untruncated rollout (short), group b is unanimous (dynamic sampling):
    neither is admitted, and their tokens leave N; group c [1, 0] over N = 2 tokens gives +-0.70711 / 2."""
    batch = (rows([1, 0], task="a", truncated=(1,)) + rows([1, 1], task="b") + rows([1, 0], task="c"))
    update = wai.DAPO(max_rounds=0).update(batch)
    assert update.admitted.tolist() == [False, False, False, False, True, True]
    assert np.concatenate(update.advantages)[4:] == pytest.approx([0.70711 / 2, -0.70711 / 2], rel=1e-4)
    assert (update.stats["groups_short"], update.stats["groups_uniform"], update.stats["groups_kept"]) == (1, 1, 1)
    assert any("fewer than min_retained=2" in n for n in update.notes)
    plan = wai.DAPO(rollouts_per_prompt=2).plan(batch, ["a", "b", "c", "d"])
    assert plan.resample == {"a": 2, "d": 2} and set(plan.done) == {"b", "c"}
    more = batch + rows([0, 0], task="a", truncated=(0, 1))  # one more round, still short
    assert wai.DAPO(rollouts_per_prompt=2, max_rounds=1).plan(more, ["a"]).exhausted == ("a",)
    assert wai.DAPO(rollouts_per_prompt=2, max_rounds=2).plan(more, ["a"]).resample == {"a": 2}


# --------------------------------------------------------------------- the group-relative family
def test_grpo_nostd_is_reward_minus_group_mean_on_every_token():
    """rewards [1, 0, 0, 1]: A = [0.5, -0.5, -0.5, 0.5], no std, no length; truncated rows kept."""
    update = wai.method("grpo_nostd").update(rows([1, 0, 0, 1], lengths=[2, 1, 1, 3], truncated=(3,)))
    assert sent(update) == [[0.5, 0.5], [-0.5], [-0.5], [0.5, 0.5, 0.5]]
    assert type(wai.method("grpo_nostd")) is wai.DrGRPO


def test_dr_grpo_one_constant_length_or_the_service_pages_own():
    """rewards [1, 0, 0, 0]: A = [0.75, -0.25, -0.25, -0.25]; length max_tokens = 8: A / 8 on every token;
    length own: A / T with T = [2, 4, 2, 4]."""
    batch = rows([1, 0, 0, 0], lengths=[2, 4, 2, 4])
    paper = wai.DrGRPO(loss="importance_sampling", max_tokens=8).update(batch)
    assert [a[0] for a in paper.advantages] == pytest.approx([0.09375, -0.03125, -0.03125, -0.03125])
    own = wai.DrGRPO(loss="importance_sampling", length="own").update(batch)
    assert [a[0] for a in own.advantages] == pytest.approx([0.375, -0.0625, -0.125, -0.0625])


def test_rloo_and_maxrl_under_importance_sampling():
    """[1, 0, 0, 0]: RLOO A = [1, -1/3, -1/3, -1/3]; MaxRL (R - mean) / mean = [3, -1, -1, -1]; beat the best:
    R_i minus the best other = [1, -1, -1, -1]; [2, 2, 1]: [0, 0, -1] (a tie for the best gives 0)."""
    batch = rows([1, 0, 0, 0])
    assert np.concatenate(wai.RLOO(loss="importance_sampling").update(batch).advantages) == pytest.approx(
        [1, -1 / 3, -1 / 3, -1 / 3])
    assert np.concatenate(wai.MaxRL(loss="importance_sampling").update(batch).advantages) == pytest.approx(
        [3, -1, -1, -1])
    best = wai.MaxRL(loss="importance_sampling", estimator="beat_the_best")
    assert np.concatenate(best.update(batch).advantages) == pytest.approx([1, -1, -1, -1])
    assert np.concatenate(best.update(rows([2, 2, 1])).advantages) == pytest.approx([0, 0, -1])
    zero_mean = wai.MaxRL(loss="importance_sampling").update(rows([-1, 1]))
    assert not np.concatenate(zero_mean.advantages).any() and any("mean <= 0" in n for n in zero_mean.notes)


def test_clip_is_a_relative_epsilon_sent_as_absolute_bounds():
    assert dict(wai.PPO().run_spec().loss_config) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert dict(wai.PPO(clip=0.3, clip_high=0.5).run_spec().loss_config) == {
        "clip_low_threshold": pytest.approx(0.7), "clip_high_threshold": 1.5}
    assert dict(wai.CISPO().run_spec().loss_config) == {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}
    assert dict(wai.GRPO(loss="gspo", clip=0.1).run_spec().loss_config) == {
        "clip_low_threshold": 0.9, "clip_high_threshold": pytest.approx(1.1)}
    assert wai.method("grpo_nostd").run_spec().loss_config == ()
    assert dict(wai.DPPO(delta_low=0.1, divergence="binary_kl").run_spec().loss_config) == {
        "delta_low": 0.1, "delta_high": 0.2, "dppo_type": "binary_kl"}
    assert dict(wai.SAPO(tau_pos=2.0).run_spec().loss_config) == {"tau_pos": 2.0, "tau_neg": 1.05}
    for cls in (wai.PPO, wai.CISPO, wai.GSPO, wai.DPPO, wai.SAPO):
        spec = cls().run_spec()
        assert spec.loss == cls.name and spec.rollouts_per_prompt == 8 and spec.min_rollouts_per_prompt == 2
        assert sent(cls().update(rows([1, 0]))) == [[0.5], [-0.5]]


def test_what_a_named_loss_cannot_mean_is_refused():
    with pytest.raises(ConfigError, match="GRPO.beta=0.04 is invalid with loss='ppo'"):
        wai.GRPO(loss="ppo", beta=0.04)
    with pytest.raises(ConfigError, match="dual_clip=3.0 is invalid with loss='importance_sampling'"):
        wai.RLOO(loss="importance_sampling", dual_clip=3.0)
    with pytest.raises(ConfigError, match="lower ratio bound 1 - clip would be negative"):
        wai.PPO(clip=1.5)
    with pytest.raises(ConfigError, match="max_ratio=2.0 is invalid with loss='importance_sampling'"):
        wai.OPD(loss="importance_sampling")
    with pytest.raises(ConfigError, match="divergence='jsd' is invalid"):
        wai.OPSD(loss="importance_sampling", max_ratio=None, divergence="jsd")
    with pytest.raises(ConfigError, match="DPPO.loss='ppo' is invalid"):
        wai.DPPO(loss="ppo")
    with pytest.raises(ConfigError, match="MaxRL.estimator='best' is invalid"):
        wai.MaxRL(estimator="best")


# --------------------------------------------------------------------- REINFORCE++ and distillation
def k2_rows(rewards, penalties):
    """Rows whose behavior minus reference log-probabilities give exactly these K2 penalties, one task."""
    out = []
    for r, p in zip(rewards, penalties):
        behavior = np.array([-1.0] * len(p))
        out.append({"reward": r, "logprobs": behavior.tolist(), "behavior_logprobs": behavior.tolist(),
                    "ref_logprobs": (behavior - np.sqrt(2 * np.asarray(p))).tolist(), "task_id": "q"})
    return out


def test_reinforce_pp_return_to_go_and_batch_normalization():
    """beta 0.5, penalties [0.1, 0.2] (R = 1) and [0.0, 0.4] (R = 0). Returns-to-go [0.85, 0.9] and [-0.2, -0.2];
    over the 4 tokens mean 0.3375, population std 0.537792, so a = [0.95300, 1.04597, -0.99946, -0.99946]."""
    update = wai.ReinforcePP(kl_coef=0.5).update(k2_rows([1.0, 0.0], [[0.1, 0.2], [0.0, 0.4]]))
    assert np.concatenate(update.advantages) == pytest.approx([0.95300, 1.04597, -0.99946, -0.99946], abs=1e-4)
    assert update.stats["mean_k2"] == pytest.approx(0.175)
    token = wai.ReinforcePP(kl_coef=0.5, kl_in="token").update(k2_rows([1.0, 0.0], [[0.1, 0.2], [0.0, 0.4]]))
    assert np.concatenate(token.advantages) == pytest.approx([0.5 - 0.05, 0.5 - 0.1, -0.5, -0.5 - 0.2])
    spec = wai.ReinforcePP().run_spec()
    assert spec.needs == ("ref_logprobs",) and spec.loss == "importance_sampling"


def test_opd_service_form_is_the_teacher_minus_the_samplers_logprob():
    """a = kl_coef (teacher - behavior): 0.5 * ([-1, -2] - [-1.5, -1.5]) = [0.25, -0.25]; c = rho a with
    rho = exp(logprobs - behavior) = exp([0.5, -0.5])."""
    row = {"reward": 0.0, "logprobs": [-1.0, -2.0], "behavior_logprobs": [-1.5, -1.5],
           "teacher_logprobs": [-1.0, -2.0]}
    update = wai.OPD(loss="importance_sampling", max_ratio=None, kl_coef=0.5).update([row])
    assert update.advantages[0] == pytest.approx([0.25, -0.25])
    assert update.coefficients[0] == pytest.approx([0.25 * math.exp(0.5), -0.25 * math.exp(-0.5)])
    assert wai.OPD(loss="importance_sampling", max_ratio=None).run_spec().needs == ("teacher_logprobs",)
    topk = {**row, "teacher_topk_tokens": [[1], [2]], "teacher_topk_logprobs": [[-1.0], [-1.0]],
            "topk_logprobs": [[-1.0], [-1.0]]}
    with pytest.raises(BatchError, match="top-k fields"):
        wai.OPD(loss="importance_sampling", max_ratio=None).update([topk])
    sdpo = wai.method("sdpo")
    teacher = sdpo.run_spec().teacher
    assert (type(sdpo), sdpo.privileged, teacher.weights, sdpo.run_spec().loss) == (
        wai.OPSD, "feedback", "initial", "importance_sampling")


# --------------------------------------------------------------------- CustomLoss: the build_loss hook
def test_custom_loss_sends_what_the_function_returns():
    """The function returns one number per row; observation tokens get 0; the coefficients are the loss's
    gradient (importance_sampling on-policy: c = a)."""
    batch = rows([1, 0], lengths=[2, 3])
    batch[1]["action_mask"] = [True, False, True]
    custom = wai.CustomLoss(advantages=lambda b: b.rewards_B - 0.25, rollouts_per_prompt=2, needs=("ref_logprobs",))
    update = custom.update(batch)
    assert sent(update) == [[0.75, 0.75], [-0.25, 0.0, -0.25]]
    assert [c.tolist() for c in update.coefficients] == sent(update)
    spec = custom.run_spec()
    assert (spec.loss, spec.rollouts_per_prompt, spec.needs) == ("importance_sampling", 2, ("ref_logprobs",))
    per_token = wai.CustomLoss(advantages=lambda b: [np.arange(n, dtype=float) for n in b.lengths_B], loss="ppo")
    assert sent(per_token.update(batch)) == [[0.0, 1.0], [0.0, 0.0, 2.0]]
    assert dict(per_token.run_spec().loss_config) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}


def test_custom_loss_refuses_a_bad_answer():
    batch = rows([1, 0], lengths=[2, 3])
    with pytest.raises(BatchError, match=r"returned shape \(3,\); return one number per row \(2,\)"):
        wai.CustomLoss(advantages=lambda b: np.zeros(3)).update(batch)
    with pytest.raises(BatchError, match="row 1: the custom_loss advantages function gave nan at token 0"):
        wai.CustomLoss(advantages=lambda b: np.array([0.0, np.nan])).update(batch)
    with pytest.raises(ConfigError, match="CustomLoss.advantages=None is invalid"):
        wai.CustomLoss()
    with pytest.raises(ConfigError, match="'critic' is not a field a loop fills"):
        wai.CustomLoss(advantages=lambda b: b.rewards_B, needs=("critic",))
