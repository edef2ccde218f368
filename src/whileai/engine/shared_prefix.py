"""Shared-prefix ("cascade") attention: the samples of a prompt read its keys/values from one copy.

In a decode step every row's query attends to its prompt (the prefix) and to its own generated
tokens (the suffix). With k samples per prompt, a plain cache holds the prefix k times and reads it
k times per step; here it is held once per prompt and the k queries of a prompt meet it in one
matrix product. The two parts' scores share one softmax, so the result is exact attention.
Used only where a one-time probe shows the model routes its attention through transformers'
attention interface (``shares_prefixes``); otherwise the plain cache (``whileai.engine.kv_cache``) is used.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from whileai.engine.decode import base_model
from whileai.engine.kv_cache import growing_layer_class
from whileai.errors import WhileaiError

CASCADE = "whileai_shared_prefix"
_ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("whileai_shared_prefix", default=None)


class SharedPrefix:
    """The prompts' keys/values per layer, the prompts' padding, and which row of the batch is which."""

    def __init__(self, prefixes: list[tuple[torch.Tensor, torch.Tensor]], padding_N1L: torch.Tensor | None,
                 num_samples: int) -> None:
        self.prefixes, self.num_samples = prefixes, num_samples
        self.bias_N11L = None if padding_N1L is None else torch.zeros(padding_N1L.shape, dtype=torch.float32,
                                                                       device=padding_N1L.device).masked_fill(
            ~padding_N1L.bool(), -math.inf)[:, :, None, :]
        self.rows_B: torch.Tensor = torch.zeros(0)

    @classmethod
    def attach(cls, cache: Any, mask_NL: torch.Tensor | None, num_samples: int, steps: int) -> SharedPrefix:
        """Turn every layer of a prefilled cache into a suffix buffer of ``steps`` positions per row."""
        layer_class = suffix_layer_class()
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


def suffix_layer_class() -> Any:
    """A cache layer whose prompt part lives in ``SharedPrefix``; it stores each row's new tokens only."""
    grow = growing_layer_class()

    class SuffixLayer(grow):  # type: ignore[misc, valid-type]
        prefix_length: int

        def get_seq_length(self) -> int:
            return self.prefix_length + self.filled

    return SuffixLayer


def _shared_prefix_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: Any, scaling: float | None = None, **kwargs: Any) -> Any:
    shared = _ACTIVE.get()
    if shared is None or query.shape[2] != 1:
        raise WhileaiError("whileai's shared-prefix attention runs only inside whileai.engine.generation.sample")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return shared.attend(module.layer_idx, query, key, value, scale), None


@contextlib.contextmanager
def prefix_attention(model: Any, shared: SharedPrefix | None) -> Iterator[None]:
    """Within the block, the model's attention is ``_shared_prefix_attention`` over ``shared``."""
    if shared is None:
        yield
        return
    config = base_model(model).config
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
Probe = Callable[[bool], Any]
"""``run(cascade)``: the sampler's results on a fixed small batch (2 padded prompts x 2 samples) with or without
shared prefixes"""


def shares_prefixes(model: Any, run: Probe) -> bool:
    """Whether shared-prefix attention gives this model's results: checked once per model class and
    attention implementation, by sampling the probe's batch both ways (logprobs within 1e-4)."""
    config = getattr(base_model(model), "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    key = (type(base_model(model)), implementation)
    if key not in _PROBED:
        _PROBED[key] = implementation is not None and _probe(run)
    return _PROBED[key]


def _probe(run: Probe) -> bool:
    try:
        _register_cascade()
        plain, shared = run(False), run(True)
    except Exception:  # any model this does not fit falls back to the plain cache
        return False
    pairs = [(a, b) for x, y in zip(plain, shared) for a, b in zip(x, y)]
    return all(a.tokens == b.tokens and np.allclose(a.logprobs, b.logprobs, atol=1e-4, rtol=0) for a, b in pairs)
