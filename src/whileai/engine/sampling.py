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

Speed (measured in ``benchmarks/sampling.py`` against ``transformers``' ``generate``): each prompt is
prefilled once; where a one-time probe shows the model allows it, a prompt's keys/values are kept once
for all its samples (exact shared-prefix attention, see the end of this module), else copied to each
sample; new keys/values are written into buffers allocated once for the whole generation (no
per-step concatenation); every row's uniforms are drawn before the loop; a step's sampling is one
pass of exp and cumulative sum over the vocabulary, with no Python work per row; finished rows leave
the batch once they are a quarter of it.

Works with any transformers causal LM, plain or PEFT-wrapped; the model is put in eval mode for the
call and restored afterwards.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from whileai.engine.decode import decode_step, static_decode, static_ready
from whileai.engine.stops import TextStops
from whileai.errors import BatchError, ConfigError, WhileaiError
from whileai.knobs import Knob, number

StopReason = Literal["stop", "length"]
TINKER_SAMPLING = "Tinker SamplingParams (reference/tinker.md, 1.5)"


# --------------------------------------------------------------------------------------------------
# The settings, each declared once with its rule


def _whole(low: int) -> Any:
    """An integer (Python or numpy, not bool) >= low."""
    text = f"an integer >= {low}"

    def check(x: Any) -> str | None:
        ok = not isinstance(x, bool) and isinstance(x, (int, np.integer)) and x >= low
        return None if ok else text

    return check


def _optional_seed(x: Any) -> str | None:
    return None if x is None else _whole(0)(x)


def _stop_rule(stop: Any) -> str | None:
    try:
        _normalise_stop(stop)
    except ValueError as err:
        return str(err)
    return None


def _flag(x: Any) -> str | None:
    return None if isinstance(x, bool) else "True or False"


SAMPLING_KNOBS: dict[str, Knob] = {
    "max_tokens": Knob(None, "most tokens to generate per sample (fewer if the model's context runs out first)",
                       _whole(1), TINKER_SAMPLING),
    "temperature": Knob(1.0, "logits are divided by this; 0 means greedy (arg-max)", number(0.0), TINKER_SAMPLING),
    "top_p": Knob(1.0, "nucleus: keep the smallest set of most likely tokens whose mass reaches top_p; 1 = off",
                  number(0.0, 1.0, open_low=True), TINKER_SAMPLING),
    "top_k": Knob(0, "keep only the k most likely tokens; 0 (or Tinker's -1) = off", _whole(-1),
                  f"{TINKER_SAMPLING}; its default is -1, ours 0, both mean off"),
    "stop": Knob((), "stop strings, token ids and/or sequences of ids, e.g. '\\n\\nUser:', [2, 7] or "
                 "[[13, 13], 2, 'User:']; the stop is kept at the end of the returned tokens", _stop_rule,
                 TINKER_SAMPLING),
    "seed": Knob(None, "seed of the random streams; None draws one from torch's global generator",
                 _optional_seed, TINKER_SAMPLING),
    "ignore_eos": Knob(False, "do not stop at the model's end-of-sequence token (Tinker's stop=[]); only "
                       "`stop` and max_tokens end a sample", _flag, "vLLM SamplingParams.ignore_eos"),
}


REQUIRED = ("max_tokens",)
"""Settings without a default (``max_tokens``: a sampler that silently stops at 16 tokens is a classic bug)."""


def _knob(name: str) -> Any:
    spec = SAMPLING_KNOBS[name]
    if name in REQUIRED:
        return field(metadata={"knob": spec})
    return field(default=spec.value, metadata={"knob": spec})


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. Every field's rule is in ``SAMPLING_KNOBS``; all are checked at construction and
    every bad one is reported at once (a ``ConfigError``, a ``ValueError``)."""

    max_tokens: int = _knob("max_tokens")
    """Most tokens to generate per sample (fewer if the model's context runs out first)."""
    temperature: float = _knob("temperature")
    """Logits are divided by this; 0 means greedy (arg-max)."""
    top_p: float = _knob("top_p")
    """Nucleus sampling: keep the smallest set of most likely tokens whose mass reaches top_p; 1 = off."""
    top_k: int = _knob("top_k")
    """Keep only the k most likely tokens; 0 (or Tinker's -1) = off."""
    stop: Any = _knob("stop")
    """Stop strings, token ids and/or stop sequences of ids: ``"\\n\\nUser:"``, ``[2, 7]`` or ``[[13, 13], 2]``.
    Normalised to a tuple whose items are tuples of ids or strings. A string stops a sample at the first
    token after which the decoded completion contains it (the sampler then needs the tokenizer's
    ``decode``). The stop is kept at the end of the returned tokens."""
    seed: int | None = _knob("seed")
    """Seed of the random streams; None draws one from torch's global generator."""
    ignore_eos: bool = _knob("ignore_eos")
    """Do not stop at the model's end-of-sequence token; only ``stop`` and ``max_tokens`` end a sample."""

    def __post_init__(self) -> None:
        problems = []
        for f in dataclasses.fields(self):
            value, spec = getattr(self, f.name), f.metadata["knob"]
            if (rule := spec.check(value)) is not None:
                default = "required" if f.name in REQUIRED else f"default {spec.value!r}"
                problems.append(f"SamplingParams.{f.name}={value!r} is invalid: it must be {rule} "
                                f"({spec.doc}; {default})")
        if problems:
            raise ConfigError("; ".join(problems))
        object.__setattr__(self, "stop", _normalise_stop(self.stop))


@dataclass(frozen=True)
class SampledSequence:
    """One sample: the generated tokens (prompt excluded), the sampler's logprob of each, why it ended."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: StopReason


def _normalise_stop(stop: Any) -> tuple[tuple[int, ...] | str, ...]:
    """``2`` / ``"ab"`` / ``[2, 7]`` / ``[[13, 13], 2, "ab"]`` -> ``((2,),)`` / ``("ab",)`` / ``((2,), (7,))`` /
    ``((13, 13), (2,), "ab")``."""
    if stop is None:
        return ()
    if isinstance(stop, (str, int, np.integer)):
        stop = [stop]
    if not isinstance(stop, Sequence):
        raise ConfigError("stop strings, token ids or sequences of token ids (a str, an int or a list of them), "
                          f"not a {type(stop).__name__}")
    normalised: list[tuple[int, ...] | str] = []
    for index, item in enumerate(stop):
        if isinstance(item, str):
            if not item:
                raise ConfigError(f"non-empty stop strings, but stop[{index}] is ''")
            normalised.append(item)
            continue
        sequence = (item,) if isinstance(item, (int, np.integer)) else tuple(item) if isinstance(
            item, Sequence) else ()
        if not sequence or any(
            isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0 for t in sequence
        ):
            raise ConfigError(f"strings, token ids or non-empty sequences of token ids (integers >= 0), but "
                              f"stop[{index}] is {item!r}")
        normalised.append(tuple(int(t) for t in sequence))
    return tuple(normalised)


# --------------------------------------------------------------------------------------------------
# The sampling distribution and the draw


def _filtered_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Float32 logits divided by the temperature, with the tokens top-k / top-p drop set to -inf."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, -math.inf)
    if top_p < 1.0:
        logits = _nucleus(logits, top_p)
    return logits


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Log of the distribution the sampler draws from, over the last dim, in float32.

    Order: divide by the temperature, keep the top-k logits, keep the top-p nucleus, renormalise.
    Filtered tokens get -inf. ``temperature == 0`` gives the greedy point mass (0 at the arg-max).
    """
    if temperature == 0:
        logits = logits.float()
        greedy = logits.argmax(dim=-1, keepdim=True)
        point_mass = torch.full_like(logits, -math.inf)
        return point_mass.scatter_(-1, greedy, 0.0)
    return torch.log_softmax(_filtered_logits(logits, temperature, top_k, top_p), dim=-1)


def _nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Drop every token whose more-likely predecessors already hold ``top_p`` of the mass."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p  # the most likely token has mass_before 0, so it always stays
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


def _inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index drawn from each row of non-negative float64 ``weights`` (R, V), and each row's total.

    The index i satisfies cdf[i-1] <= u * total < cdf[i], so a token of weight 0 is never drawn; a
    target that rounds up to the total lands on the last token with weight.
    """
    cdf = torch.cumsum(weights, dim=-1)
    total = cdf[:, -1:].contiguous()
    targets = uniforms.to(cdf.device, torch.float64).unsqueeze(-1) * total
    chosen = torch.searchsorted(cdf, targets, right=True)
    last_with_weight = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(chosen, last_with_weight).squeeze(-1), total.squeeze(-1)


def draw(logprobs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: one token per row of ``logprobs`` (R, V) given one uniform in [0, 1) per row.

    A token with probability 0 is never drawn: the returned index i satisfies cdf[i-1] <= u < cdf[i].
    """
    return _inverse_cdf(logprobs.double().exp(), uniforms)[0]


def draw_step(logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``logits`` (R, V) and its log-probability under the sampling distribution.

    The same distribution as ``sampling_logprobs`` in one pass of exp and cumulative sum (float64):
    weights = exp(filtered - row max), token = inverse CDF, logprob = (filtered - max)[token] - log(total).
    """
    if params.temperature == 0:
        return logits.argmax(dim=-1), torch.zeros(logits.shape[0], device=logits.device)
    shifted = _filtered_logits(logits, params.temperature, params.top_k, params.top_p).double()
    shifted = shifted - shifted.amax(dim=-1, keepdim=True)
    chosen, total = _inverse_cdf(shifted.exp(), uniforms)
    logprob = shifted.gather(-1, chosen.unsqueeze(-1)).squeeze(-1) - total.log()
    return chosen, logprob.float()


def row_uniforms(seed: int | None, num_prompts: int, num_samples: int, steps: int) -> torch.Tensor:
    """(prompts x samples, steps) float64 uniforms in [0, 1); row i * num_samples + j is the stream of
    (seed, i, j), so a row's draws do not depend on the rest of the batch."""
    if seed is None:
        from whileai.engine.rng import GLOBAL_RNG

        with GLOBAL_RNG:  # not in the middle of another thread's seeded initialisation
            seed = int(torch.randint(0, 2**62, (1,)).item())
    rows = [np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, i, j]))).random(steps)
            for i in range(num_prompts) for j in range(num_samples)]
    return torch.from_numpy(np.stack(rows))


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


