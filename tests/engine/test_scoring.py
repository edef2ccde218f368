"""Scoring under the sampler's distribution (temperature, top-k, top-p) and under the reference policy.

At lag 0 the trainer must give every sampled token the log-probability the sampler recorded for it,
whatever the sampling settings, so the importance ratio is exactly 1 and no fresh trajectory looks stale.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

from whileai.engine import AdamParams, SamplingParams, TrainingEngine, make_datum, sft_datum
from whileai.errors import BatchError, ConfigError

TEMPERATURES = (1.0, 0.7, 1.3)
TOP_KS = (0, 20)
TOP_PS = (1.0, 0.9)
GRID = list(itertools.product(TEMPERATURES, TOP_KS, TOP_PS))  # (1.0, 0, 1.0) is the default


def peaked_engine(**kwargs) -> TrainingEngine:
    """builtin:tiny after a few supervised steps: a peaked policy, where a temperature mismatch shows."""
    engine = TrainingEngine("builtin:tiny", seed=3, **kwargs)
    tok = engine.tokenizer
    data = [sft_datum(tok, p, c) for p, c in [("a=", "cat"), ("b=", "dog"), ("c=", "fish")]]
    for _ in range(15):
        engine.forward_backward(data, "cross_entropy")
        engine.optim_step(AdamParams(learning_rate=1e-2))
    return engine


@pytest.fixture(scope="module")
def engine() -> TrainingEngine:
    return peaked_engine()


def prompts(engine: TrainingEngine) -> list[list[int]]:
    tok = engine.tokenizer
    return [tok.encode(p) for p in ("a=", "b=", "zz")]  # the tokenizer adds BOS


def sample_rows(engine: TrainingEngine, params: SamplingParams, n: int = 3) -> list[tuple[list[int], object]]:
    out = engine.sample(prompts(engine), n, params)
    return [(prompt, seq) for prompt, group in zip(prompts(engine), out) for seq in group]


def slow_reference_logprobs(logits_TV: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The sampling distribution written out position by position: divide by T; keep every token at
    least as likely as the k-th; among those, keep a token while the renormalised mass of the tokens
    ranked above it is below top_p; log-softmax over the kept set (-inf elsewhere). Differentiable."""
    rows = []
    for z in logits_TV / temperature:
        keep = torch.ones_like(z, dtype=torch.bool)
        if 0 < top_k < z.numel():
            keep &= z >= torch.sort(z.detach(), descending=True).values[top_k - 1]
        if top_p < 1.0:
            probs = torch.softmax(z.detach().masked_fill(~keep, -torch.inf), dim=-1)
            order = torch.argsort(probs, descending=True)
            mass_before = 0.0
            for token in order.tolist():
                if mass_before >= top_p:
                    keep[token] = False
                mass_before += float(probs[token])
        rows.append(torch.log_softmax(z.masked_fill(~keep, -torch.inf), dim=-1))
    return torch.stack(rows)


# ----------------------------------------------------------------------------- lag 0: ratio exactly 1
@pytest.mark.parametrize("temperature, top_k, top_p", GRID)
def test_compute_logprobs_and_forward_return_the_samplers_logprobs(engine, temperature, top_k, top_p):
    params = SamplingParams(max_tokens=10, temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
    as_dict = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    rows = sample_rows(engine, params)
    data = [make_datum(prompt, seq.tokens) for prompt, seq in rows]
    forward = engine.forward(data, sampling_params=as_dict).loss_fn_outputs
    for (prompt, seq), out in zip(rows, forward):
        want = np.array(seq.logprobs)
        scored = engine.compute_logprobs(prompt + seq.tokens, sampling_params=params)["logprobs"][len(prompt):]
        np.testing.assert_allclose(scored, want, atol=1e-4, rtol=0)
        np.testing.assert_allclose(out["logprobs"][len(prompt) - 1:], want, atol=1e-4, rtol=0)


def test_without_the_samplers_settings_the_scores_differ(engine):
    """The check above can fail: at T = 0.7 the model's own log-probabilities are not the sampler's."""
    params = SamplingParams(max_tokens=10, temperature=0.7, top_k=20, seed=11)
    prompt, seq = sample_rows(engine, params)[0]
    plain = engine.compute_logprobs(prompt + seq.tokens)["logprobs"][len(prompt):]
    assert np.max(np.abs(np.array(plain) - np.array(seq.logprobs))) > 1e-2


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.7, 0, 1.0), (1.3, 20, 1.0), (0.7, 0, 0.9),
                                                       (1.0, 20, 0.9)])
