"""Sampling from a causal language model with a KV cache, batched across prompts and samples.

    params = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=0)
    sequences = sample(model, [[1, 2, 3], [4, 5]], num_samples=4, params=params, eos_token_id=2)
    sequences[prompt][sample].tokens / .logprobs / .stop_reason

What the returned logprobs mean: ``logprobs[t]`` is the log-probability with which the sampler drew
``tokens[t]``, i.e. under the distribution it actually sampled from: the logits divided by the
temperature, then filtered by top-k and top-p, then renormalised. With the defaults (temperature 1,
no top-k, top-p 1) that is the model's own log-probability. With ``temperature=0`` (greedy) the
sampler picks the arg-max with probability 1, so every logprob is 0.0.

Randomness: sample ``j`` of prompt ``i`` draws from its own random stream, seeded from
``(seed, i, j)``. The same seed therefore gives the same samples whatever the batch looks like, and
the streams are made on the CPU, so CPU and CUDA draw the same uniforms.

Works with any transformers causal LM, plain or PEFT-wrapped; the model is put in eval mode for the
call and restored afterwards.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from whileai.errors import ConfigError, WhileaiError

StopReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. Every field is validated at construction (a ``ConfigError``, a ``ValueError``)."""

    max_tokens: int
    """Most tokens to generate per sample (fewer if the model's context runs out first)."""
    temperature: float = 1.0
    """Logits are divided by this; 0 means greedy (arg-max)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of most likely tokens whose mass reaches top_p; 1 = off."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 (or Tinker's -1) = off."""
    stop: Any = ()
    """Stop token ids and/or stop sequences of ids: ``[2, 7]`` or ``[[13, 13], 2]``. Normalised to a
    tuple of tuples. The stop token or sequence is kept at the end of the returned tokens."""
    seed: int | None = None
    """Seed of the random streams; None draws one from torch's global generator."""

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, low=1)
        _check_number("temperature", self.temperature, "a finite number >= 0 (0 = greedy)")
        if self.temperature < 0:
            raise ConfigError(f"SamplingParams.temperature={self.temperature!r} is negative; use >= 0 (0 = greedy)")
        _check_number("top_p", self.top_p, "a number in (0, 1]")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"SamplingParams.top_p={self.top_p!r} is outside (0, 1]; use 1.0 to turn it off")
        _check_int("top_k", self.top_k, low=-1)
        if self.seed is not None:
            _check_int("seed", self.seed, low=0)
        object.__setattr__(self, "stop", _normalise_stop(self.stop))


@dataclass(frozen=True)
class SampledSequence:
    """One sample: the generated tokens (prompt excluded), the sampler's logprob of each, why it ended."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: StopReason


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(f"SamplingParams.{name}={value!r} must be an integer >= {low}")


def _check_number(name: str, value: Any, valid: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"SamplingParams.{name}={value!r} must be {valid}")


def _normalise_stop(stop: Any) -> tuple[tuple[int, ...], ...]:
    """``2`` / ``[2, 7]`` / ``[[13, 13], 2]`` -> ``((2,), (7,))`` / ``((13, 13), (2,))``."""
    if stop is None:
        return ()
    if isinstance(stop, str) or (isinstance(stop, Sequence) and any(isinstance(s, str) for s in stop)):
        raise ConfigError(
            f"SamplingParams.stop={stop!r} holds text; the sampler works on token ids. "
            "Encode stop strings with the tokenizer first (e.g. stop=[tokenizer.encode('\\n\\n')])"
        )
    items = [stop] if isinstance(stop, (int, np.integer)) else list(stop)
    normalised = []
    for index, item in enumerate(items):
        sequence = (item,) if isinstance(item, (int, np.integer)) else tuple(item)
        if not sequence or any(
            isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0 for t in sequence
        ):
            raise ConfigError(
                f"SamplingParams.stop[{index}]={item!r} is not a token id or a non-empty sequence of "
                "token ids (integers >= 0)"
            )
        normalised.append(tuple(int(t) for t in sequence))
    return tuple(normalised)


# --------------------------------------------------------------------------------------------------
# The sampling distribution and the draw


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Log of the distribution the sampler draws from, over the last dim, in float32.

    Order: divide by the temperature, keep the top-k logits, keep the top-p nucleus, renormalise.
    Filtered tokens get -inf. ``temperature == 0`` gives the greedy point mass (0 at the arg-max).
    """
    logits = logits.float()
    if temperature == 0:
        greedy = logits.argmax(dim=-1, keepdim=True)
        point_mass = torch.full_like(logits, -math.inf)
        return point_mass.scatter_(-1, greedy, 0.0)
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, -math.inf)
    if top_p < 1.0:
        logits = _nucleus(logits, top_p)
    return torch.log_softmax(logits, dim=-1)


