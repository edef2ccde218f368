"""The kernel -sum w * log p: its gradients, and the chunked log-probabilities it reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from whileai.engine import TrainingEngine, make_datum
from whileai.engine.logprobs import (
    hidden_states,
    naive_logprobs,
    select_logprobs,
    token_logprobs,
    topk_logprobs,
)
from whileai.engine.losses import LOSSES, per_token_loss


@pytest.fixture(scope="module")
def engine64():
    """The tiny built-in in float64, full fine-tuning: finite differences and exact comparisons."""
    return TrainingEngine("builtin:tiny", dtype="float64", seed=3)


def test_kernel_gradient_wrt_logprobs_is_minus_the_weights():
    """d/d(log p) of -sum w log p is -w, for any float weights (negative ones too), (N) and (N, K)."""
    gen = torch.Generator().manual_seed(0)
    for shape in [(7,), (5, 3)]:
        logp = (-torch.rand(shape, generator=gen, dtype=torch.float64) * 5).requires_grad_()
        weights = torch.randn(shape, generator=gen, dtype=torch.float64)
        loss = per_token_loss(LOSSES["cross_entropy"], logp, {"weights": weights}, {}).sum()
        loss.backward()
        torch.testing.assert_close(logp.grad, -weights, rtol=0, atol=0)
        torch.testing.assert_close(loss, -(weights * logp).sum())


def test_kernel_gradient_wrt_parameters_matches_finite_differences(engine64):
    """Engine gradient of cross_entropy vs central differences on a float64 tiny model.

    The checked entry of each tensor is its largest-gradient one. Qwen2's RMSNorm and rotary
    embedding compute in float32 even in a float64 model, so the loss carries ~1e-7 relative
    rounding: h = 1e-3 keeps that noise and the O(h^2) truncation both below 0.3% (measured).
    """
    datum = make_datum([1, 40, 41, 42], [50, 51, 52, 2], weights=[0.5, -1.25, 2.0, 0.75])
    k2 = {"model_input": [1, 60, 61], "loss_fn_inputs": {
        "target_tokens": [[60, 7], [61, 8], [62, 9]], "weights": [[1.0, -0.5], [0.0, 0.0], [0.3, 2.0]]}}
    data = [datum, k2]
    engine64.zero_grad()
    engine64.forward_backward(data, "cross_entropy")
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.v_proj.bias",
             "model.layers.1.post_attention_layernorm.weight", "lm_head.weight"]
    h = 1e-3
    for name in names:
        p = engine64.named_params[name]
        flat = p.data.view(-1)
        j = int(p.grad.abs().view(-1).argmax())
        analytic, old = float(p.grad.view(-1)[j]), float(flat[j])
        losses = []
        for sign in (1, -1):
            flat[j] = old + sign * h
            losses.append(engine64.forward(data, "cross_entropy").metrics["loss:sum"])
        flat[j] = old
        numeric = (losses[0] - losses[1]) / (2 * h)
        assert abs(analytic) > 1e-2, name  # a real gradient, so the comparison means something
        assert analytic == pytest.approx(numeric, rel=3e-3), name
    engine64.zero_grad()


@pytest.fixture(scope="module")
def engine32():
    """The tiny built-in as used everywhere: float32, full fine-tuning."""
    return TrainingEngine("builtin:tiny", seed=3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chunked_logprobs_equal_the_naive_log_softmax(engine32, seed):
    """Chunks of 3 positions over a 17-token sequence give the naive full-logits values."""
    model = engine32.model
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 259, (1, 17), generator=gen)
    targets = torch.randint(0, 259, (1, 17), generator=gen)
    with torch.no_grad():
        naive = naive_logprobs(model, ids, targets)[0]
        hidden = hidden_states(model, ids)[0]
        chunked = token_logprobs(model, hidden, targets[0], chunk_size=3)
    torch.testing.assert_close(chunked, naive, rtol=1e-5, atol=1e-5)
    # only the asked positions are scored; the rest are exactly 0
    positions = torch.zeros(17, dtype=torch.bool)
    positions[[2, 5, 11]] = True
    with torch.no_grad():
        some = token_logprobs(model, hidden, targets[0], positions, chunk_size=2)
    torch.testing.assert_close(some[positions], naive[positions], rtol=1e-5, atol=1e-5)
    assert torch.all(some[~positions] == 0)


def test_chunked_logprob_gradients_equal_the_naive_ones(engine64):
    """Activation checkpointing per chunk must not change the gradient w.r.t. hidden states or weights."""
    model = engine64.model
    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])
    targets = torch.tensor([5, 9, 13, 17, 21, 25, 29, 2])
    weights = torch.linspace(-1, 2, 8, dtype=torch.float64)
    head = model.get_output_embeddings().weight

    def grads(chunked: bool):
        model.zero_grad()
        hidden = hidden_states(model, ids)[0]
        if chunked:
            logp = select_logprobs(model, hidden, targets[:, None], chunk_size=3).squeeze(-1)
        else:
            logp = torch.log_softmax(model.get_output_embeddings()(hidden), -1).gather(-1, targets[:, None])[:, 0]
        (-(weights * logp.double())).sum().backward()
        return head.grad.clone(), model.model.embed_tokens.weight.grad.clone()

    for a, b in zip(grads(True), grads(False)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    model.zero_grad()


def test_topk_matches_a_full_sort(engine32):
    model = engine32.model
    ids = torch.tensor([[1, 70, 80, 90, 100]])
    with torch.no_grad():
        hidden = hidden_states(model, ids)[0]
        top_ids, top_lp = topk_logprobs(model, hidden, 4, chunk_size=2)
        full = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    want = full.sort(-1, descending=True)
    torch.testing.assert_close(top_lp, want.values[:, :4], rtol=1e-5, atol=1e-5)
    assert torch.equal(top_ids, want.indices[:, :4])


def test_compute_logprobs_matches_forward_and_lists_top_k(engine32):
    """compute_logprobs(tokens) = [None] + the datum logprobs of tokens[1:]; top-k sorted, first = argmax."""
    tokens = [1, 72, 101, 108, 108, 111]
    got = engine32.compute_logprobs(tokens, top_k=3)
    datum = {"model_input": tokens[:-1], "loss_fn_inputs": {"target_tokens": tokens[1:], "weights": [1.0] * 5}}
    want = engine32.forward([datum]).loss_fn_outputs[0]["logprobs"]
    assert got["logprobs"][0] is None and got["topk"][0] is None
    np.testing.assert_allclose(got["logprobs"][1:], want, rtol=1e-6)
    for alternatives in got["topk"][1:]:
        values = [lp for _, lp in alternatives]
        assert len(alternatives) == 3 and values == sorted(values, reverse=True)
    # the actual next token's logprob can never exceed the best alternative
    assert all(lp <= alts[0][1] + 1e-12 for lp, alts in zip(got["logprobs"][1:], got["topk"][1:]))
