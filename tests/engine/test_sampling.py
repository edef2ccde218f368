"""Sampling: the sampler's logprobs, the KV cache, padding, stop rules and seeds, on tiny real models."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from whileai.engine.sampling import SampledSequence, SamplingParams, draw, sample, sampling_logprobs
from whileai.errors import ConfigError, WhileaiError

VOCAB = 61


def tiny_model(family: str = "qwen2", seed: int = 0, context: int = 48) -> torch.nn.Module:
    """A 2-layer decoder; a wide init makes its next-token distributions peaked, not near-uniform."""
    torch.manual_seed(seed)
    shape = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                 initializer_range=0.3)
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(**shape))
    if family == "gpt2":  # learned absolute positions: wrong position ids under left padding would show
        return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=context,
                                          initializer_range=0.3, bos_token_id=0, eos_token_id=0))
    return Qwen2ForCausalLM(Qwen2Config(**shape))


PROMPTS = [[3, 14, 15], [9, 2, 6, 5, 35, 8, 9, 7, 9], [31]]


def recomputed_logprobs(model, prompt, tokens, params) -> torch.Tensor:
    """Slow reference: the whole sequence in one forward, no cache, no padding, one sequence alone."""
    full = torch.tensor([prompt + tokens], device=model.device)
    model.eval()  # GPT-2 has dropout on by default; the sampler runs in eval mode
    with torch.no_grad():
        logits = model(input_ids=full).logits[0, len(prompt) - 1 : -1]
    distribution = sampling_logprobs(logits, params.temperature, params.top_k, params.top_p)
    return distribution.gather(-1, full[0, len(prompt):].unsqueeze(-1)).squeeze(-1).cpu()


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["qwen2", "llama", "gpt2"])
@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=12, temperature=0.7, seed=3),
    SamplingParams(max_tokens=12, temperature=1.3, top_k=7, top_p=0.8, seed=4),
])
def test_cached_batched_logprobs_equal_a_no_cache_recompute(family, params, device):
    """Batched (left-padded, KV-cached) logprobs == one-sequence full recompute, for every sample."""
    model = tiny_model(family).to(device)
    result = sample(model, PROMPTS, num_samples=3, params=params)
    assert [len(r) for r in result] == [3, 3, 3]
    for prompt, samples in zip(PROMPTS, result):
        for seq in samples:
            assert len(seq.tokens) == len(seq.logprobs) == 12 and seq.stop_reason == "length"
            expected = recomputed_logprobs(model, prompt, seq.tokens, params)
            torch.testing.assert_close(torch.tensor(seq.logprobs), expected, atol=2e-5, rtol=0)
            assert all(math.isfinite(x) and x <= 0 for x in seq.logprobs)


def test_temperature_logprob_is_the_tempered_softmax_by_hand():
    """logits (2, 1, 0) at T = 0.5 -> scaled (4, 2, 0); log p = scaled - log(e^4 + e^2 + 1)."""
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    log_z = math.log(math.exp(4) + math.exp(2) + 1)
    expected = torch.tensor([[4 - log_z, 2 - log_z, 0 - log_z]])
    torch.testing.assert_close(sampling_logprobs(logits, 0.5), expected)
    # At T = 1 it is the model's own log-softmax.
    torch.testing.assert_close(sampling_logprobs(logits, 1.0), torch.log_softmax(logits, -1))


def test_sampled_logprobs_are_at_the_sampling_temperature_not_at_one():
    """End to end: the returned logprob is log softmax(logits / T), checked against a manual softmax."""
    model = tiny_model()
    params = SamplingParams(max_tokens=1, temperature=0.5, seed=0)
    seq = sample(model, [[1, 2, 3]], 1, params)[0][0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits[0, -1].double()
    scaled = logits / 0.5
    manual = scaled[seq.tokens[0]] - torch.log(torch.exp(scaled).sum())
    untempered = torch.log_softmax(logits, -1)[seq.tokens[0]]
    assert seq.logprobs[0] == pytest.approx(manual.item(), abs=1e-5)
    assert abs(seq.logprobs[0] - untempered.item()) > 1e-2  # the two meanings really differ here


def test_top_k_and_top_p_filters_by_hand():
    """p = (0.5, 0.3, 0.15, 0.05).

    top_k = 2 keeps {0, 1}: (0.5, 0.3) / 0.8 = (0.625, 0.375).
    top_p = 0.85: mass before each token is (0, 0.5, 0.8, 0.95); 0.95 >= 0.85 drops token 3 only,
    leaving (0.5, 0.3, 0.15) / 0.95.
    """
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top_k = sampling_logprobs(logits, 1.0, top_k=2).exp()
    torch.testing.assert_close(top_k, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    top_p = sampling_logprobs(logits, 1.0, top_p=0.85).exp()
    torch.testing.assert_close(top_p, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    # The nucleus always keeps the most likely token, even for a tiny top_p.
    torch.testing.assert_close(sampling_logprobs(logits, 1.0, top_p=0.01).exp(), torch.tensor([[1.0, 0, 0, 0]]))


def test_draw_matches_the_distribution_and_never_draws_a_filtered_token():
    """20,000 draws from (0.5, 0.3, 0.2, 0): frequencies within 0.015 (about 4.5 standard errors)."""
    logprobs = torch.log(torch.tensor([0.5, 0.3, 0.2, 0.0])).expand(20_000, 4)
    uniforms = torch.rand(20_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    counts = torch.bincount(draw(logprobs, uniforms), minlength=4).double() / 20_000
    torch.testing.assert_close(counts, torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64), atol=0.015, rtol=0)
    assert counts[3] == 0
    # The extreme uniforms land on the first and last tokens that have mass.
    edges = draw(logprobs[:2], torch.tensor([0.0, 1 - 1e-16], dtype=torch.float64))
    assert edges.tolist() == [0, 2]


def test_same_seed_same_samples_different_seed_different():
    model = tiny_model()
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=11)
    first = sample(model, PROMPTS, 4, params)
    again = sample(model, PROMPTS, 4, params)
    other = sample(model, PROMPTS, 4, SamplingParams(max_tokens=10, temperature=1.0, seed=12))
    assert first == again
    assert [s.tokens for r in first for s in r] != [s.tokens for r in other for s in r]
    # Samples of one prompt differ from each other (own streams), even for identical prompts.
    twins = sample(model, [[5, 6], [5, 6]], 2, params)
    assert len({tuple(s.tokens) for r in twins for s in r}) == 4


def test_seed_none_follows_torch_global_seed():
    model = tiny_model()
    params = SamplingParams(max_tokens=8)
    torch.manual_seed(5)
    first = sample(model, PROMPTS, 2, params)
    torch.manual_seed(5)
    assert sample(model, PROMPTS, 2, params) == first


def test_batched_prompts_of_different_lengths_equal_one_at_a_time():
    """Greedy and seeded: each prompt in a padded batch gives what it gives alone.

    A prompt alone is prompt index 0, so the seeded comparison is made for the first prompt.
    """
    model = tiny_model()
    greedy = SamplingParams(max_tokens=10, temperature=0.0)
    batched = sample(model, PROMPTS, 1, greedy)
    for prompt, samples in zip(PROMPTS, batched):
        alone = sample(model, [prompt], 1, greedy)[0][0]
        assert samples[0].tokens == alone.tokens
        assert samples[0].logprobs == [0.0] * 10  # greedy draws with probability 1
    seeded = SamplingParams(max_tokens=10, temperature=0.9, seed=2)
    in_batch = sample(model, PROMPTS, 3, seeded)[0]
    alone = sample(model, PROMPTS[:1], 3, seeded)[0]
    assert [s.tokens for s in in_batch] == [s.tokens for s in alone]
    for a, b in zip(in_batch, alone):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=2e-5, rtol=0)


def test_stop_token_stop_sequence_eos_and_length():
    model = tiny_model()
    free = sample(model, [[1, 2, 3]], 1, SamplingParams(max_tokens=12, temperature=0.0))[0][0]
    assert free.stop_reason == "length" and len(free.tokens) == 12
    tokens = free.tokens

    def greedy(stop=(), eos=None, **kwargs):
        params = SamplingParams(max_tokens=12, temperature=0.0, stop=stop)
        return sample(model, [[1, 2, 3]], 1, params, eos_token_id=eos, **kwargs)[0][0]

    stop_at = tokens[3]
    first = tokens.index(stop_at)  # the stop token is kept, at its first occurrence
    assert greedy(stop=[stop_at]) == SampledSequence(tokens[: first + 1], [0.0] * (first + 1), "stop")
    assert greedy(eos=stop_at).tokens == tokens[: first + 1]
    pair = tuple(tokens[4:6])
    end = next(i + 2 for i in range(11) if tuple(tokens[i : i + 2]) == pair)
    by_sequence = greedy(stop=[list(pair)])
    assert by_sequence.tokens == tokens[:end] and by_sequence.stop_reason == "stop"
    # The context ends generation: 3 prompt tokens + 4 new = a context of 7.
    short = greedy(max_context=7)
    assert short.tokens == tokens[:4] and short.stop_reason == "length"


def test_samples_that_stop_early_do_not_disturb_the_others():
    model = tiny_model()
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=0)
    free = sample(model, PROMPTS, 2, params)
    stop_token = free[1][0].tokens[1]
    stopped = sample(model, PROMPTS, 2, SamplingParams(max_tokens=10, temperature=1.0, seed=0, stop=stop_token))
    for free_samples, stopped_samples in zip(free, stopped):
        for f, s in zip(free_samples, stopped_samples):
            if stop_token in f.tokens:
                cut = f.tokens.index(stop_token) + 1
                assert s.tokens == f.tokens[:cut] and s.stop_reason == "stop"
            else:
                assert s.tokens == f.tokens and s.stop_reason == "length"
    assert stopped[1][0].tokens == free[1][0].tokens[:2]


def test_peft_model_samples_and_training_mode_is_restored():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model.train()
    params = SamplingParams(max_tokens=6, temperature=0.8, seed=1)
    result = sample(model, PROMPTS, 2, params)
    assert model.training
    for prompt, samples in zip(PROMPTS, result):
        expected = recomputed_logprobs(model, prompt, samples[0].tokens, params)
        torch.testing.assert_close(torch.tensor(samples[0].logprobs), expected, atol=2e-5, rtol=0)


def test_bad_prompts_are_refused_naming_the_prompt():
    model = tiny_model(context=16)
    params = SamplingParams(max_tokens=4)
    with pytest.raises(ValueError, match=r"prompt 1 has 16 tokens but the model's context is 16"):
        sample(model, [[1], list(range(16))], 1, params)
    with pytest.raises(ValueError, match=r"prompt 0 has 9 tokens but the model's context is 8"):
        sample(model, [list(range(9))], 1, params, max_context=8)
    with pytest.raises(ValueError, match=r"prompt 1, position 2: token 61 is not an id in \[0, 61\)"):
        sample(model, [[1], [1, 2, 61]], 1, params)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        sample(model, [[]], 1, params)
    with pytest.raises(ValueError, match="num_samples=0"):
        sample(model, [[1]], 0, params)


def test_nan_logits_are_refused_not_sampled():
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight[:, 0] = float("nan")  # every logit of every row becomes NaN
    with pytest.raises(WhileaiError, match="NaN logits for prompt 0, sample 0 at generated position 0"):
        sample(model, [[1, 2]], 1, SamplingParams(max_tokens=3, seed=0))


def test_prompts_may_be_numpy_arrays_or_tensors():
    import numpy as np

    model = tiny_model()
    params = SamplingParams(max_tokens=5, seed=0)
    expected = sample(model, [[3, 14, 15], [9, 2]], 2, params)
    assert sample(model, [np.array([3, 14, 15]), torch.tensor([9, 2])], 2, params) == expected
    alone = sample(model, np.array([[3, 14, 15]]), 2, params)[0]  # a smaller batch: float noise only
    assert [s.tokens for s in alone] == [s.tokens for s in expected[0]]
    for a, b in zip(alone, expected[0]):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=2e-5, rtol=0)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_tokens": 0}, "max_tokens=0 must be an integer >= 1"),
    ({"max_tokens": 4, "temperature": -0.1}, "temperature=-0.1 is negative"),
    ({"max_tokens": 4, "temperature": float("nan")}, "temperature=nan must be"),
    ({"max_tokens": 4, "top_p": 0.0}, r"top_p=0.0 is outside \(0, 1\]"),
    ({"max_tokens": 4, "top_k": -2}, "top_k=-2 must be an integer >= -1"),
    ({"max_tokens": 4, "seed": -1}, "seed=-1 must be an integer >= 0"),
    ({"max_tokens": 4, "stop": "\n"}, "holds text"),
    ({"max_tokens": 4, "stop": [[1, 2], []]}, r"stop\[1\]=\[\] is not a token id"),
])
def test_sampling_params_are_validated(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        SamplingParams(**kwargs)


def test_stop_is_normalised_to_sequences():
    assert SamplingParams(max_tokens=1, stop=7).stop == ((7,),)
    assert SamplingParams(max_tokens=1, stop=[2, [13, 13]]).stop == ((2,), (13, 13))
    assert SamplingParams(max_tokens=1, stop=None).stop == ()
