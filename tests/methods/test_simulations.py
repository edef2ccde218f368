"""The update rules on the toy policy: reward climbs, stale rows are dropped / masked / clipped, and
tool tokens get exactly zero (the lesson's "What is proven": the arithmetic is the papers')."""

from __future__ import annotations

import numpy as np
import pytest

import whileai as wai
from whileai.methods.flash_reinforce import bernoulli_kl
from whileai.simulations import ToyWorld, policy_gradient, sample_rows, train
from whileai.simulations.toy import log_softmax


def passes(row):
    return row["reward"] >= 0.75


def grade_by_first_token(rows):
    return [-row["tokens"][0] for row in rows]


# name -> (method factory, train keyword arguments, the expected reward it must reach from 0.25)
CASES = {
    "flash_reinforce": (lambda: wai.FlashReinforce(trust=10.0), {"lr": 20.0}, 0.6),
    "sao": (lambda: wai.SAO(), {"lr": 20.0}, 0.6),
    "bpco": (lambda: wai.BPCO(), {"lr": 8.0}, 0.45),
    "grpo": (lambda: wai.GRPO(), {"lr": 5.0}, 0.6),
    "dr_grpo": (lambda: wai.method("dr_grpo", max_tokens=6), {"lr": 20.0}, 0.5),
    "rloo": (lambda: wai.RLOO(), {"lr": 10.0}, 0.45),
    "max_rl": (lambda: wai.MaxRL(), {"lr": 5.0}, 0.5),
    "rae": (lambda: wai.RAE(), {"lr": 10.0}, 0.45),
    "async_ipo": (lambda: wai.Async("grpo", correction="ipo"), {"lr": 5.0, "off_policy_steps": 2}, 0.5),
    "async_icepop": (lambda: wai.Async("grpo", correction="icepop"), {"lr": 5.0, "off_policy_steps": 2}, 0.5),
    "async_tis": (lambda: wai.Async("grpo", correction="tis"), {"lr": 5.0, "off_policy_steps": 2}, 0.5),
    "sft_on_passes": (lambda: wai.SFT(), {"lr": 0.2, "row_filter": passes}, 0.6),
    "dpo": (lambda: wai.DPO(pass_reward=0.75), {"lr": 4.0, "reference": True}, 0.5),
    "opd": (lambda: wai.OPD(), {"lr": 0.1, "teacher": True}, 0.8),
    "opd_top_k": (lambda: wai.OPD(top_k=2), {"lr": 0.1, "teacher": True, "top_k": 3}, 0.8),
    "opd_jsd": (lambda: wai.OPD(divergence="jsd"), {"lr": 0.3, "teacher": True}, 0.7),
    "opsd": (lambda: wai.OPSD(), {"lr": 0.1, "teacher": True}, 0.8),
    "reinforce_ada": (lambda: wai.methods.ReinforceAda(pass_reward=0.75), {"lr": 5.0}, 0.6),
    "groupwise_grading": (lambda: wai.GroupwiseGrading(grade_by_first_token, pass_reward=0.75), {"lr": 5.0}, 0.6),
}