def _as_list(prompt: Any) -> Any:
    return prompt.tolist() if isinstance(prompt, (np.ndarray, torch.Tensor)) and prompt.ndim == 1 else prompt


def check_prompts(prompt_tokens: Any, vocab_size: int, context: int | None) -> list[list[int]]:
    """Validate prompts: a list of non-empty lists of ids in [0, vocab_size), each shorter than context.

    Prompts may be lists, numpy arrays or 1-D tensors of ids. Bad input raises ``BatchError`` naming
    the prompt (and position).
    """
    if isinstance(prompt_tokens, (np.ndarray, torch.Tensor)):
        prompt_tokens = prompt_tokens.tolist()
    if isinstance(prompt_tokens, (str, bytes)) or not isinstance(prompt_tokens, Sequence) or not prompt_tokens:
        raise BatchError(f"prompt_tokens={prompt_tokens!r:.60} must be a non-empty list of prompts, each a list "
                         "of token ids; encode text with the tokenizer first")
    return [_check_prompt(index, _as_list(prompt), vocab_size, context)
            for index, prompt in enumerate(prompt_tokens)]


def _check_prompt(index: int, prompt: Any, vocab_size: int, context: int | None) -> list[int]:
    if not isinstance(prompt, Sequence) or isinstance(prompt, (str, bytes)) or len(prompt) == 0:
        raise BatchError(f"prompt {index} is empty or not a list of token ids ({prompt!r:.40}); give at least "
                         "one token id")
    for position, token in enumerate(prompt):
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < vocab_size:
            raise BatchError(
                f"prompt {index}, position {position}: token {token!r} is not an id in [0, {vocab_size}) "
                "(the model's vocabulary); encode with the model's own tokenizer"
            )
    if context is not None and len(prompt) >= context:
        raise BatchError(
            f"prompt {index} has {len(prompt)} tokens but the model's context is {context}, which leaves "
            "no room to generate; shorten the prompt (or pass a larger max_context if the model allows)"
        )
    return [int(t) for t in prompt]


