"""AdamW past its first step, where the betas show: step 1's bias correction makes m_hat = g and v_hat = g^2 for
any betas, so only a later step tells beta1 (the mean's decay) from beta2 (the variance's)."""

from __future__ import annotations

import pytest
import torch

from whileai.engine import AdamParams, TrainingEngine, make_datum


def _grads(engine: TrainingEngine) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().double().clone() for n, p in engine.named_params.items() if p.grad is not None}


@pytest.mark.parametrize("beta1,beta2", [(0.9, 0.95), (0.5, 0.999)])
def test_the_second_adamw_step_matches_the_hand_formula_with_each_beta_in_its_place(beta1, beta2):
    """m_2 = b1 (1 - b1) g_1 + (1 - b1) g_2, v_2 = b2 (1 - b2) g_1^2 + (1 - b2) g_2^2,
    w_2 = w_1 - lr (m_2 / (1 - b1^2)) / (sqrt(v_2 / (1 - b2^2)) + eps). Two different batches give g_1 != g_2,
    so swapping the betas moves the weights elsewhere (by ~lr, far above the tolerance)."""
    lr, eps = 0.01, 1e-8
    adam = AdamParams(learning_rate=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=0.0)
    engine = TrainingEngine("builtin:tiny", seed=3)
    engine.forward_backward([make_datum([1, 10, 11], [12, 13, 2])], "cross_entropy")
    g1 = _grads(engine)
    engine.optim_step(adam)
    after_one = {n: p.detach().double().clone() for n, p in engine.named_params.items()}
    engine.forward_backward([make_datum([1, 40, 41, 42], [44, 45], weights=[-1.0, 2.0])], "cross_entropy")
    g2 = _grads(engine)
    engine.optim_step(adam)
    moved = 0
    for name, p in engine.named_params.items():
        if name not in g1 or name not in g2:
            continue
        m = (beta1 * (1 - beta1) * g1[name] + (1 - beta1) * g2[name]) / (1 - beta1 ** 2)
        v = (beta2 * (1 - beta2) * g1[name] ** 2 + (1 - beta2) * g2[name] ** 2) / (1 - beta2 ** 2)
        want = after_one[name] - lr * m / (v.sqrt() + eps)
        torch.testing.assert_close(p.detach().double(), want, rtol=1e-4, atol=1e-6, msg=name)
        moved += 1
    assert moved > 0
