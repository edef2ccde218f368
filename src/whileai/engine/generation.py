"""Sampling from a causal language model with a KV cache, batched across prompts and samples.

    params = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=0)
    sequences = sample(model, [[1, 2, 3], [4, 5]], num_samples=4, params=params, eos_token_id=2)
    sequences[prompt][sample].tokens / .logprobs / .stop_reason

The settings are ``whileai.engine.sampling``'s; what a logprob means and how the random streams are seeded,
``whileai.engine.draw``'s; the stop rule, ``whileai.engine.stops``'.

Speed (measured in ``benchmarks/sampling.py`` and ``benchmarks/decode.py`` against ``transformers``'
``generate``): each prompt is prefilled once; where a one-time probe shows the model allows it, a prompt's
keys/values are kept once for all its samples (``whileai.engine.shared_prefix``), else copied to each sample
into buffers allocated once for the whole generation (``whileai.engine.kv_cache``); every row's uniforms are
drawn before the loop; a step's draw has no Python work per row; a Llama or Qwen2 step runs without
transformers' per-layer wrappers (``whileai.engine.decode``); finished rows leave the batch once they are a
quarter of it. ``static_cache`` / ``cuda_graph`` decode with fixed shapes instead (the whole batch runs on).

Works with any transformers causal LM, plain or PEFT-wrapped; the model is put in eval mode for the
call and restored afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from whileai.engine import kv_cache
from whileai.engine.decode import decode_step, static_decode, static_ready
from whileai.engine.draw import draw_step, row_uniforms
from whileai.engine.sampling import SampledSequence, SamplingParams
from whileai.engine.shared_prefix import SharedPrefix, prefix_attention, shares_prefixes
from whileai.engine.stops import TextStops
from whileai.errors import BatchError, ConfigError, WhileaiError


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
            cascade = int(num_samples) > 1 and static is None and shares_prefixes(model, _probe_run(model))
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
        self.names = kv_cache.step_kwargs(model)
        self.fast = decode_step(model)  # the same arithmetic with transformers' per-layer wrappers left out
        self.static_mode = static  # None: the exact step; False: fixed shapes; True: fixed shapes as a CUDA graph
        self.static: Any = None
        self.text_stops: TextStops | None = None
        # the running batch, set by _prefill: its rows, which still run, their last position, the mask
        self.cache: Any = None
        self.shared: SharedPrefix | None = None
        self.rows_B = torch.zeros(0, dtype=torch.long)
        self.running_B = torch.zeros(0, dtype=torch.bool)
        self.keep_B: torch.Tensor | None = None
        self.positions_B1 = torch.zeros(0, 1, dtype=torch.long)
        self.mask_BL: torch.Tensor | None = None
        self.filled = 0

    def generate(self) -> list[list[SampledSequence]]:
        logits_BV = self._prefill()
        with prefix_attention(self.model, self.shared):
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
        kv_cache.select_rows(self.cache, keep_B)
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
        self.cache = kv_cache.cache_of(out)
        capacity = longest + self.steps
        n = self.num_samples
        self.filled = longest
        self.mask_BL = None
        self.shared = None
        if self.cascade:  # the prompt's keys/values stay one copy per prompt; masks are the prefix's own
            self.shared = SharedPrefix.attach(self.cache, mask if padded else None, n, self.steps)
            padded = False
        else:
            kv_cache.preallocate(self.cache, self.num_samples, capacity)
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


def _probe_run(model: Any) -> Any:
    """The shared-prefix probe's batch, sampled with or without shared prefixes (``shares_prefixes``)."""
    def run(cascade: bool) -> list[list[SampledSequence]]:
        params = SamplingParams(max_tokens=3, seed=0)
        return _Run(model, [[1, 2, 3], [2]], 2, params, (), context_length(model), cascade=cascade).generate()

    return run