def _stop_ids(eos_token_id: int | Sequence[int] | None) -> tuple[tuple[int, ...], ...]:
    if eos_token_id is None:
        return ()
    ids = [eos_token_id] if isinstance(eos_token_id, (int, np.integer)) else list(eos_token_id)
    return tuple((int(t),) for t in ids)


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
    decode: Any = None,
    static_cache: bool = False,
    cuda_graph: bool = False,
) -> list[list[SampledSequence]]:
    """Sample ``num_samples`` continuations of every prompt; returns ``result[prompt][sample]``.

    All prompts x samples run as one batch: prompts are left-padded (attention mask + position ids),
    each prompt is prefilled once and its KV cache copied for its samples, then every step feeds one
    new token per running row. ``eos_token_id`` (one id or several) stops a sample like a stop token
    unless ``params.ignore_eos``; None means only ``params.stop`` stops early. ``decode`` (token ids ->
    text, the tokenizer's) is needed for stop strings. A prompt that does not fit the context raises
    ``BatchError`` naming the prompt; a sample that reaches the context ends with ``"length"``.
    ``static_cache``: decode with fixed shapes (``whileai.engine.decode.StaticDecode``: keys/values in buffers of
    the whole generation's length, finished rows run on unread; equal to the exact step to rounding, not bit for
    bit); ``cuda_graph`` (CUDA only, implies ``static_cache``): each such step is one CUDA-graph replay.
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ConfigError(f"num_samples={num_samples!r} must be an integer >= 1 (samples drawn per prompt)")
    if not isinstance(params, SamplingParams):
        raise ConfigError(f"params must be a SamplingParams, got {type(params).__name__}; build one with "
                          "SamplingParams(max_tokens=...)")
    texts = [s for s in params.stop if isinstance(s, str)]
    if texts and decode is None:
        raise ConfigError(f"SamplingParams.stop has strings {texts}; the sampler needs the tokenizer to match "
                          "them: pass decode=tokenizer.decode (TrainingEngine.sample does)")
    vocab_size = model.get_input_embeddings().num_embeddings
    context = context_length(model, max_context)
    prompts = check_prompts(prompt_tokens, vocab_size, context)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            ids = tuple(s for s in params.stop if not isinstance(s, str))
            stops = (() if params.ignore_eos else _stop_ids(eos_token_id)) + ids
            static = static_ready(model, graph=cuda_graph) if static_cache or cuda_graph else None
            cascade = int(num_samples) > 1 and static is None and shares_prefixes(model)
            run = _Run(model, prompts, int(num_samples), params, stops, context, cascade, static)
            run.text_stops = TextStops(texts, decode) if texts else None
            return run.generate()
    finally:
        model.train(was_training)


class _Run:
    """The state of one ``sample`` call: output buffers (R, T) for all rows, and the batch still running.

    Rows are prompts x samples in prompt-major order; ``rows_B`` maps the running batch to them.
    """

    def __init__(self, model: Any, prompts: list[list[int]], num_samples: int, params: SamplingParams,
                 stops: tuple[tuple[int, ...], ...], context: int | None, cascade: bool = False,
                 static: bool | None = None) -> None:
        self.model, self.prompts, self.num_samples, self.params = model, prompts, num_samples, params
        self.cascade = cascade
        self.device = next(model.parameters()).device
        lengths = torch.tensor([len(p) for p in prompts]).repeat_interleave(num_samples)
        budget = params.max_tokens if context is None else (context - lengths).clamp(max=params.max_tokens)
        self.budget_R = torch.as_tensor(budget).expand(len(lengths)).to(self.device)
        self.steps = int(self.budget_R.max())
        self.tokens_RT = torch.zeros(len(lengths), self.steps, dtype=torch.long, device=self.device)
        self.logprobs_RT = torch.zeros(len(lengths), self.steps, device=self.device)
        self.length_R = torch.zeros(len(lengths), dtype=torch.long, device=self.device)
        self.stopped_R = torch.zeros(len(lengths), dtype=torch.bool, device=self.device)
        self.uniforms_RT = row_uniforms(params.seed, len(prompts), num_samples, self.steps).to(self.device)
        self.single_stops = torch.tensor([s[0] for s in stops if len(s) == 1], dtype=torch.long, device=self.device)
        self.long_stops = [torch.tensor(s, device=self.device) for s in stops if len(s) > 1]
        self.names = _step_kwargs(model)
        self.fast = decode_step(model)  # the same arithmetic with transformers' per-layer wrappers left out
        self.static_mode = static  # None: the exact step; False: fixed shapes; True: fixed shapes as a CUDA graph
        self.static: Any = None
        self.text_stops: TextStops | None = None
        # the running batch, set by _prefill: its rows, which still run, their last position, the mask
        self.cache: Any = None
        self.shared: _SharedPrefix | None = None
        self.rows_B = torch.zeros(0, dtype=torch.long)
        self.running_B = torch.zeros(0, dtype=torch.bool)
        self.keep_B: torch.Tensor | None = None
        self.positions_B1 = torch.zeros(0, 1, dtype=torch.long)
        self.mask_BL: torch.Tensor | None = None
        self.filled = 0

    def generate(self) -> list[list[SampledSequence]]:
        logits_BV = self._prefill()
        with _prefix_attention(self.model, self.shared):
            for step in range(self.steps):
                chosen_B = self._record(step, logits_BV)
                if not bool(self.running_B.any()):
                    break
                self._maybe_compact()
                logits_BV = self._decode(chosen_B[self.keep_B] if self.keep_B is not None else chosen_B)
        return self._results()

    # ---- one step
    def _record(self, step: int, logits_BV: torch.Tensor) -> torch.Tensor:
        """Draw a token for every running row, store it with its logprob, and mark rows that ended."""
        rows_B = self.rows_B
        _check_logits(logits_BV, rows_B, step, self.num_samples)
        chosen_B, logprob_B = draw_step(logits_BV, self.params, self.uniforms_RT[rows_B, step])
        live = self.running_B
        live_rows = rows_B[live]
        self.tokens_RT[live_rows, step] = chosen_B[live]
        self.logprobs_RT[live_rows, step] = logprob_B[live]
        self.length_R[live_rows] = step + 1
        hit_B = self._hits_stop(step, chosen_B) & live
        self.stopped_R[rows_B[hit_B]] = True
        self.running_B = live & ~hit_B & (step + 1 < self.budget_R[rows_B])
        self.keep_B = None
        return chosen_B

    def _hits_stop(self, step: int, chosen_B: torch.Tensor) -> torch.Tensor:
        hit_B = torch.isin(chosen_B, self.single_stops)
        for stop in self.long_stops:
            if step + 1 >= len(stop):
                recent = self.tokens_RT[self.rows_B, step + 1 - len(stop) : step + 1]
                hit_B |= (recent == stop).all(dim=-1)
        if self.text_stops is not None:
            check = (self.running_B & ~hit_B).nonzero().squeeze(-1)
            if len(check):
                tails = self.tokens_RT[self.rows_B[check], max(0, step + 1 - self.text_stops.window) : step + 1]
                found = self.text_stops.found(tails.tolist())
                hit_B[check[torch.tensor(found, dtype=torch.bool, device=check.device)]] = True
        return hit_B

    def _maybe_compact(self) -> None:
        """Drop finished rows from the batch (and its cache) once they are a quarter of it."""
        finished = int((~self.running_B).sum())
        if finished == 0 or self.static is not None or 4 * finished < len(self.running_B):
            return
        keep_B = self.running_B.nonzero().squeeze(-1)
        _select_rows(self.cache, keep_B)
        self.rows_B, self.running_B, self.keep_B = self.rows_B[keep_B], self.running_B[keep_B], keep_B
        self.positions_B1 = self.positions_B1[keep_B]
        if self.shared is not None:
            self.shared.rows_B = self.rows_B
        if self.mask_BL is not None:
            self.mask_BL = self.mask_BL[keep_B]

    def _decode(self, chosen_B: torch.Tensor) -> torch.Tensor:
        self.positions_B1 = self.positions_B1 + 1
        self.filled += 1
        mask = None if self.mask_BL is None else self.mask_BL[:, : self.filled]
        if self.static is not None:
            return self.static.step(chosen_B.unsqueeze(-1), self.positions_B1)
        if self.fast is not None:
            return self.fast(chosen_B.unsqueeze(-1), mask, self.positions_B1, self.cache)
        out = self.model(input_ids=chosen_B.unsqueeze(-1), attention_mask=mask, position_ids=self.positions_B1,
                         use_cache=True, **{self.names["cache"]: self.cache}, **self.names["extra"])
        return out.logits[:, -1, :]

    # ---- before and after the loop
    def _prefill(self) -> torch.Tensor:
        """Run each prompt once (left-padded), then copy its cache, logits and mask to its samples."""
        longest = max(len(p) for p in self.prompts)
        input_ids = torch.zeros(len(self.prompts), longest, dtype=torch.long)
        mask = torch.zeros(len(self.prompts), longest, dtype=torch.long)
        for row, prompt in enumerate(self.prompts):
            input_ids[row, longest - len(prompt) :] = torch.tensor(prompt)
            mask[row, longest - len(prompt) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        padded = not bool(mask.all())
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=mask if padded else None, position_ids=position_ids,
                         use_cache=True, **self.names["extra"])
        self.cache = _cache_of(out)
        capacity = longest + self.steps
        n = self.num_samples
        self.filled = longest
        self.mask_BL = None
        self.shared = None
        if self.cascade:  # the prompt's keys/values stay one copy per prompt; masks are the prefix's own
            self.shared = _SharedPrefix.attach(self.cache, mask if padded else None, n, self.steps)
            padded = False
        else:
            _preallocate(self.cache, self.num_samples, capacity)
        if padded:  # one buffer for the whole generation; each step reads a longer view of it
            self.mask_BL = torch.ones(len(self.prompts) * n, capacity, dtype=torch.long, device=self.device)
            self.mask_BL[:, :longest] = mask.repeat_interleave(n, dim=0)
        self.positions_B1 = position_ids[:, -1:].repeat_interleave(n, dim=0)
        self.rows_B = torch.arange(len(self.prompts) * n, device=self.device)
        if self.shared is not None:
            self.shared.rows_B = self.rows_B
        self.running_B = torch.ones(len(self.rows_B), dtype=torch.bool, device=self.device)
        self.keep_B = None
        if self.static_mode is not None:  # the whole batch keeps its fixed shape: finished rows run on, unread
            self.static = static_decode(self.model, self.cache, self.mask_BL, longest, capacity,
                                        graph=self.static_mode)
            self.cache = None  # the fixed-shape step holds its own copy of the keys/values
        return out.logits[:, -1, :].repeat_interleave(n, dim=0)

    def _results(self) -> list[list[SampledSequence]]:
        lengths, stopped = self.length_R.tolist(), self.stopped_R.tolist()
        tokens, logprobs = self.tokens_RT.tolist(), self.logprobs_RT.tolist()
        rows = [SampledSequence(t[:n], lp[:n], "stop" if s else "length")
                for t, lp, n, s in zip(tokens, logprobs, lengths, stopped)]
        n = self.num_samples
        return [rows[i * n : (i + 1) * n] for i in range(len(self.prompts))]


def _check_logits(logits_BV: torch.Tensor, rows_B: torch.Tensor, step: int, num_samples: int) -> None:
    """Refuse NaN logits (a broken model or overflowed weights) instead of drawing garbage."""
    bad = torch.isnan(logits_BV.amax(dim=-1))  # max propagates NaN: one reduction per row
    if bool(bad.any()):
        row = int(rows_B[bad.nonzero()[0, 0]])
        raise WhileaiError(
            f"the model returned NaN logits for prompt {row // num_samples}, sample {row % num_samples} at "
            f"generated position {step}; its weights or inputs are broken (check for NaN/inf parameters, or "
            "use float32 instead of float16)"
        )


# --------------------------------------------------------------------------------------------------
# The cache: transformers' DynamicCache, with its layers' keys and values held in preallocated buffers


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


def _growing_layer_class() -> Any:
    """A ``DynamicLayer`` that writes new keys/values into a buffer of fixed capacity and hands out a
    view of the filled part, instead of concatenating a new tensor every step (which copies the whole
    cache once per token). Beyond its capacity it falls back to concatenation."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):  # type: ignore[misc, valid-type]
        key_buffer: torch.Tensor
        value_buffer: torch.Tensor
        filled: int

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            end = self.filled + key_states.shape[-2]
            if end > self.key_buffer.shape[-2]:
                self.key_buffer = torch.cat([self.key_buffer[..., : self.filled, :], key_states], dim=-2)
                self.value_buffer = torch.cat([self.value_buffer[..., : self.filled, :], value_states], dim=-2)
            else:
                self.key_buffer.narrow(-2, self.filled, end - self.filled).copy_(key_states)
                self.value_buffer.narrow(-2, self.filled, end - self.filled).copy_(value_states)
            self.filled = end
            self.keys, self.values = self.key_buffer.narrow(-2, 0, end), self.value_buffer.narrow(-2, 0, end)
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
            self.keys = self.key_buffer[..., : self.filled, :]
            self.values = self.value_buffer[..., : self.filled, :]

    return GrowingLayer