def _nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Drop every token whose more-likely predecessors already hold ``top_p`` of the mass."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p  # the most likely token has mass_before 0, so it always stays
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


def draw(logprobs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: one token per row of ``logprobs`` (R, V) given one uniform in [0, 1) per row.

    A token with probability 0 is never drawn: the returned index i satisfies cdf[i-1] <= u < cdf[i].
    """
    probs = logprobs.double().exp()
    cdf = torch.cumsum(probs, dim=-1)
    targets = uniforms.to(cdf.device, torch.float64).unsqueeze(-1) * cdf[:, -1:]
    return torch.searchsorted(cdf, targets, right=True).squeeze(-1).clamp_(max=logprobs.shape[-1] - 1)


def _row_generators(seed: int | None, num_prompts: int, num_samples: int) -> list[torch.Generator]:
    """One CPU generator per (prompt, sample), seeded from (seed, prompt index, sample index)."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    generators = []
    for prompt_index in range(num_prompts):
        for sample_index in range(num_samples):
            state = np.random.SeedSequence([seed, prompt_index, sample_index]).generate_state(1, np.uint64)
            generators.append(torch.Generator().manual_seed(int(state[0])))
    return generators


def _uniforms(generators: list[torch.Generator]) -> torch.Tensor:
    return torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators])


# --------------------------------------------------------------------------------------------------
# Checks on the model and the prompts


def _base_model(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _forward_parameters(model: Any) -> set[str]:
    return set(inspect.signature(_base_model(model).forward).parameters)


def context_length(model: Any, max_context: int | None = None) -> int | None:
    """The model's context (``max_context`` if given, else ``config.max_position_embeddings``)."""
    if max_context is not None:
        return max_context
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)


def check_prompts(prompt_tokens: Any, vocab_size: int, context: int | None) -> list[list[int]]:
    """Validate prompts: a list of non-empty lists of ids in [0, vocab_size), each shorter than context.

    Prompts may be lists, numpy arrays or 1-D tensors of ids.
    """
    if isinstance(prompt_tokens, (np.ndarray, torch.Tensor)):
        prompt_tokens = prompt_tokens.tolist()
    if isinstance(prompt_tokens, (str, bytes)) or not isinstance(prompt_tokens, Sequence) or not prompt_tokens:
        raise ValueError("prompt_tokens must be a non-empty list of prompts, each a list of token ids")
    prompts = []
    for index, prompt in enumerate(prompt_tokens):
        if isinstance(prompt, (np.ndarray, torch.Tensor)) and prompt.ndim == 1:
            prompt = prompt.tolist()
        if not isinstance(prompt, Sequence) or isinstance(prompt, (str, bytes)) or len(prompt) == 0:
            raise ValueError(f"prompt {index} is empty or not a list of token ids; give at least one token id")
        for position, token in enumerate(prompt):
            if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < vocab_size:
                raise ValueError(
                    f"prompt {index}, position {position}: token {token!r} is not an id in [0, {vocab_size}) "
                    "(the model's vocabulary)"
                )
        if context is not None and len(prompt) >= context:
            raise ValueError(
                f"prompt {index} has {len(prompt)} tokens but the model's context is {context}, which leaves "
                "no room to generate; shorten the prompt (or pass a larger max_context if the model allows)"
            )
        prompts.append([int(t) for t in prompt])
    return prompts


def _stop_ids(eos_token_id: int | Sequence[int] | None) -> tuple[tuple[int, ...], ...]:
    if eos_token_id is None:
        return ()
    ids = [eos_token_id] if isinstance(eos_token_id, (int, np.integer)) else list(eos_token_id)
    return tuple((int(t),) for t in ids)


def _hits_stop(generated: list[int], stops: tuple[tuple[int, ...], ...]) -> bool:
    return any(len(generated) >= len(s) and tuple(generated[-len(s):]) == s for s in stops)


# --------------------------------------------------------------------------------------------------
# The batched loop