@pytest.fixture(scope="module")
def runs():
    return {name: train(factory(), steps=30, seed=0, **kwargs) for name, (factory, kwargs, _) in CASES.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reward_climbs(runs, name):
    rewards = runs[name].rewards
    assert rewards[0] == pytest.approx(0.25)  # uniform table over 4 tokens
    assert rewards[-1] >= CASES[name][2], (name, rewards[-1])
    assert np.mean(rewards[-5:]) > np.mean(rewards[:5]) + 0.1


@pytest.mark.parametrize("name", sorted(CASES))
def test_tool_tokens_get_exactly_zero(runs, name):
    run = runs[name]
    tool = ~ToyWorld().action_mask
    for update in run.updates:
        for c in update.coefficients:
            assert np.all(c[tool] == 0.0)
    # so the policy's table never moves at a tool position
    np.testing.assert_array_equal(run.logits[:, tool], run.initial_logits[:, tool])


def test_a_method_that_touched_tool_tokens_would_be_caught():
    """The tool-token check can fail: SFT coefficients forced onto every token move tool positions."""
    world = ToyWorld()
    logits = np.zeros((world.tasks, len(world.layout), world.vocab))
    rows = sample_rows(world, logits, logits, np.random.default_rng(0), 2)
    grad = policy_gradient(world, logits, rows, [np.ones(len(r["logprobs"])) for r in rows])
    assert np.any(grad[:, ~world.action_mask] != 0.0)


def test_stale_trajectories_are_dropped_whole_by_flash_reinforce():
    run = train(wai.FlashReinforce(trust=0.02), steps=25, lr=20.0, samples_per_task=4, off_policy_steps=6)
    dropped = 0
    for rows, update in zip(run.batches, run.updates):
        for row, admitted, c in zip(rows, update.admitted, update.coefficients):
            mask = np.asarray(row["action_mask"])
            kl = bernoulli_kl(np.asarray(row["behavior_logprobs"]), np.asarray(row["logprobs"]))[mask].mean()
            assert admitted == (kl <= 0.02)
            if not admitted:
                dropped += 1
                assert np.all(c == 0.0)
    assert dropped > 10
    fresh = train(wai.FlashReinforce(trust=0.02), steps=10, lr=20.0, off_policy_steps=0)
    assert all(u.admitted.all() for u in fresh.updates)  # on-policy: KL is 0, nothing is dropped


def test_stale_tokens_are_masked_by_sao():
    run = train(wai.SAO(), steps=25, lr=20.0, off_policy_steps=6)
    masked = 0
    for rows, update in zip(run.batches, run.updates):
        for row, c, a in zip(rows, update.coefficients, update.advantages):
            mask = np.asarray(row["action_mask"])
            ratio = np.exp(np.asarray(row["logprobs"]) - np.asarray(row["behavior_logprobs"]))
            outside = mask & ((ratio <= 0.7) | (ratio >= 6.0))
            assert np.all(c[outside] == 0.0)
            inside = mask & ~outside & (a != 0)
            assert np.all(c[inside] != 0.0)
            masked += int(outside.sum())
    assert masked > 20
    assert run.rewards[-1] > 0.5


def test_stale_tokens_are_clipped_by_bpco():
    run = train(wai.BPCO(), steps=25, lr=8.0, off_policy_steps=6)
    clipped = 0
    for rows, update in zip(run.batches, run.updates):
        for row, c, a in zip(rows, update.coefficients, update.advantages):
            mask = np.asarray(row["action_mask"])
            behavior = np.asarray(row["behavior_logprobs"])
            ratio = np.exp(np.asarray(row["logprobs"]) - behavior)
            mu = np.exp(behavior)
            bound = np.clip(ratio, 1 - 0.2 / mu, 1 + 0.2 / mu)
            is_clipped = mask & (ratio * a > bound * a)
            assert np.all(c[is_clipped] == 0.0)
            clipped += int(is_clipped.sum())
    assert clipped > 5
    assert run.rewards[-1] > 0.35


def test_the_sampler_lags_the_policy_by_off_policy_steps():
    """At step s the rows' behavior_logprobs come from the table of step s - lag (step 0's while s < lag)."""
    run = train(wai.FlashReinforce(trust=10.0), steps=6, lr=20.0, off_policy_steps=3)
    assert all(np.allclose(r["logprobs"], r["behavior_logprobs"]) for r in run.batches[0])
    later = run.batches[5]
    assert not all(np.allclose(r["logprobs"], r["behavior_logprobs"]) for r in later)


def test_policy_gradient_matches_finite_differences():
    """d/dlogits of sum c log pi, checked numerically on one batch."""
    world = ToyWorld(tasks=2)
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((2, len(world.layout), world.vocab))
    rows = sample_rows(world, logits, logits, rng, 2)
    coefficients = [rng.standard_normal(len(r["logprobs"])) for r in rows]

    def objective(table):
        lp = log_softmax(table)
        return sum(float(np.sum(c * lp[int(r["task_id"][1:]), np.arange(len(c)), r["tokens"]]))
                   for r, c in zip(rows, coefficients))
    grad = policy_gradient(world, logits, rows, coefficients)
    eps = 1e-6
    for index in [(0, 0, 1), (1, 3, 2), (0, 5, 0)]:
        bumped = logits.copy()
        bumped[index] += eps
        assert grad[index] == pytest.approx((objective(bumped) - objective(logits)) / eps, rel=1e-4, abs=1e-6)


def test_reinforce_ada_sampling_loop_on_the_toy():
    """Drive plan() with the toy sampler: sample only the prompts it asks for until it is finished.

    Pass = reward >= 0.75 (3 of 4 action tokens right): about 5% of draws under the uniform table, so
    some prompts exit (2 passes, 2 fails) and the rest stop at the budget of 4 rounds x 8 rollouts.
    """
    world = ToyWorld(tasks=6)
    logits = np.zeros((world.tasks, len(world.layout), world.vocab))
    ada = wai.methods.ReinforceAda(pass_reward=0.75)
    rng = np.random.default_rng(0)
    collected: list = []
    plan = ada.plan(collected, tasks=[f"t{i}" for i in range(world.tasks)])
    rounds = 0
    while not plan.finished:
        fresh = sample_rows(world, logits, logits, rng, ada.round_size)
        collected += [r for r in fresh if r["task_id"] in plan.resample]
        plan = ada.plan(collected)
        rounds += 1
    assert rounds <= ada.max_rounds
    counts = {task: sum(r["task_id"] == task for r in collected) for task in plan.done + plan.exhausted}
    assert set(counts) == {f"t{i}" for i in range(world.tasks)}
    for task in plan.exhausted:
        assert counts[task] == ada.round_size * ada.max_rounds
    for task in plan.done:
        passes = sum(r["reward"] >= 0.75 for r in collected if r["task_id"] == task)
        assert passes >= 2 and counts[task] - passes >= 2
    update = ada.update(collected)
    kept = [r for r, k in zip(collected, update.admitted) if k]
    for task in plan.done:  # each exited prompt trains on 2 passes and 2 fails
        rewards = sorted(r["reward"] >= 0.75 for r in kept if r["task_id"] == task)
        assert rewards == [False, False, True, True]
