"""The fast decode step (``whileai.engine.decode``) against the model's own forward: the sampler's tokens and
log-probabilities are bit for bit those of the sampler that calls ``model(...)`` each step, under every
sampling setting, with padding, shared prefixes, stops, EOS and LoRA; the static (CUDA-graph) form equal to
rounding."""

from __future__ import annotations

import pytest
import torch
from test_sampling import DEVICES, PROMPTS, VOCAB, tiny_model

from whileai.engine import decode, generation
from whileai.engine.generation import sample
from whileai.engine.sampling import SamplingParams
from whileai.errors import ConfigError

SETTINGS = [
    SamplingParams(max_tokens=10, seed=1),
    SamplingParams(max_tokens=10, temperature=0, seed=1),
    SamplingParams(max_tokens=10, temperature=0.6, seed=2),
    SamplingParams(max_tokens=10, temperature=1.4, top_k=5, seed=3),
    SamplingParams(max_tokens=10, temperature=0.9, top_p=0.7, seed=4),
    SamplingParams(max_tokens=10, temperature=1.2, top_k=9, top_p=0.85, seed=5),
    SamplingParams(max_tokens=12, temperature=1.1, seed=6, stop=[[7, 7], 11, 13]),
    SamplingParams(max_tokens=12, temperature=1.1, seed=7, stop=["ab"]),
    SamplingParams(max_tokens=12, temperature=1.1, seed=8, ignore_eos=True),
]


def decode_text(ids):  # a stand-in tokenizer's decode: id i is the letter chr(97 + i % 26)
    return "".join(chr(97 + i % 26) for i in ids)


def both(model, prompts, n, params, eos=2, **kwargs):
    """(the sampler with the fast step, the sampler calling model(...) each step)."""
    fast = sample(model, prompts, n, params, eos_token_id=eos, decode=decode_text, **kwargs)
    original = generation.decode_step
    generation.decode_step = lambda model: None
    try:
        slow = sample(model, prompts, n, params, eos_token_id=eos, decode=decode_text, **kwargs)
    finally:
        generation.decode_step = original
    return fast, slow


def assert_identical(fast, slow):
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        for x, y in zip(a, b):
            assert x.tokens == y.tokens and x.stop_reason == y.stop_reason
            assert x.logprobs == y.logprobs  # bit for bit, not to a tolerance


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"t{p.temperature}-k{p.top_k}-p{p.top_p}-{p.stop}")
def test_fast_step_samples_bit_for_bit_what_the_model_forward_samples(family, params):
    model = tiny_model(family)
    assert decode.decode_step(model) is not None
    for n in (1, 3):  # one sample (the plain cache), three (each prompt's keys/values shared by its samples)
        fast, slow = both(model, PROMPTS, n, params)
        assert_identical(fast, slow)
    single_fast, single_slow = both(model, [[5, 9, 4, 4, 1]], 1, params)  # batch 1, no padding: the SDPA path
    assert_identical(single_fast, single_slow)


def test_the_runs_cover_eos_stops_and_rows_leaving_the_batch():
    """The settings above are not vacuous: rows end at EOS, at a stop and by length, at different steps."""
    model = tiny_model("qwen2")
    fast, slow = both(model, PROMPTS + [[4, 4]], 4, SamplingParams(max_tokens=12, temperature=1.5, seed=6,
                                                                  stop=[[7, 7], 11, 13]))
    assert_identical(fast, slow)
    reasons = [s.stop_reason for r in fast for s in r]
    assert "stop" in reasons and "length" in reasons
    assert len({len(s.tokens) for r in fast for s in r}) >= 3


def test_lora_model_samples_bit_for_bit():
    from whileai.engine import TrainingEngine

    engine = TrainingEngine("builtin:tiny", lora_rank=4, seed=0)
    with torch.no_grad():  # move the adapters off zero so that they change the logits
        for name, p in engine.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    fast, slow = both(engine.model, PROMPTS, 2, SamplingParams(max_tokens=8, temperature=1.0, seed=9))
    assert_identical(fast, slow)


def test_logits_of_one_step_equal_the_model_forward():
    model = tiny_model("qwen2").eval()
    ids = torch.tensor([[3, 14, 15, 9]])
    step = decode.decode_step(model)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
        cache_a, cache_b = out.past_key_values, model(input_ids=ids, use_cache=True).past_key_values
        token, position = torch.tensor([[21]]), torch.tensor([[4]])
        expected = model(input_ids=token, position_ids=position, cache=cache_a, use_cache=True).logits[:, -1]
        got = step(token, None, position, cache_b)
    assert torch.equal(got, expected)


def test_other_families_and_hooked_models_fall_back_to_the_model_forward():
    assert decode.decode_step(tiny_model("gpt2")) is None
    model = tiny_model("qwen2")
    model.model.layers[0].register_forward_hook(lambda *args: None)
    assert decode.decode_step(model) is None