_GROWING: list[Any] = []


def _preallocate(cache: Any, num_samples: int, capacity: int) -> None:
    """Copy every layer's prefilled keys/values ``num_samples`` times into a buffer of ``capacity``
    positions. Layers of another kind (sliding windows, caches without ``layers``) are only repeated."""
    from transformers.cache_utils import DynamicLayer

    if not _GROWING:
        _GROWING.append(_growing_layer_class())
    layers = getattr(cache, "layers", None)
    if layers is None or any(type(layer) is not DynamicLayer for layer in layers):
        if num_samples > 1:
            cache.batch_repeat_interleave(num_samples)
        return
    for layer in layers:
        keys, values = layer.keys, layer.values
        batch, heads, filled, width = keys.shape
        layer.__class__ = _GROWING[0]
        layer.key_buffer = keys.new_empty(batch * num_samples, heads, capacity, width)
        layer.value_buffer = values.new_empty(batch * num_samples, values.shape[1], capacity, values.shape[-1])
        layer.key_buffer[..., :filled, :] = keys.repeat_interleave(num_samples, dim=0)
        layer.value_buffer[..., :filled, :] = values.repeat_interleave(num_samples, dim=0)
        layer.filled = filled
        layer.keys, layer.values = layer.key_buffer[..., :filled, :], layer.value_buffer[..., :filled, :]


