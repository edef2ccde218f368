"""Sampling: the sampler's logprobs, the KV cache, padding, stop rules and seeds, on tiny real models."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
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

from whileai.engine.draw import draw, sampling_logprobs
from whileai.engine.generation import sample
from whileai.engine.sampling import SampledSequence, SamplingParams
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
    ({"max_tokens": 0}, r"max_tokens=0 is invalid: it must be an integer >= 1 \(most tokens"),
    ({"max_tokens": 4, "temperature": -0.1}, r"temperature=-0.1 is invalid: it must be a finite number in \[0.0, inf\)"),
    ({"max_tokens": 4, "temperature": float("nan")}, "temperature=nan is invalid"),
    ({"max_tokens": 4, "top_p": 0.0}, r"top_p=0.0 is invalid: it must be a finite number in \(0.0, 1.0\]"),
    ({"max_tokens": 4, "top_k": -2}, "top_k=-2 is invalid: it must be an integer >= -1"),
    ({"max_tokens": 4, "seed": -1}, r"seed=-1 is invalid: it must be an integer >= 0 \(seed of the random streams"),
    ({"max_tokens": 4, "stop": ["\n", ""]}, r"stop=\['\\n', ''\] is invalid: it must be non-empty stop strings, "
                                            r"but stop\[1\] is ''"),
    ({"max_tokens": 4, "stop": [[1, 2], []]}, r"must be strings, token ids or non-empty sequences of token ids "
                                              r"\(integers >= 0\), but stop\[1\] is \[\]"),
    ({"max_tokens": 4, "stop": 1.5}, r"stop=1.5 is invalid: it must be stop strings, token ids or sequences"),
    ({"max_tokens": 4, "ignore_eos": 1}, r"ignore_eos=1 is invalid: it must be True or False"),
])
def test_sampling_params_are_validated(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        SamplingParams(**kwargs)


def test_every_bad_setting_is_reported_at_once_with_its_rule_from_the_knob_table():
    from whileai.engine.sampling import SAMPLING_KNOBS

    with pytest.raises(ConfigError) as error:
        SamplingParams(max_tokens=True, temperature=-1.0, top_p=2.0, top_k=1.5, seed="7")
    message = str(error.value)
    for name in ("max_tokens=True", "temperature=-1.0", "top_p=2.0", "top_k=1.5", "seed='7'"):
        assert f"SamplingParams.{name} is invalid" in message
    assert "(seed of the random streams; None draws one from torch's global generator; default None)" in message
    assert [f.metadata["knob"] for f in dataclasses.fields(SamplingParams)] == list(SAMPLING_KNOBS.values())
    assert SamplingParams(max_tokens=np.int64(3)).max_tokens == 3  # numpy integers are whole numbers too


def test_stop_strings_cut_every_row_where_its_decoded_text_first_holds_one():
    """Batched rows (three prompts x three samples, rows leaving the batch as they stop): each stopped row is its
    free sample cut at the first token after which the decoded completion contains a stop string; a row whose
    text never holds one runs to max_tokens. Decoding here: one letter per token (id 3 + k -> chr(97 + k % 4)),
    so a two-letter stop is matched whichever tokens spell it."""
    model = tiny_model()
    decode = lambda ids: "".join(chr(97 + (t - 3) % 4) if t >= 3 else "" for t in ids)  # noqa: E731
    params = dict(max_tokens=10, temperature=1.0, seed=4)
    free = sample(model, PROMPTS, 3, SamplingParams(**params))
    stops = ["ab", "dd"]
    cut = sample(model, PROMPTS, 3, SamplingParams(**params, stop=stops), decode=decode)
    hits = 0
    for free_samples, cut_samples in zip(free, cut):
        for f, c in zip(free_samples, cut_samples):
            ends = [n for n in range(1, len(f.tokens) + 1) if any(t in decode(f.tokens[:n]) for t in stops)]
            if ends:
                hits += 1
                assert (c.tokens, c.stop_reason) == (f.tokens[:ends[0]], "stop")
            else:
                assert (c.tokens, c.stop_reason) == (f.tokens, f.stop_reason)
    assert 0 < hits < 3 * len(PROMPTS)  # both kinds of row happened
    with pytest.raises(ConfigError, match=r"stop has strings \['ab'\]; the sampler needs the tokenizer"):
        sample(model, PROMPTS, 1, SamplingParams(max_tokens=2, stop="ab"))


def test_ignore_eos_drops_the_eos_stop_only():
    model = tiny_model()
    free = sample(model, [[1, 2, 3]], 1, SamplingParams(max_tokens=8, temperature=0.0))[0][0]
    eos = free.tokens[2]
    assert len(sample(model, [[1, 2, 3]], 1, SamplingParams(max_tokens=8, temperature=0.0), eos_token_id=eos)[0][0]
               .tokens) == free.tokens.index(eos) + 1
    kept = sample(model, [[1, 2, 3]], 1, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                  eos_token_id=eos)[0][0]
    assert (kept.tokens, kept.stop_reason) == (free.tokens, "length")
    other = free.tokens[5]
    if other != eos:
        stopped = sample(model, [[1, 2, 3]], 1, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True,
                                                               stop=[other]), eos_token_id=eos)[0][0]
        assert stopped.tokens == free.tokens[:free.tokens.index(other) + 1]


def test_stop_is_normalised_to_sequences():
    assert SamplingParams(max_tokens=1, stop=7).stop == ((7,),)
    assert SamplingParams(max_tokens=1, stop=[2, [13, 13]]).stop == ((2,), (13, 13))
    assert SamplingParams(max_tokens=1, stop=None).stop == ()
    assert SamplingParams(max_tokens=1, stop="\n\nUser:").stop == ("\n\nUser:",)
    assert SamplingParams(max_tokens=1, stop=["ab", 3, [4, 5]]).stop == ("ab", (3,), (4, 5))


# ---------------------------------------------------------------------------------------------------
# The fast path: the fused draw, the preallocated cache, finished rows leaving the batch


def test_engine_samples_score_the_same_under_compute_logprobs():
    """At temperature 1 with no truncation the sampler's logprob of each token equals the engine's
    scoring of the whole sequence (``compute_logprobs``: no cache, no padding) within 1e-4."""
    from whileai.engine import TrainingEngine

    engine = TrainingEngine("builtin:tiny", dtype="float32", autocast="off")
    prompts = [[1, 40, 41, 42], [1, 77], [1, 90, 91, 92, 93, 94, 95]]  # unequal lengths: padding is exercised
    result = engine.sample(prompts, 4, SamplingParams(max_tokens=10, seed=5))
    for prompt, samples in zip(prompts, result):
        for seq in samples:
            scored = engine.compute_logprobs(prompt + seq.tokens)["logprobs"][len(prompt):]
            np.testing.assert_allclose(seq.logprobs, scored, atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.4, 5, 1.0),
                                                         (0.9, 0, 0.7), (1.2, 9, 0.9)])
def test_draw_step_equals_sampling_logprobs_then_draw(temperature, top_k, top_p):
    """The fused step (one exp + cumsum pass) against the slow two-pass reference, 64 rows x 3 seeds:
    the same token for the same uniform, and its logprob read off ``sampling_logprobs``."""
    from whileai.engine.draw import draw_step

    params = SamplingParams(max_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p)
    for seed in range(3):
        generator = torch.Generator().manual_seed(seed)
        logits = 3 * torch.randn(64, VOCAB, generator=generator)
        uniforms = torch.rand(64, generator=generator, dtype=torch.float64)
        reference = sampling_logprobs(logits, temperature, top_k, top_p)
        expected = draw(reference, uniforms)
        chosen, logprob = draw_step(logits, params, uniforms)
        assert chosen.tolist() == expected.tolist()
        torch.testing.assert_close(logprob, reference.gather(-1, expected[:, None]).squeeze(-1), atol=1e-5, rtol=0)


def test_a_uniform_that_rounds_to_the_total_still_lands_on_a_token_with_mass():
    """(0.5, 0.5, 0): u = 1.0 (what u * total can round to) gives token 1, never the empty token 2."""
    logprobs = torch.log(torch.tensor([[0.5, 0.5, 0.0]]))
    assert draw(logprobs, torch.tensor([1.0], dtype=torch.float64)).tolist() == [1]


def test_rows_that_stop_leave_the_batch_and_the_rest_are_unchanged():
    """Half the vocabulary stops a sample, so most rows end within a few tokens and the batch is
    compacted several times; every row still equals the unstopped run cut at its first stop token,
    and its logprobs equal a no-cache recompute."""
    model = tiny_model()
    prompts = PROMPTS + [[7, 7, 7, 7]]
    free = sample(model, prompts, 4, SamplingParams(max_tokens=16, seed=9))
    stops = list(range(0, VOCAB, 2))
    cut = sample(model, prompts, 4, SamplingParams(max_tokens=16, seed=9, stop=stops))
    lengths = []
    for prompt, free_samples, cut_samples in zip(prompts, free, cut):
        for f, c in zip(free_samples, cut_samples):
            first = next((i for i, t in enumerate(f.tokens) if t in stops), None)
            expected = f.tokens if first is None else f.tokens[: first + 1]
            assert c.tokens == expected and c.stop_reason == ("length" if first is None else "stop")
            torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(f.logprobs[: len(expected)]),
                                       atol=2e-5, rtol=0)
            params = SamplingParams(max_tokens=16)
            torch.testing.assert_close(torch.tensor(c.logprobs), recomputed_logprobs(model, prompt, c.tokens, params),
                                       atol=2e-5, rtol=0)
            lengths.append(len(c.tokens))
    assert sorted(lengths)[len(lengths) // 2] <= 3 < max(lengths)  # most stop early, some run on


def test_preallocated_cache_equals_transformers_dynamic_cache():
    """Greedy tokens and seeded logprobs with the buffer-backed cache equal those with the model's own
    ``DynamicCache`` growing by concatenation (the preallocation switched off)."""
    from whileai.engine import kv_cache

    model = tiny_model("gpt2")  # GPT-2 keeps the plain cache (no shared prefix): the buffers are tested alone
    params = SamplingParams(max_tokens=12, temperature=0.8, seed=1)
    fast = sample(model, PROMPTS, 3, params)
    original = kv_cache.preallocate
    kv_cache.preallocate = lambda cache, n, capacity: cache.batch_repeat_interleave(n) if n > 1 else None
    try:
        plain = sample(model, PROMPTS, 3, params)
    finally:
        kv_cache.preallocate = original
    for a, b in zip(fast, plain):
        for x, y in zip(a, b):
            assert x.tokens == y.tokens
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=2e-5, rtol=0)


def test_num_samples_and_params_errors_are_config_errors():
    model = tiny_model()
    with pytest.raises(ConfigError, match=r"num_samples=2.5 must be an integer >= 1"):
        sample(model, [[1]], 2.5, SamplingParams(max_tokens=2))
    with pytest.raises(ConfigError, match=r"params must be a SamplingParams, got dict"):
        sample(model, [[1]], 1, {"max_tokens": 2})


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_shared_prefix_attention_equals_the_plain_cache(family):
    """Each prompt's keys/values held once for its samples (used for Qwen2 and Llama, found by the
    probe) give the plain cache's tokens and logprobs, with padding and with rows leaving the batch."""
    from whileai.engine import generation, shared_prefix

    model = tiny_model(family)
    model.eval()
    assert shared_prefix.shares_prefixes(model, generation._probe_run(model))
    prompts = PROMPTS + [[7, 7, 7, 7]]
    params = SamplingParams(max_tokens=14, temperature=1.1, seed=4, stop=list(range(0, VOCAB, 3)))
    runs = {}
    with torch.inference_mode():
        for cascade in (False, True):
            runs[cascade] = generation._Run(model, prompts, 4, params, params.stop, 48, cascade).generate()
    for plain, shared in zip(runs[False], runs[True]):
        for a, b in zip(plain, shared):
            assert a.tokens == b.tokens and a.stop_reason == b.stop_reason
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=2e-5, rtol=0)
    assert len({len(s.tokens) for r in runs[True] for s in r}) > 3  # rows ended at many different steps