def test_static_step_equals_the_exact_step_to_rounding():
    """The fixed-shape step a CUDA graph records (full-length buffers, a mask, the slot a tensor) gives the
    exact step's logits to float rounding, with left padding."""
    model = tiny_model("llama").eval()
    prompts = torch.tensor([[0, 0, 3, 14], [9, 2, 6, 5]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    exact = decode.decode_step(model)
    with torch.inference_mode():
        out = model(input_ids=prompts, attention_mask=mask, position_ids=positions, use_cache=True)
        static = decode.StaticDecode(model, 2, 12, torch.device("cpu"), torch.float32)
        static.prefill(out.past_key_values, mask, 4)
        token, position = out.logits[:, -1].argmax(-1, keepdim=True), positions[:, -1:]
        full_mask = torch.cat([mask, torch.ones(2, 8, dtype=torch.long)], dim=1)
        for step in range(6):
            position = position + 1
            want = exact(token, full_mask[:, :5 + step], position, out.past_key_values)
            got = static.step(token, position)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            token = want.argmax(-1, keepdim=True) % VOCAB


def assert_equal_to_rounding(static, exact):
    assert len(static) == len(exact)
    for a, b in zip(static, exact):
        for x, y in zip(a, b):
            assert x.tokens == y.tokens and x.stop_reason == y.stop_reason
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"t{p.temperature}-k{p.top_k}-p{p.top_p}-{p.stop}")
def test_static_cache_sampler_equals_the_current_sampler_under_every_setting(family, params, device):
    """The fixed-shape sampler (full-length key/value buffers, a mask, finished rows running on unread: what a
    CUDA graph records) gives the current sampler's tokens, stop reasons and log-probabilities (to rounding),
    with left padding, several samples per prompt, stops, stop strings and EOS ids (2 and 5); on CUDA the
    same recorded as a CUDA graph too."""
    model = tiny_model(family).to(device)
    for prompts, n in ((PROMPTS, 1), (PROMPTS + [[4, 4]], 3), ([[5, 9, 4, 4, 1]], 1)):
        exact = sample(model, prompts, n, params, eos_token_id=[2, 5], decode=decode_text)
        static = sample(model, prompts, n, params, eos_token_id=[2, 5], decode=decode_text, static_cache=True)
        assert_equal_to_rounding(static, exact)
        if device == "cuda":
            graphed = sample(model, prompts, n, params, eos_token_id=[2, 5], decode=decode_text, cuda_graph=True)
            assert_equal_to_rounding(graphed, exact)


def test_static_cache_sampler_with_lora_equals_the_current_sampler():
    from whileai.engine import TrainingEngine

    engine = TrainingEngine("builtin:tiny", lora_rank=4, seed=0)
    with torch.no_grad():  # adapters off zero, so that they change the logits
        for name, p in engine.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=9)
    exact = sample(engine.model, PROMPTS, 2, params, eos_token_id=2)
    assert_equal_to_rounding(sample(engine.model, PROMPTS, 2, params, eos_token_id=2, static_cache=True), exact)


def test_static_cache_runs_cover_every_way_a_sample_ends():
    """Not vacuous: in the static runs rows end at each EOS id, at a stop and by length, at different steps."""
    model = tiny_model("qwen2")
    params = SamplingParams(max_tokens=12, temperature=1.5, seed=6, stop=[[7, 7], 11, 13])
    static = sample(model, PROMPTS + [[4, 4]], 4, params, eos_token_id=[2, 5], static_cache=True)
    assert_equal_to_rounding(static, sample(model, PROMPTS + [[4, 4]], 4, params, eos_token_id=[2, 5]))
    rows = [s for r in static for s in r]
    assert {s.tokens[-1] for s in rows if s.stop_reason == "stop"} >= {2, 5}
    assert any(s.stop_reason == "length" for s in rows) and len({len(s.tokens) for s in rows}) >= 3


def test_static_cache_is_refused_where_it_does_not_apply():
    with pytest.raises(ConfigError, match="covers the Llama and Qwen2 families"):
        sample(tiny_model("gpt2"), PROMPTS, 1, SETTINGS[0], static_cache=True)
    with pytest.raises(ConfigError, match="cuda_graph=True needs the model on a CUDA device"):
        sample(tiny_model("qwen2"), PROMPTS, 1, SETTINGS[0], cuda_graph=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_sampler_equals_the_exact_sampler_on_cuda():
    model = tiny_model("qwen2").cuda()
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=3)
    exact = sample(model, PROMPTS, 2, params)
    graphed = sample(model, PROMPTS, 2, params, cuda_graph=True)
    for a, b in zip(exact, graphed):
        for x, y in zip(a, b):
            assert x.tokens == y.tokens
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=0)