def sample(
    model: Any,
    prompt_tokens: Sequence[Sequence[int]],
    num_samples: int,
    params: SamplingParams,
    *,
    eos_token_id: int | Sequence[int] | None = None,
    max_context: int | None = None,
) -> list[list[SampledSequence]]:
    """Sample ``num_samples`` continuations of every prompt; returns ``result[prompt][sample]``.

    All prompts x samples run as one batch: prompts are left-padded (attention mask + position ids),
    each prompt is prefilled once and its KV cache repeated for its samples, then every step feeds one
    new token per row. ``eos_token_id`` (one id or several) stops a sample like a stop token; None
    means only ``params.stop`` stops early. A prompt that does not fit the context raises
    ``ValueError`` naming the prompt; a sample that reaches the context ends with ``"length"``.
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples={num_samples!r} must be an integer >= 1")
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    vocab_size = model.get_input_embeddings().num_embeddings
    context = context_length(model, max_context)
    prompts = check_prompts(prompt_tokens, vocab_size, context)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            return _generate(model, prompts, num_samples, params, _stop_ids(eos_token_id) + params.stop, context)
    finally:
        model.train(was_training)


def _generate(
    model: Any,
    prompts: list[list[int]],
    num_samples: int,
    params: SamplingParams,
    stops: tuple[tuple[int, ...], ...],
    context: int | None,
) -> list[list[SampledSequence]]:
    device = next(model.parameters()).device
    lengths = [len(p) for p in prompts]
    budgets = [min(params.max_tokens, context - n) if context else params.max_tokens for n in lengths]
    budgets = [b for b in budgets for _ in range(num_samples)]
    logits, cache, mask, positions = _prefill(model, prompts, num_samples, device)
    generators = _row_generators(params.seed, len(prompts), num_samples)
    tokens: list[list[int]] = [[] for _ in budgets]
    logprobs: list[list[float]] = [[] for _ in budgets]
    reasons: list[StopReason | None] = [None] * len(budgets)
    step_kwargs = _step_kwargs(model)
    for step in range(max(budgets)):
        _check_logits(logits, step, num_samples)
        row_logprobs = sampling_logprobs(logits, params.temperature, params.top_k, params.top_p)
        chosen = draw(row_logprobs, _uniforms(generators))
        chosen_logprobs = row_logprobs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).tolist()
        for row, (token, logprob) in enumerate(zip(chosen.tolist(), chosen_logprobs)):
            if reasons[row] is not None:
                continue
            tokens[row].append(token)
            logprobs[row].append(logprob)
            if _hits_stop(tokens[row], stops):
                reasons[row] = "stop"
            elif len(tokens[row]) >= budgets[row]:
                reasons[row] = "length"
        if all(r is not None for r in reasons):
            break
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=-1)
        positions = positions + 1
        out = model(
            input_ids=chosen.unsqueeze(-1).to(device),
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{step_kwargs["cache"]: cache},
            **step_kwargs["extra"],
        )
        logits, cache = out.logits[:, -1, :], _cache_of(out)
    rows = [SampledSequence(t, lp, r or "length") for t, lp, r in zip(tokens, logprobs, reasons)]
    return [rows[i * num_samples : (i + 1) * num_samples] for i in range(len(prompts))]


def _check_logits(logits: torch.Tensor, step: int, num_samples: int) -> None:
    """Refuse NaN logits (a broken model or overflowed weights) instead of drawing garbage."""
    bad = torch.isnan(logits).any(dim=-1).nonzero()
    if len(bad):
        row = int(bad[0])
        raise WhileaiError(
            f"the model returned NaN logits for prompt {row // num_samples}, sample {row % num_samples} at "
            f"generated position {step}; its weights or inputs are broken (check for NaN/inf parameters, or "
            "use float32 instead of float16)"
        )


def _step_kwargs(model: Any) -> dict[str, Any]:
    """Keyword names differ across transformers versions: ``cache`` (5.x) or ``past_key_values``."""
    names = _forward_parameters(model)
    return {
        "cache": "cache" if "cache" in names else "past_key_values",
        "extra": {"logits_to_keep": 1} if "logits_to_keep" in names else {},
    }


def _cache_of(out: Any) -> Any:
    cache = out.get("cache")
    return cache if cache is not None else out.get("past_key_values")


def _prefill(
    model: Any, prompts: list[list[int]], num_samples: int, device: torch.device
) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
    """Run each prompt once (left-padded), then repeat its cache, logits and mask for its samples.

    Returns last-position logits (R, V), the cache, the attention mask (R, L) and the last position
    id of each row (R, 1), where R = prompts x samples in prompt-major order.
    """
    longest = max(len(p) for p in prompts)
    input_ids = torch.zeros(len(prompts), longest, dtype=torch.long)
    mask = torch.zeros(len(prompts), longest, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, longest - len(prompt) :] = torch.tensor(prompt)
        mask[row, longest - len(prompt) :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
        **_step_kwargs(model)["extra"],
    )
    cache = _cache_of(out)
    if num_samples > 1:
        cache.batch_repeat_interleave(num_samples)
    logits = out.logits[:, -1, :].repeat_interleave(num_samples, dim=0)
    mask = mask.repeat_interleave(num_samples, dim=0)
    last_position = position_ids[:, -1:].repeat_interleave(num_samples, dim=0)
    return logits, cache, mask, last_position
