"""TrainingEngine: accumulation, SFT that works, the optimizer, the method bridge, bad input."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from whileai.engine import AdamParams, SamplingParams, TrainingEngine, make_datum, sft_datum
from whileai.errors import WhileaiError


def grads(engine: TrainingEngine) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in engine.named_params.items() if p.grad is not None}


def mixed_batch() -> list[dict]:
    """Four datums of different lengths: SFT-like weights, negative weights, and (N, 2) targets."""
    return [
        make_datum([1, 10, 11], [12, 13, 14, 2]),
        make_datum([1, 20], [21, 22], weights=[-0.5, 2.0]),
        {"model_input": [1, 30, 31], "loss_fn_inputs": {"target_tokens": [30, 31, 32], "weights": [0.0, 1.0, 0.25]}},
        make_datum([1, 40, 41, 42, 43], [44, 2], weights=[1.5, 1.0]),
    ]


# ----------------------------------------------------------------------------- accumulation
def test_one_call_on_a_batch_equals_two_calls_on_its_halves():
    engine = TrainingEngine("builtin:tiny", seed=4)
    data = mixed_batch()
    engine.forward_backward(data, "cross_entropy")
    whole = grads(engine)
    engine.zero_grad()
    first = engine.forward_backward(data[:2], "cross_entropy").metrics["loss:sum"]
    second = engine.forward_backward(data[2:], "cross_entropy").metrics["loss:sum"]
    halves = grads(engine)
    assert whole.keys() == halves.keys() and len(whole) == len(engine.named_params)
    for name in whole:
        torch.testing.assert_close(halves[name], whole[name], rtol=1e-5, atol=1e-5)
    engine.zero_grad()
    assert engine.forward(data, "cross_entropy").metrics["loss:sum"] == pytest.approx(first + second, rel=1e-6)


def test_micro_batching_does_not_change_the_gradient():
    """micro_batch_tokens=6 runs every datum alone (padded batches otherwise); same gradient."""
    big = TrainingEngine("builtin:tiny", seed=4)
    small = TrainingEngine("builtin:tiny", seed=4, micro_batch_tokens=6)
    data = mixed_batch()
    big.forward_backward(data, "cross_entropy")
    small.forward_backward(data, "cross_entropy")
    for (name, a), b in zip(grads(big).items(), grads(small).values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=name)


# ----------------------------------------------------------------------------- SFT end to end
def test_sft_drives_the_loss_down_and_greedy_sampling_reproduces_the_strings():
    engine = TrainingEngine("builtin:tiny", seed=0)
    tok = engine.tokenizer
    pairs = [("a=", "cat"), ("b=", "dog"), ("c=", "fish"), ("d=", "bird")]
    data = [sft_datum(tok, prompt, completion) for prompt, completion in pairs]
    losses = []
    for _ in range(40):
        losses.append(engine.forward_backward(data, "cross_entropy").metrics["loss:sum"])
        engine.optim_step(AdamParams(learning_rate=1e-2))
    # 18 target tokens at ~log(259) = 5.56 nats each -> ~100 nats at the start
    assert losses[0] > 80 and losses[-1] < 0.05 * losses[0]
    prompts = [tok.encode(p) for p, _ in pairs]  # the tokenizer adds BOS
    samples = engine.sample(prompts, 1, SamplingParams(max_tokens=8, temperature=0))
    for (_, completion), (seq,) in zip(pairs, samples):
        assert tok.decode(seq.tokens) == completion + tok.eos_token and seq.stop_reason == "stop"


# ----------------------------------------------------------------------------- optimizer
def test_first_adamw_step_matches_the_hand_formula():
    """Step 1 of AdamW: m_hat = g, v_hat = g^2, so w <- w (1 - lr wd) - lr g / (|g| + eps).
    With lr = 0.01, wd = 0.5, eps = 1e-8 every weight with a gradient moves by ~0.01 plus decay."""
    engine = TrainingEngine("builtin:tiny", seed=1)
    engine.forward_backward(mixed_batch(), "cross_entropy")
    before = {n: p.detach().clone() for n, p in engine.named_params.items()}
    g = grads(engine)
    norm = torch.sqrt(sum((x.double() ** 2).sum() for x in g.values()))
    out = engine.optim_step(AdamParams(learning_rate=0.01, weight_decay=0.5, eps=1e-8))
    assert out.grad_norm == pytest.approx(float(norm), rel=1e-5) and float(out) == out.grad_norm
    for name, p in engine.named_params.items():
        want = before[name] * (1 - 0.01 * 0.5) - 0.01 * g[name] / (g[name].abs() + 1e-8)
        torch.testing.assert_close(p.detach(), want, rtol=1e-5, atol=1e-6, msg=name)
    assert engine.step == 1 and all(p.grad is None for p in engine.named_params.values())


def test_grad_clip_norm_scales_the_gradient_before_the_step():
    """eps = 1 makes the step depend on |g|: w <- w - lr g_c / (|g_c| + 1), g_c = g * clip / norm."""
    engine = TrainingEngine("builtin:tiny", seed=1)
    engine.forward_backward(mixed_batch(), "cross_entropy")
    before = {n: p.detach().clone() for n, p in engine.named_params.items()}
    g = grads(engine)
    out = engine.optim_step(AdamParams(learning_rate=0.1, eps=1.0, grad_clip_norm=0.5))
    scale = 0.5 / out.grad_norm
    assert out.grad_norm > 1.0  # the clip is active
    for name, p in engine.named_params.items():
        clipped = g[name] * scale
        torch.testing.assert_close(p.detach(), before[name] - 0.1 * clipped / (clipped.abs() + 1.0),
                                   rtol=1e-4, atol=1e-7, msg=name)


def test_bad_adam_params_and_non_finite_losses_are_refused():
    with pytest.raises(ValueError, match="AdamParams.beta2=1.0"):
        AdamParams(beta2=1.0)
    with pytest.raises(ValueError, match=r"AdamParams.eps=0 must be > 0: a weight whose gradient is 0 would become NaN"):
        AdamParams(eps=0.0)
    with pytest.raises(ValueError, match="AdamParams.learning_rate=-0.1"):
        AdamParams(learning_rate=-0.1)
    engine = TrainingEngine("builtin:tiny", seed=1)
    # r = exp(log p + 1000) overflows even in float64: refuse, add no gradient
    datum = make_datum([1, 5], [6, 7], logprobs=[-1000.0, -1000.0], advantages=[1.0, 1.0])
    with pytest.raises(WhileaiError, match="loss 'importance_sampling' is -inf on datums 0..0"):
        engine.forward_backward([datum], "importance_sampling")
    assert all(p.grad is None for p in engine.named_params.values())


# ----------------------------------------------------------------------------- sampler versions
def test_sampler_versions_keep_old_weights_usable():
    engine = TrainingEngine("builtin:tiny", seed=6)
    tokens = [1, 50, 60, 70, 80]
    at_start = engine.compute_logprobs(tokens)["logprobs"]
    assert engine.save_weights_for_sampler() == 0
    engine.forward_backward([make_datum([1, 50], [60, 70, 80])], "cross_entropy")
    engine.optim_step(AdamParams(learning_rate=1e-2))
    after = engine.compute_logprobs(tokens)["logprobs"]
    assert after[1:] != pytest.approx(at_start[1:], abs=1e-3)
    with engine.weights(0):
        assert engine.compute_logprobs(tokens)["logprobs"][1:] == pytest.approx(at_start[1:], abs=1e-6)
    assert engine.compute_logprobs(tokens)["logprobs"][1:] == pytest.approx(after[1:], abs=1e-6)
    old = engine.sample([1, 50], 2, SamplingParams(max_tokens=4, seed=3), version=0)
    with engine.weights(0):
        assert engine.sample([1, 50], 2, SamplingParams(max_tokens=4, seed=3)) == old
    with pytest.raises(ValueError, match=r"no sampler weights of version 7; saved versions: \[0\]"):
        engine.sample([1, 50], 1, SamplingParams(max_tokens=2), version=7)


def test_a_sampler_version_is_usable_several_steps_later_until_it_is_evicted():
    """Samples from version 0 taken three steps later equal the samples taken at step 0; the
    keep_sampler_versions=4 most recent snapshots are kept, so a fifth save evicts version 0."""
    engine = TrainingEngine("builtin:tiny", seed=6, keep_sampler_versions=4)
    params = SamplingParams(max_tokens=6, seed=5)
    at_start = engine.sample([1, 50], 3, params)
    engine.save_weights_for_sampler()
    for _ in range(3):
        engine.forward_backward([make_datum([1, 50], [60, 70, 80])], "cross_entropy")
        engine.optim_step(AdamParams(learning_rate=5e-2))
        engine.save_weights_for_sampler()
    assert engine.step == 3 and sorted(engine.sampler_weights) == [0, 1, 2, 3]
    assert engine.sample([1, 50], 3, params) != at_start  # the policy moved
    assert engine.sample([1, 50], 3, params, version=0) == at_start
    assert engine.sample([1, 50], 3, params) != at_start  # and the current weights are back
    engine.forward_backward([make_datum([1, 50], [60, 70, 80])], "cross_entropy")
    engine.optim_step(AdamParams(learning_rate=5e-2))
    engine.save_weights_for_sampler()
    with pytest.raises(ValueError, match=r"no sampler weights of version 0; saved versions: \[1, 2, 3, 4\]"):
        engine.sample([1, 50], 1, params, version=0)


# ----------------------------------------------------------------------------- the method bridge


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("datum, message", [
    ({"model_input": [1, 2, 3], "loss_fn_inputs": {"target_tokens": [2, 3, 259], "weights": [1, 1, 1]}},
     r"datum 1 loss_fn_inputs\['target_tokens'\]: token 259 at position 2 is outside the vocabulary \[0, 259\)"),
    ({"model_input": [1, 2, 3], "loss_fn_inputs": {"target_tokens": [2, 3, 4], "weights": [1, 1]}},
     r"datum 1: loss_fn_inputs\['weights'\] has shape \(2,\) but model_input has 3 positions"),
    ({"model_input": [], "loss_fn_inputs": {"target_tokens": [], "weights": []}},
     r"datum 1: model_input is empty"),
    ({"model_input": list(range(3, 259)) + [3], "loss_fn_inputs": {"target_tokens": [3] * 257, "weights": [1] * 257}},
     r"datum 1: model_input has 257 positions but the model's context is 256; position 256 is past it"),
    ({"model_input": [1, 2], "loss_fn_inputs": {"target_tokens": [2, 3], "weights": [1, float("nan")]}},
     r"datum 1: loss_fn_inputs\['weights'\] is nan at position 1"),
    ({"model_input": [1, 2], "loss_fn_inputs": {"target_tokens": [2, 3]}},
     r"datum 1: loss 'cross_entropy' needs loss_fn_inputs \['weights'\]"),
    ({"model_input": [1, 2], "loss_fn_inputs": {"target_tokens": [2, 3], "weights": [1, 1], "advantage": [1, 1]}},
     r"datum 1: loss 'cross_entropy' does not read loss_fn_inputs \['advantage'\]"),
    ({"model_input": [1, -2], "loss_fn_inputs": {"target_tokens": [2, 3], "weights": [1, 1]}},
     r"datum 1 model_input: token -2 at position 1 is outside the vocabulary"),
])
def test_bad_datums_name_the_datum_and_position(datum, message):
    engine = TrainingEngine("builtin:tiny", seed=0)
    good = make_datum([1, 2], [3, 4])
    with pytest.raises(ValueError, match=message):
        engine.forward_backward([good, datum], "cross_entropy")
    assert all(p.grad is None for p in engine.named_params.values())  # validated before any forward


def test_compute_logprobs_refuses_bad_sequences():
    engine = TrainingEngine("builtin:tiny", seed=0)
    with pytest.raises(ValueError, match="token 300 at position 2 is outside the vocabulary"):
        engine.compute_logprobs([1, 2, 300])
    with pytest.raises(ValueError, match="the model's context is 256"):
        engine.compute_logprobs([1] * 300)
    with pytest.raises(ValueError, match="top_k=-1 must be an integer in"):
        engine.compute_logprobs([1, 2], top_k=-1)
    with pytest.raises(ValueError, match="reference=True"):
        engine.compute_logprobs([1, 2], reference=True)


def test_tinker_wire_forms_equal_plain_lists():
    """ModelInput chunks and TensorData dicts (Tinker's JSON shapes) read the same as plain lists,
    and (N, K) importance sampling is the sum over slots of -exp(p - q) * A."""
    engine = TrainingEngine("builtin:tiny", seed=0)
    plain = {"model_input": [1, 5, 6, 7], "loss_fn_inputs": {
        "target_tokens": [[5, 9], [6, 9], [7, 9], [8, 9]], "logprobs": [[-5.0, -6.0]] * 4,
        "advantages": [[1.0, -0.5]] * 4}}
    wire = {"model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 5]}, {"tokens": [6, 7]}]},
            "loss_fn_inputs": {
                "target_tokens": {"data": [5, 9, 6, 9, 7, 9, 8, 9], "dtype": "int64", "shape": [4, 2]},
                "logprobs": {"data": [-5.0, -6.0] * 4, "dtype": "float32", "shape": [4, 2]},
                "advantages": {"data": [1.0, -0.5] * 4, "dtype": "float32", "shape": [4, 2]}}}
    a = engine.forward([plain], "importance_sampling")
    b = engine.forward([wire], "importance_sampling")
    assert a.metrics == b.metrics
    p = a.loss_fn_outputs[0]["logprobs"].astype(np.float64)
    assert p.shape == (4, 2)
    q, adv = np.array([[-5.0, -6.0]] * 4), np.array([[1.0, -0.5]] * 4)
    assert a.metrics["loss:sum"] == pytest.approx(np.sum(-np.exp(p - q) * adv), rel=1e-9)
    assert a.to_dict()["loss_fn_outputs"][0]["logprobs"] == p.astype(np.float32).tolist()


def test_params_as_json_dicts_equal_the_dataclasses_and_bad_ones_name_the_fields():
    """The service passes AdamParams / SamplingParams / loss_fn_config as JSON dicts."""
    a, b = TrainingEngine("builtin:tiny", seed=0), TrainingEngine("builtin:tiny", seed=0)
    for engine, adam in ((a, AdamParams(learning_rate=1e-2, weight_decay=0.1)),
                         (b, {"learning_rate": 1e-2, "weight_decay": 0.1})):
        engine.forward_backward([make_datum([1, 5], [6, 7])], "cross_entropy")
        engine.optim_step(adam)
    assert all(torch.equal(x, y) for x, y in zip(a.named_params.values(), b.named_params.values()))
    assert a.sample([1, 5], 2, {"max_tokens": 3, "seed": 1}) == a.sample([1, 5], 2, SamplingParams(max_tokens=3, seed=1))
    with pytest.raises(ValueError, match=r"adam_params has unknown fields \['lr'\]; AdamParams has \['learning_rate'"):
        a.optim_step({"lr": 1e-3})
    with pytest.raises(ValueError, match=r"sampling_params lacks \['max_tokens'\], which SamplingParams requires"):
        a.sample([1, 5], 1, {"temperature": 0.5})
    with pytest.raises(ValueError, match=r"sampling_params must be a SamplingParams or a dict of its fields"):
        a.sample([1, 5], 1, 8)
    with pytest.raises(ValueError, match=r"loss_fn_config for loss 'ppo' must be a dict of \['clip_low_threshold'"):
        a.forward([make_datum([1, 5], [6], logprobs=[-1.0], advantages=[1.0])], "ppo", [0.8, 1.2])


def test_a_datum_with_nothing_to_score_adds_nothing():
    """All advantages 0 and no weights: no position can change the ppo loss, so none is in the graph,
    the loss is exactly 0 and no gradient appears (an optimizer step then has norm 0); the returned
    logprobs are still the real ones (Tinker's clients read them at every action token)."""
    engine = TrainingEngine("builtin:tiny", seed=0)
    datum = make_datum([1, 5], [6, 7], logprobs=[-1.0, -1.0], advantages=[0.0, 0.0])
    del datum["loss_fn_inputs"]["weights"]
    out = engine.forward_backward([datum], "ppo")
    assert out.metrics == {"loss:sum": 0.0, "num_tokens:sum": 0.0, "num_datums:sum": 1.0}
    np.testing.assert_allclose(out.loss_fn_outputs[0]["logprobs"], engine.compute_logprobs([1, 5, 6, 7])["logprobs"][1:],
                               rtol=1e-6)
    assert all(p.grad is None for p in engine.named_params.values())
    assert engine.optim_step().grad_norm == 0.0 and engine.step == 1


def test_forward_returns_logprobs_at_every_position_for_a_client_side_custom_loss():
    """Tinker's forward_backward_custom: forward() with weights 0 gives the logprobs of every position;
    a custom loss L(logp) is then applied as cross_entropy with weights = -dL/dlogp, which must give
    the same gradient as autograd through L on the model directly."""
    engine = TrainingEngine("builtin:tiny", seed=2)
    datum = make_datum([1, 30, 31], [32, 33, 2], weights=[0.0, 0.0, 0.0])
    logp = engine.forward([datum]).loss_fn_outputs[0]["logprobs"]
    full = [1, 30, 31, 32, 33, 2]
    want = engine.compute_logprobs(full)["logprobs"][1:]
    np.testing.assert_allclose(logp, want, rtol=1e-6)
    assert np.all(logp < 0)  # every position scored, none left at 0
    # the custom loss: L = sum_t t * exp(logp_t) (made up); dL/dlogp_t = t * exp(logp_t)
    x = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    (torch.arange(len(logp)) * x.exp()).sum().backward()
    weighted = copy.deepcopy(datum)
    weighted["loss_fn_inputs"]["weights"] = (-x.grad).tolist()
    engine.forward_backward([weighted], "cross_entropy")
    via_weights = grads(engine)
    engine.zero_grad()
    with engine._mode(False):
        direct = engine.model(input_ids=torch.tensor([full[:-1]])).logits.float().log_softmax(-1)[0]
    chosen = direct.gather(-1, torch.tensor(full[1:])[:, None]).squeeze(-1)
    (torch.arange(len(logp)) * chosen.exp()).sum().backward()
    for name, g in via_weights.items():
        torch.testing.assert_close(engine.named_params[name].grad, g, rtol=1e-4, atol=1e-6)
    # forward_backward returns them too (the weight-0 positions computed outside the graph)
    np.testing.assert_allclose(engine.forward_backward([datum], "cross_entropy").loss_fn_outputs[0]["logprobs"], want,
                               rtol=1e-6)
