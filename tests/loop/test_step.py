"""The step: micro-batching changes no gradient; the scoring pass is skippable exactly at lag 0."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import whileai as wai
from whileai.engine import SamplingParams, TrainingEngine
from whileai.loop.step import datum, policy_step, score


def _rows(engine: TrainingEngine, temperature: float = 1.0, n: int = 6) -> list[dict]:
    prompts = [[1, 70 + i, 71 + i] for i in range(n)]
    samples = engine.sample(prompts, 1, SamplingParams(max_tokens=5, temperature=temperature, seed=3))
    return [{"prompt_tokens": p, "tokens": s[0].tokens, "behavior_logprobs": s[0].logprobs, "task_id": str(i // 2),
             "reward": float(i % 2)} for i, (p, s) in enumerate(zip(prompts, samples))]


def _grads(engine: TrainingEngine) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in engine.named_params.items() if p.grad is not None}


def test_micro_batches_give_the_single_pass_gradient():
    big = TrainingEngine("builtin:tiny", seed=1, micro_batch_tokens=8192)
    small = TrainingEngine("builtin:tiny", seed=1, micro_batch_tokens=16)  # about one row per forward
    rows = _rows(big)
    coefficients = wai.FlashReinforce().update([{**r, "logprobs": r["behavior_logprobs"]} for r in rows]).coefficients
    data = [datum(r, weights=c) for r, c in zip(rows, coefficients)]
    big.forward_backward(data, "cross_entropy")
    small.forward_backward(data, "cross_entropy")
    one, many = _grads(big), _grads(small)
    assert one.keys() == many.keys() and one
    for name in one:
        torch.testing.assert_close(many[name], one[name], rtol=1e-5, atol=1e-7)


def test_at_lag_0_the_sampler_logprobs_are_the_policys_and_after_a_step_they_are_not():
    engine = TrainingEngine("builtin:tiny", seed=2)
    for temperature in (1.0, 0.7):
        rows = _rows(engine, temperature)
        scored = score(engine, rows, sampling_params={"max_tokens": 5, "temperature": temperature})
        for row, logprobs in zip(rows, scored):
            np.testing.assert_allclose(logprobs, row["behavior_logprobs"], atol=1e-4)
    result = policy_step(engine, wai.GRPO(rollouts_per_prompt=2), rows, adam={"learning_rate": 0.05},
                         sampling_params={"max_tokens": 5, "temperature": 0.7}, rescore=False)
    assert result.metrics["drift"] == 0.0  # the same numbers stood in for the policy's
    rescored = score(engine, rows, sampling_params={"max_tokens": 5, "temperature": 0.7})
    gap = max(np.max(np.abs(np.subtract(a, r["behavior_logprobs"]))) for a, r in zip(rescored, rows))
    assert gap > 1e-3  # one optimizer step later the sampler's numbers are stale: lag is real


def test_a_critic_warm_up_step_leaves_the_policy_alone():
    engine = TrainingEngine("builtin:tiny", seed=3)
    engine.add_critic(1e-2)
    rows = _rows(engine)
    before = {n: p.detach().clone() for n, p in engine.named_params.items()}
    head = [p.detach().clone() for p in engine.critic.head.parameters()]
    out = policy_step(engine, wai.SAO(), rows, adam={"learning_rate": 0.1}, train_policy=False, critic_steps=1)
    assert "critic_loss" in out.metrics
    for n, p in engine.named_params.items():
        assert torch.equal(p, before[n]), n
    assert any(not torch.equal(a, b) for a, b in zip(head, engine.critic.head.parameters()))


def test_the_single_pass_equals_score_then_train():
    """Where the batch fits, one forward scores and trains; the weights after the step are the two-pass ones."""
    one = TrainingEngine("builtin:tiny", seed=4)
    two = TrainingEngine("builtin:tiny", seed=4)
    rows = _rows(one, 0.8)
    stale = [{**r, "behavior_logprobs": [x - 0.05 for x in r["behavior_logprobs"]]} for r in rows]  # lag > 0
    params = {"max_tokens": 5, "temperature": 0.8}
    a = policy_step(one, wai.GRPO(rollouts_per_prompt=2), stale, adam={"learning_rate": 0.05}, sampling_params=params,
                    single_pass_tokens=10_000)
    b = policy_step(two, wai.GRPO(rollouts_per_prompt=2), stale, adam={"learning_rate": 0.05}, sampling_params=params,
                    single_pass_tokens=0)
    assert a.metrics["loss"] == pytest.approx(b.metrics["loss"], rel=1e-6, abs=1e-9)
    for c1, c2 in zip(a.update.coefficients, b.update.coefficients):
        np.testing.assert_allclose(c1, c2, rtol=1e-6, atol=1e-9)
    for name, p in one.named_params.items():
        torch.testing.assert_close(p, two.named_params[name], rtol=1e-5, atol=1e-6)


def test_step_stats_report_reply_lengths_over_every_row_and_the_failed_ones():
    """Rows of 3, 5 (2 of them the env's) and 1 tokens with rewards 1, 0, 0.5: replies 3, 3, 1 action tokens,
    mean 7/3; the two that did not pass (reward < 1) average (3 + 1) / 2 = 2."""
    from types import SimpleNamespace

    from whileai.loop.step import step_stats

    rows = [{"reward": 1.0, "tokens": [1, 2, 3]},
            {"reward": 0.0, "tokens": [1, 2, 3, 4, 5], "action_mask": [True, False, False, True, True]},
            {"reward": 0.5, "tokens": [7]}]
    stats = step_stats(SimpleNamespace(admitted=[True] * 3, stats={}, drift=None), rows)
    assert stats["reply_tokens"] == pytest.approx(7 / 3) and stats["failed_reply_tokens"] == 2.0
    passed = step_stats(SimpleNamespace(admitted=[True], stats={}, drift=None), rows[:1])
    assert passed["reply_tokens"] == 3.0 and "failed_reply_tokens" not in passed


def test_settings_the_run_cannot_follow_as_given_are_said_in_the_log(tmp_path, capsys):
    """--set max_tokens=2 on builtin:case (cap 4): the run samples to 4 and its log says so, naming --max-tokens;
    eval_tasks beyond the test split: the log says how many are scored."""
    import whileai as wai

    run = wai.train(method="grpo", knobs={"max_tokens": 2}, steps=1, rollouts_per_step=8, eval_tasks=300,
                    eval_samples=1, warm_start_steps=0, progress=False, export=False, run_dir=str(tmp_path / "r"))
    out = capsys.readouterr()
    text = out.out + out.err
    assert "sampling: temperature 1, max_tokens 4" in text
    assert "note: the method's max_tokens 2 (--set) is not the sampling cap: the taskset's cap, 4, is" in text
    assert "note: eval_tasks 300, but the taskset's test split holds 256 tasks: every evaluation scores all 256" in text
    assert run.summary["eval_after"]["tasks"] == 256


def test_no_progress_also_silences_transformers_bars_and_sets_them_back(tmp_path, capsys):
    """A model loaded from a folder shows transformers' 'Loading weights' bar; progress=False hides it for the
    run, and the global setting is as it was afterwards."""
    from transformers.utils import logging as hf_logging

    import whileai as wai
    from whileai.engine.models import build_builtin

    model, tokenizer = build_builtin("tiny")
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    assert hf_logging.is_progress_bar_enabled()
    wai.train(model=str(tmp_path / "m"), steps=1, rollouts_per_step=8, eval_tasks=0, progress=False, export=False,
              run_dir=str(tmp_path / "r"))
    out = capsys.readouterr()
    assert "Loading weights" not in out.err + out.out and hf_logging.is_progress_bar_enabled()


def test_the_drift_metric_is_the_methods_own_kl_where_it_measures_one_else_the_k3_estimate():
    """FlashReinforce measures drift as its Bernoulli KL(mu || pi) per token: a row whose one token the sampler gave
    0.9 and the policy 0.5 drifts by 0.9 ln(0.9/0.5) + 0.1 ln(0.1/0.5) = 0.368064, a row with both at 0.5 by 0, so
    the step's drift is their mean 0.184032; the k3 estimate on the same rows, (r - 1 - ln r) / 2 with r = 5/9,
    is 0.071671. A method that measures none (GRPO) gets k3."""
    from whileai.loop.step import step_stats

    rows = [{"prompt_tokens": [1, 5], "tokens": [7], "task_id": "a", "reward": reward,
             "behavior_logprobs": [np.log(mu)], "logprobs": [np.log(0.5)]} for reward, mu in ((1.0, 0.9), (0.0, 0.5))]
    bernoulli = (0.9 * np.log(0.9 / 0.5) + 0.1 * np.log(0.1 / 0.5)) / 2
    r = 0.5 / 0.9
    k3 = (r - 1 - np.log(r)) / 2
    assert bernoulli == pytest.approx(0.184032, abs=1e-6) and k3 == pytest.approx(0.071671, abs=1e-6)
    for method, want in ((wai.FlashReinforce(trust=10.0), bernoulli), (wai.GRPO(rollouts_per_prompt=2), k3)):
        update = method.update([{k: v for k, v in row.items() if k != "prompt_tokens"} for row in rows])
        assert step_stats(update, rows)["drift"] == pytest.approx(want, rel=1e-9)