def test_the_gradient_is_autograd_of_the_tempered_truncated_log_softmax(engine, temperature, top_k, top_p):
    params = SamplingParams(max_tokens=8, temperature=temperature, top_k=top_k, top_p=top_p, seed=5)
    rows = sample_rows(engine, params, n=2)
    weights = [np.linspace(-1.0, 2.0, len(seq.tokens)) for _, seq in rows]
    data = [make_datum(prompt, seq.tokens, weights=w) for (prompt, seq), w in zip(rows, weights)]
    engine.zero_grad()
    loss = engine.forward_backward(data, "cross_entropy", sampling_params=params).metrics["loss:sum"]
    got = {n: p.grad.clone() for n, p in engine.named_params.items()}
    engine.zero_grad()

    model = copy.deepcopy(engine.model).double().eval()
    total = torch.zeros((), dtype=torch.float64)
    for (prompt, seq), w in zip(rows, weights):
        full = torch.tensor([prompt + seq.tokens])
        logits = model(input_ids=full[:, :-1]).logits[0, len(prompt) - 1:]
        logp = slow_reference_logprobs(logits, temperature, top_k, top_p)
        picked = logp.gather(-1, torch.tensor(seq.tokens)[:, None]).squeeze(-1)
        total = total - (torch.from_numpy(w) * picked).sum()
    total.backward()
    assert loss == pytest.approx(float(total.detach()), rel=1e-4)
    for name, param in model.named_parameters():
        torch.testing.assert_close(got[name].double(), param.grad, rtol=1e-3, atol=1e-5, msg=name)


# ----------------------------------------------------------------------------- what cannot be scored
def test_greedy_cannot_be_scored_and_says_why(engine):
    datum = make_datum([1, 70], [71, 2])
    for call in (lambda sp: engine.forward([datum], sampling_params=sp),
                 lambda sp: engine.forward_backward([datum], "cross_entropy", sampling_params=sp),
                 lambda sp: engine.compute_logprobs([1, 70, 71], sampling_params=sp)):
        with pytest.raises(ConfigError, match=r"temperature=0 \(greedy\) cannot be scored"):
            call(SamplingParams(max_tokens=4, temperature=0))
    with pytest.raises(ConfigError, match=r"unknown fields \['temp'\]"):
        engine.forward([datum], sampling_params={"temp": 0.7})
    with pytest.raises(ConfigError, match="top_p"):
        engine.forward([datum], sampling_params={"top_p": 1.5})


def test_a_target_that_truncation_removes_names_the_datum_and_position(engine):
    prompt = prompts(engine)[0]
    hidden_best = engine.compute_logprobs(prompt + [2], top_k=2)["topk"][-1]
    unlikely = next(t for t in range(3, 200) if t not in [tok for tok, _ in hidden_best])
    data = [make_datum(prompt, [hidden_best[0][0]]), make_datum(prompt, [unlikely])]
    with pytest.raises(BatchError, match=rf"datum 1: target token {unlikely} at position {len(prompt) - 1} .*"
                                         r"probability 0 .*top_k=1"):
        engine.forward_backward(data, "cross_entropy", sampling_params={"top_k": 1})
    engine.zero_grad()
    one_per_pass = TrainingEngine(engine.loaded, micro_batch_tokens=len(prompt))
    with pytest.raises(BatchError, match=r"datum 1: .* The gradients of the 1 micro-batch\(es\) before it \(datums "
                                         r"0..0\) were already added .*zero_grad\(\)"):
        one_per_pass.forward_backward(data, "cross_entropy", sampling_params={"top_k": 1})
    one_per_pass.zero_grad()
    # unscored positions are reported, not refused: probability 0 reads -inf
    out = engine.forward([{**data[1], "loss_fn_inputs": {**data[1]["loss_fn_inputs"],
                                                         "weights": [0.0] * len(prompt)}}],
                         sampling_params={"top_k": 1})
    assert out.loss_fn_outputs[0]["logprobs"][-1] == -np.inf
    assert engine.compute_logprobs(prompt + [unlikely], sampling_params={"top_k": 1})["logprobs"][-1] == -np.inf


# ----------------------------------------------------------------------------- reference=True
@pytest.mark.parametrize("lora_rank", [0, 4])
def test_forward_under_the_reference_equals_compute_logprobs_reference(lora_rank):
    engine = TrainingEngine("builtin:tiny", seed=1, lora_rank=lora_rank, reference=True)
    data = [make_datum([1, 10, 11], [12, 13, 2]), make_datum([1, 20], [21, 2], weights=[0.5, 1.0])]
    for _ in range(3):  # move the policy away from the reference
        engine.forward_backward(data, "cross_entropy")
        engine.optim_step(AdamParams(learning_rate=5e-2))
    ref = engine.forward(data, reference=True).loss_fn_outputs
    policy = engine.forward(data).loss_fn_outputs
    for datum, out_ref, out_policy in zip(data, ref, policy):
        full = datum["model_input"] + [datum["loss_fn_inputs"]["target_tokens"][-1]]
        want = engine.compute_logprobs(full, reference=True)["logprobs"][1:]
        np.testing.assert_allclose(out_ref["logprobs"], want, atol=1e-5, rtol=0)
        assert np.max(np.abs(out_ref["logprobs"] - out_policy["logprobs"])) > 1e-2
    tempered = engine.forward(data, reference=True, sampling_params={"temperature": 0.5}).loss_fn_outputs[0]
    full = data[0]["model_input"] + [2]
    want = engine.compute_logprobs(full, reference=True, sampling_params={"temperature": 0.5})["logprobs"][1:]
    np.testing.assert_allclose(tempered["logprobs"], want, atol=1e-5, rtol=0)


def test_forward_under_the_reference_needs_one():
    engine = TrainingEngine("builtin:tiny", seed=1)
    with pytest.raises(ConfigError, match="keeps no reference policy"):
        engine.forward([make_datum([1, 10], [11])], reference=True)