def _select_rows(cache: Any, keep: torch.Tensor) -> None:
    cache.batch_select_indices(keep)


# --------------------------------------------------------------------------------------------------
# Shared-prefix ("cascade") attention: the samples of a prompt read its keys/values from one copy
#
# In a decode step every row's query attends to its prompt (the prefix) and to its own generated
# tokens (the suffix). With k samples per prompt, a plain cache holds the prefix k times and reads it
# k times per step; here it is held once per prompt and the k queries of a prompt meet it in one
# matrix product. The two parts' scores share one softmax, so the result is exact attention.
# Used only where a one-time probe shows the model routes its attention through transformers'
# attention interface (``shares_prefixes``); otherwise the plain cache above is used.

CASCADE = "whileai_shared_prefix"
_ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("whileai_shared_prefix", default=None)


class _SharedPrefix:
    """The prompts' keys/values per layer, the prompts' padding, and which row of the batch is which."""

    def __init__(self, prefixes: list[tuple[torch.Tensor, torch.Tensor]], padding_N1L: torch.Tensor | None,
                 num_samples: int) -> None:
        self.prefixes, self.num_samples = prefixes, num_samples
        self.bias_N11L = None if padding_N1L is None else torch.zeros(padding_N1L.shape, dtype=torch.float32,
                                                                       device=padding_N1L.device).masked_fill(
            ~padding_N1L.bool(), -math.inf)[:, :, None, :]
        self.rows_B: torch.Tensor = torch.zeros(0)

    @classmethod
    def attach(cls, cache: Any, mask_NL: torch.Tensor | None, num_samples: int, steps: int) -> _SharedPrefix:
        """Turn every layer of a prefilled cache into a suffix buffer of ``steps`` positions per row."""
        layer_class = _suffix_layer_class()
        prefixes = []
        for layer in cache.layers:
            prefixes.append((layer.keys, layer.values))
            n_prompts, heads, _, width = layer.keys.shape
            layer.__class__ = layer_class
            layer.prefix_length = layer.keys.shape[-2]
            layer.key_buffer = layer.keys.new_empty(n_prompts * num_samples, heads, steps, width)
            layer.value_buffer = layer.values.new_empty(n_prompts * num_samples, layer.values.shape[1], steps,
                                                        layer.values.shape[-1])
            layer.filled = 0
        return cls(prefixes, None if mask_NL is None else mask_NL[:, None, :], num_samples)

    def attend(self, layer_index: int, query_BH1D: torch.Tensor, keys_BKSD: torch.Tensor,
               values_BKSD: torch.Tensor, scaling: float) -> torch.Tensor:
        """Exact attention of one new token per row over prefix + suffix; returns (B, 1, H, D)."""
        prefix_keys_NKPD, prefix_values_NKPD = self.prefixes[layer_index]
        n_prompts, kv_heads = prefix_keys_NKPD.shape[:2]
        batch, heads, _, width = query_BH1D.shape
        group = heads // kv_heads
        query_BKGD = query_BH1D.float().reshape(batch, kv_heads, group, width) * scaling
        prefix_scores = torch.matmul(self._by_prompt(query_BKGD, n_prompts), prefix_keys_NKPD.float().transpose(-1, -2))
        if self.bias_N11L is not None:
            prefix_scores = prefix_scores + self.bias_N11L
        prefix_scores_BKGP = self._by_row(prefix_scores, batch, group)
        suffix_scores_BKGS = torch.matmul(query_BKGD, keys_BKSD.float().transpose(-1, -2))
        weights = torch.softmax(torch.cat([prefix_scores_BKGP, suffix_scores_BKGS], dim=-1), dim=-1)
        prefix_weights, suffix_weights = weights.split([prefix_scores_BKGP.shape[-1], keys_BKSD.shape[-2]], dim=-1)
        out = torch.matmul(self._by_prompt(prefix_weights, n_prompts), prefix_values_NKPD.float())
        out_BKGD = self._by_row(out, batch, group) + torch.matmul(suffix_weights, values_BKSD.float())
        return out_BKGD.reshape(batch, 1, heads, width).to(query_BH1D.dtype)

    def _by_prompt(self, x_BKGX: torch.Tensor, n_prompts: int) -> torch.Tensor:
        """(B, K, G, X) rows -> (N, K, samples * G, X): each prompt's rows side by side (absent rows 0)."""
        slots = n_prompts * self.num_samples
        if x_BKGX.shape[0] != slots:
            full = x_BKGX.new_zeros(slots, *x_BKGX.shape[1:])
            full[self.rows_B] = x_BKGX
            x_BKGX = full
        _, kv_heads, group, last = x_BKGX.shape
        x = x_BKGX.reshape(n_prompts, self.num_samples, kv_heads, group, last).transpose(1, 2)
        return x.reshape(n_prompts, kv_heads, self.num_samples * group, last)

    def _by_row(self, x_NKMX: torch.Tensor, batch: int, group: int) -> torch.Tensor:
        """The inverse of ``_by_prompt``: (N, K, samples * G, X) -> (B, K, G, X) for the running rows."""
        n_prompts, kv_heads, _, last = x_NKMX.shape
        x = x_NKMX.reshape(n_prompts, kv_heads, self.num_samples, group, last).transpose(1, 2)
        x = x.reshape(n_prompts * self.num_samples, kv_heads, group, last)
        return x if batch == x.shape[0] else x[self.rows_B]


