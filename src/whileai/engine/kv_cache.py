"""The sampler's key/value cache: transformers' ``DynamicCache`` with each layer's keys and values written into
buffers allocated once for the whole generation (no per-step concatenation, which copies the whole cache once
per token), and the forward's keyword names across transformers versions."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from whileai.engine.decode import base_model


def step_kwargs(model: Any) -> dict[str, Any]:
    """Keyword names differ across transformers versions: ``cache`` (5.x) or ``past_key_values``."""
    names = set(inspect.signature(base_model(model).forward).parameters)
    return {
        "cache": "cache" if "cache" in names else "past_key_values",
        "extra": {"logits_to_keep": 1} if "logits_to_keep" in names else {},
    }


def cache_of(out: Any) -> Any:
    cache = out.get("cache")
    return cache if cache is not None else out.get("past_key_values")


def growing_layer_class() -> Any:
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


def preallocate(cache: Any, num_samples: int, capacity: int) -> None:
    """Copy every layer's prefilled keys/values ``num_samples`` times into a buffer of ``capacity``
    positions. Layers of another kind (sliding windows, caches without ``layers``) are only repeated."""
    from transformers.cache_utils import DynamicLayer

    if not _GROWING:
        _GROWING.append(growing_layer_class())
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


def select_rows(cache: Any, keep: torch.Tensor) -> None:
    cache.batch_select_indices(keep)
