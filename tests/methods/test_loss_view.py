"""The named-loss contract: a method whose run spec names an engine loss sends ``Update.advantages`` with the
sampler's logprobs, and its ``Update.coefficients`` are that loss's gradient at the rows' logprobs. So the
engine's named loss on the advantages and the kernel ``cross_entropy`` with weights c give the same gradient,
for every named loss, off-policy (ratios far from 1, clips binding) and with observation tokens in the rows."""

from __future__ import annotations

import numpy as np
import pytest

import whileai as wai
from whileai.engine import TrainingEngine, make_datum

PROMPT = [1, 100, 101]


@pytest.fixture(scope="module")
def rows_and_engine():
    engine = TrainingEngine("builtin:tiny", seed=3)
    rng = np.random.default_rng(4)
    rows = []
    for i in range(8):
        tokens = rng.integers(3, 259, int(rng.integers(2, 6))).tolist()
        probe = make_datum(PROMPT, tokens)
        logprobs = engine.forward([probe]).loss_fn_outputs[0]["logprobs"][-len(tokens):].astype(np.float64)
        behavior = np.minimum(logprobs + rng.normal(0, 0.6, len(tokens)), -1e-4)
        mask = rng.random(len(tokens)) > 0.2
        mask[0] = True
        rows.append({"reward": float(rng.integers(0, 2)), "task_id": f"t{i % 2}", "tokens": tokens,
                     "logprobs": logprobs.tolist(), "behavior_logprobs": behavior.tolist(),
                     "action_mask": mask.tolist(), "ref_logprobs": (behavior - 0.1).tolist(),
                     "teacher_logprobs": np.minimum(behavior + rng.normal(0, 0.5, len(tokens)), -1e-4).tolist()})
    return rows, engine


def gradient(engine, data, loss, config=None):
    engine.optimizer.zero_grad(set_to_none=True)
    engine.forward_backward(data, loss, config)
    return np.concatenate([p.grad.detach().numpy().ravel() for p in engine.named_params.values()
                           if p.grad is not None])


METHODS = [wai.PPO(), wai.PPO(clip=0.05, clip_high=0.1), wai.CISPO(clip=0.1, clip_high=0.1), wai.GSPO(clip=0.01),
           wai.DPPO(delta_low=0.02, delta_high=0.02), wai.DPPO(divergence="binary_kl", delta_low=0.01, delta_high=0.01),
           wai.SAPO(tau_pos=2.0), wai.DAPO(truncated="keep"), wai.method("grpo_len_norm"), wai.method("grpo_nostd"),
           wai.RLOO(loss="ppo", clip=0.1), wai.MaxRL(loss="cispo"), wai.ReinforcePP(),
           wai.OPD(loss="importance_sampling", max_ratio=None, kl_coef=0.5),
           wai.CustomLoss(advantages=lambda b: b.rewards_B - 0.5, loss="gspo", clip=0.02)]


@pytest.mark.parametrize("chosen", METHODS, ids=lambda m: f"{m.name}-{m.run_spec().loss}")
def test_named_loss_on_the_advantages_has_the_gradient_of_the_kernel_on_the_coefficients(rows_and_engine, chosen):
    rows, engine = rows_and_engine
    spec = chosen.run_spec()
    assert spec.loss != "cross_entropy"
    update = chosen.update([{k: v for k, v in r.items() if k != "tokens"} for r in rows])
    named, kernel = [], []
    for r, a, c in zip(rows, update.advantages, update.coefficients):
        mask = np.asarray(r["action_mask"], dtype=float)
        named.append(make_datum(PROMPT, r["tokens"], logprobs=r["behavior_logprobs"], advantages=a.tolist(),
                                weights=mask.tolist()))
        kernel.append(make_datum(PROMPT, r["tokens"], weights=c.tolist()))
    assert any(np.any(a != 0) for a in update.advantages)
    g_named = gradient(engine, named, spec.loss, dict(spec.loss_config) or None)
    g_kernel = gradient(engine, kernel, "cross_entropy")
    assert np.abs(g_kernel).max() > 1e-6
    # float32 weights: the two backward passes agree to float32 rounding, not to float64
    np.testing.assert_allclose(g_named, g_kernel, rtol=1e-4, atol=1e-5 * np.abs(g_kernel).max())