def _suffix_layer_class() -> Any:
    """A cache layer whose prompt part lives in ``_SharedPrefix``; it stores each row's new tokens only."""
    grow = _growing_layer_class()

    class SuffixLayer(grow):  # type: ignore[misc, valid-type]
        prefix_length: int

        def get_seq_length(self) -> int:
            return self.prefix_length + self.filled

    return SuffixLayer


def _shared_prefix_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: Any, scaling: float | None = None, **kwargs: Any) -> Any:
    shared = _ACTIVE.get()
    if shared is None or query.shape[2] != 1:
        raise WhileaiError("whileai's shared-prefix attention runs only inside whileai.engine.sampling.sample")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return shared.attend(module.layer_idx, query, key, value, scale), None


@contextlib.contextmanager
def _prefix_attention(model: Any, shared: _SharedPrefix | None) -> Iterator[None]:
    """Within the block, the model's attention is ``_shared_prefix_attention`` over ``shared``."""
    if shared is None:
        yield
        return
    config = _base_model(model).config
    original = config._attn_implementation
    token = _ACTIVE.set(shared)
    config._attn_implementation = CASCADE
    try:
        yield
    finally:
        config._attn_implementation = original
        _ACTIVE.reset(token)


def _register_cascade() -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if CASCADE not in ALL_ATTENTION_FUNCTIONS:
        ALL_ATTENTION_FUNCTIONS.register(CASCADE, _shared_prefix_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(CASCADE, lambda *args, **kwargs: None)  # masks are the prefix's


_PROBED: dict[Any, bool] = {}


def shares_prefixes(model: Any) -> bool:
    """Whether shared-prefix attention gives this model's results: checked once per model class and
    attention implementation, by sampling 2 padded prompts x 2 samples both ways (logprobs within 1e-4)."""
    config = getattr(_base_model(model), "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    key = (type(_base_model(model)), implementation)
    if key not in _PROBED:
        _PROBED[key] = implementation is not None and _probe(model)
    return _PROBED[key]


def _probe(model: Any) -> bool:
    try:
        _register_cascade()
        params = SamplingParams(max_tokens=3, seed=0)
        prompts, context = [[1, 2, 3], [2]], context_length(model)
        plain = _Run(model, prompts, 2, params, (), context, cascade=False).generate()
        shared = _Run(model, prompts, 2, params, (), context, cascade=True).generate()
    except Exception:  # any model this does not fit falls back to the plain cache
        return False
    pairs = [(a, b) for x, y in zip(plain, shared) for a, b in zip(x, y)]
    return all(a.tokens == b.tokens and np.allclose(a.logprobs, b.logprobs, atol=1e-4, rtol=0) for a, b in pairs)
