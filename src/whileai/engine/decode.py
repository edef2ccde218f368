"""One decoding step of a Llama- or Qwen2-family model with the Python work per token cut.

    step = decode_step(model)          # None when the model is not of a family this covers
    logits_BV = step(ids_B1, mask_BL, positions_B1, cache)

``transformers`` runs a decoding step through several layers of wrappers per decoder layer (keyword
plumbing, deprecation and output-capture decorators, module calls, the attention interface's checks);
for a narrow model each costs more than the layer's arithmetic, which is why a token takes as long at
batch 1 as at batch 512 on a GPU. ``DecodeStep`` runs the same arithmetic with the wrappers left out:
the same kernels on the same shapes in the same order (a plain ``nn.Linear`` as ``F.linear`` on its
weights, the RMS norm's and the MLP's own operations, the rotary embedding with ``rotate_half(x) * sin``
written as ``roll(x) * (±sin)``, exact in floating point since only signs move, the cache's own
``update``, the model's mask function and attention interface, or ``scaled_dot_product_attention`` called
as transformers' SDPA interface calls it). Its logits are bit for bit those of ``model(...)`` on the same
inputs, so the sampler's tokens and log-probabilities do not change (``tests/engine/test_decode.py``).
A module of another kind (a LoRA layer, a hooked module) is called as a module, which keeps the result.

``StaticDecode`` is the fixed-shape form a CUDA graph needs: keys/values in buffers of the whole
generation's length, a boolean mask over them, the write position a tensor, so every step launches the
same kernels on the same addresses; ``capture()`` records it once as a ``torch.cuda.CUDAGraph`` and each
token is then one replay. Attention over the full buffer with a mask sums the same terms as attention
over the filled part in another order: equal to rounding, not bit for bit
(``sample(..., static_cache=True)`` on any device; ``cuda_graph=True`` on CUDA).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

# Decoder layers whose forward is exactly: norm -> attention (q/k/v, rotary, cache, attention interface, o) ->
# residual -> norm -> MLP -> residual. Other families (sliding windows, q/k norms, soft-capping) use model(...).
FAMILIES = {"Qwen2DecoderLayer", "LlamaDecoderLayer"}
Fn = Callable[[torch.Tensor], torch.Tensor]


def base_model(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _hooked(module: Any) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def decode_step(model: Any) -> DecodeStep | None:
    """The fast step for ``model``, or None where it does not apply (another family, sliding-window layers,
    hooks on the modules it bypasses, a final-logit cap): the caller then runs ``model(...)``."""
    base = base_model(model)
    inner = getattr(base, "model", None)
    layers = getattr(inner, "layers", None)
    config = getattr(base, "config", None)
    if layers is None or config is None or not len(layers):
        return None
    if any(type(layer).__name__ not in FAMILIES for layer in layers) or getattr(inner, "has_sliding_layers", False):
        return None
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "pretraining_tp", 1) != 1:
        return None
    bypassed = (base, inner, *layers, *(m for layer in layers for m in (layer.self_attn, layer.mlp)))
    if any(_hooked(m) for m in bypassed):
        return None
    if set(getattr(config, "layer_types", None) or ["full_attention"]) != {"full_attention"}:
        return None
    return DecodeStep(base)


def _linear(module: Any) -> Fn:
    """``module(x)``, as ``F.linear`` on its weights when it is a plain ``nn.Linear`` without hooks."""
    if type(module) is torch.nn.Linear and not _hooked(module):
        return functools.partial(F.linear, weight=module.weight, bias=module.bias)
    return module  # type: ignore[no-any-return]


def _norm(module: Any) -> Fn:
    """An RMS norm's forward, its operations inlined when it is the family's own (weight * x / rms)."""
    if not type(module).__name__.endswith("RMSNorm") or _hooked(module) or not hasattr(module, "variance_epsilon"):
        return module  # type: ignore[no-any-return]
    weight, eps = module.weight, module.variance_epsilon
    width = weight.shape[-1]

    def norm(x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and x.is_cpu:  # .to(float32) would return x; a CPU mean is sum, then / n
            return weight * (x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True).div_(width) + eps))
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        return weight * (x * torch.rsqrt(variance + eps)).to(dtype)

    return norm


def _mlp(module: Any, config: Any) -> Fn:
    """``down(act(gate(x)) * up(x))`` with the projections as ``_linear`` (SiLU as ``F.silu``)."""
    names = ("gate_proj", "up_proj", "down_proj", "act_fn")
    if not type(module).__name__.endswith("MLP") or not all(hasattr(module, n) for n in names):
        return module  # type: ignore[no-any-return]
    gate, up, down = _linear(module.gate_proj), _linear(module.up_proj), _linear(module.down_proj)
    act = F.silu if type(module.act_fn).__name__ in ("SiLUActivation", "SiLU") else module.act_fn

    def mlp(x: torch.Tensor) -> torch.Tensor:
        return down(act(gate(x)) * up(x))

    return mlp


class _Layer:
    """One decoder layer's pieces, ready to call."""

    def __init__(self, layer: Any, config: Any) -> None:
        attention = layer.self_attn
        self.attention = attention
        self.norm, self.post_norm = _norm(layer.input_layernorm), _norm(layer.post_attention_layernorm)
        self.q, self.k, self.v = _linear(attention.q_proj), _linear(attention.k_proj), _linear(attention.v_proj)
        self.o = _linear(attention.o_proj)
        self.mlp = _mlp(layer.mlp, config)
        self.scaling = attention.scaling
        self.groups = attention.num_key_value_groups


class DecodeStep:
    """``logits_BV = step(ids_B1, mask_BL | None, positions_B1, cache)``: the last position's logits of one new
    token per row, the cache updated: the arithmetic of ``model(..., logits_to_keep=1)``."""

    def __init__(self, base: Any) -> None:
        from transformers.masking_utils import create_causal_mask

        self.inner, self.head, self.config = base.model, base.get_output_embeddings(), base.config
        self.layers = [_Layer(layer, self.config) for layer in self.inner.layers]
        self.family = sys.modules[type(self.inner.layers[0]).__module__]
        self.mask_function = create_causal_mask
        self.head_dim = self.inner.layers[0].self_attn.head_dim
        self.final_norm = _norm(self.inner.norm)
        self.project = _linear(self.head)
        from transformers.integrations.sdpa_attention import use_gqa_in_sdpa

        width = torch.empty(0, self.head_dim)
        # transformers' SDPA interface with no mask: enable_gqa for grouped heads where this holds (else pack_gqa)
        self.plain_sdpa = self.layers[0].groups == 1 or use_gqa_in_sdpa(None, width, width)
        self.unmasked = False  # the mask function returned None for a batch without padding: it will again

    def _attend(self, mask: Any) -> Callable[..., torch.Tensor]:
        """The attention of this step: SDPA called as transformers' SDPA interface calls it with no mask
        (``enable_gqa`` for grouped heads), else the model's attention interface itself."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        name = self.config._attn_implementation
        if name == "sdpa" and mask is None and self.plain_sdpa:
            def sdpa(layer: _Layer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                extra = {"enable_gqa": True} if layer.groups > 1 else {}
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, scale=layer.scaling,
                                                     is_causal=False, **extra)
                return out.transpose(1, 2)  # (B, 1, heads, D): the layout transformers' .contiguous() gives

            return sdpa
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(name, self.family.eager_attention_forward)

        def generic(layer: _Layer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return interface(layer.attention, q, k, v, mask, dropout=0.0, scaling=layer.scaling, sliding_window=None)[0]

        return generic

    def __call__(self, ids_B1: torch.Tensor, mask_BL: torch.Tensor | None, positions_B1: torch.Tensor,
                 cache: Any) -> torch.Tensor:
        h_B1H = self.inner.embed_tokens(ids_B1)
        mask = None
        if mask_BL is not None or not self.unmasked:
            mask = self.mask_function(config=self.config, inputs_embeds=h_B1H, attention_mask=mask_BL, cache=cache,
                                      position_ids=positions_B1)
            self.unmasked = mask_BL is None and mask is None
        cos, sin = self.inner.rotary_emb(h_B1H, positions_B1)
        cos, sin_signed, half = rotary_parts(cos, sin)
        attend = self._attend(mask)
        # One position per row: hidden states as (B, H) matrices, so each projection is one mm / addmm, the one
        # a (B, 1, H) input folds to; heads as (B, heads, 1, D), the (B, 1, heads, D) transposed of transformers
        batch = h_B1H.shape[0]
        h = h_B1H.view(batch, -1)
        shape = (batch, -1, 1, self.head_dim)
        for index, layer in enumerate(self.layers):
            x = layer.norm(h)
            q = layer.q(x).view(shape)
            qk = rotate(torch.cat((q, layer.k(x).view(shape)), dim=1), cos, sin_signed, half)
            q, k = qk[:, : q.shape[1]], qk[:, q.shape[1]:]  # one rotation for both: the same products, elementwise
            k, v = cache.layers[index].update(k, layer.v(x).view(shape))
            h = h + layer.o(attend(layer, q, k, v).reshape(batch, -1))
            h = h + layer.mlp(layer.post_norm(h))
        return self.project(self.final_norm(h))


def rotary_parts(cos_BTD: torch.Tensor, sin_BTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``cos`` and ``sin`` shaped for (B, heads, T, D) and ``sin`` with its first half negated, so that
    ``x * cos + roll(x, D/2) * sin_signed`` is ``x * cos + rotate_half(x) * sin`` bit for bit
    (``rotate_half(x) = cat(-x2, x1)`` and ``roll(x, D/2) = cat(x2, x1)``: only signs differ)."""
    half = cos_BTD.shape[-1] // 2
    sign = torch.ones(cos_BTD.shape[-1], dtype=sin_BTD.dtype, device=sin_BTD.device)
    sign[:half] = -1
    return cos_BTD.unsqueeze(1), (sin_BTD * sign).unsqueeze(1), half


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, half: int) -> torch.Tensor:
    return (x * cos) + (x.roll(half, -1) * sin_signed)


def static_ready(model: Any, *, graph: bool) -> bool:
    """``graph`` when ``model`` can decode with fixed shapes (and, with ``graph``, as a CUDA graph), else a
    ``ConfigError`` saying why not."""
    from whileai.errors import ConfigError

    device = next(model.parameters()).device
    if graph and device.type != "cuda":
        raise ConfigError(f"cuda_graph=True needs the model on a CUDA device; it is on {device}. Leave it False "
                          "on other devices (the exact step there is already the fast one)")
    if decode_step(model) is None:
        raise ConfigError(f"fixed-shape decoding (static_cache / cuda_graph) covers the Llama and Qwen2 families "
                          f"without hooks; {type(base_model(model)).__name__} is not one of them: leave both False")
    return graph


def static_decode(model: Any, cache: Any, mask_BL: torch.Tensor | None, filled: int, capacity: int, *,
                  graph: bool) -> StaticDecode:
    """A ``StaticDecode`` holding a prefilled cache's first ``filled`` positions; recorded as a CUDA graph when
    ``graph``, else run step by step (the same arithmetic on any device)."""
    first = cache.layers[0].keys
    static = StaticDecode(base_model(model), first.shape[0], capacity, first.device, first.dtype)
    static.prefill(cache, mask_BL, filled)
    if graph:
        static.capture()
    return static


class StaticDecode:
    """The fixed-shape step: every row's keys/values in ``(B, KV, capacity, D)`` buffers, a boolean mask
    ``(B, 1, 1, capacity)`` of the positions each row may read, the next write slot as a tensor. Nothing in a
    step depends on a Python value that changes between steps, so ``capture()`` can record it on CUDA.

    ``prefill(cache, mask_BL, filled)`` copies a prefilled cache (its first ``filled`` positions) and mask in;
    ``step(ids_B1, positions_B1)`` writes at the slot, advances it, and returns the logits."""

    def __init__(self, base: Any, batch: int, capacity: int, device: torch.device, dtype: torch.dtype) -> None:
        self.fast = DecodeStep(base)
        kv_heads = self.fast.config.num_key_value_heads
        self.keys = [torch.zeros(batch, kv_heads, capacity, self.fast.head_dim, device=device, dtype=dtype)
                     for _ in self.fast.layers]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.mask_B11L = torch.zeros(batch, 1, 1, capacity, dtype=torch.bool, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.ids_B1 = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.positions_B1 = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.logits_BV: torch.Tensor | None = None
        self.graph: Any = None

    def prefill(self, cache: Any, mask_BL: torch.Tensor | None, filled: int) -> None:
        for index, layer in enumerate(cache.layers):
            self.keys[index][:, :, :filled] = layer.keys[..., :filled, :]
            self.values[index][:, :, :filled] = layer.values[..., :filled, :]
        self.mask_B11L[:, 0, 0, :filled] = True if mask_BL is None else mask_BL[:, :filled].bool()
        self.slot.fill_(filled)

    def _run(self) -> torch.Tensor:
        fast = self.fast
        h = fast.inner.embed_tokens(self.ids_B1)
        cos, sin = fast.inner.rotary_emb(h, self.positions_B1)
        cos, sin_signed, half = rotary_parts(cos, sin)
        self.mask_B11L.index_fill_(-1, self.slot, True)
        shape = (h.shape[0], 1, -1, fast.head_dim)
        for index, layer in enumerate(fast.layers):
            x = layer.norm(h)
            q = rotate(layer.q(x).view(shape).transpose(1, 2), cos, sin_signed, half)
            k = rotate(layer.k(x).view(shape).transpose(1, 2), cos, sin_signed, half)
            v = layer.v(x).view(shape).transpose(1, 2)
            self.keys[index].index_copy_(2, self.slot, k)
            self.values[index].index_copy_(2, self.slot, v)
            out = F.scaled_dot_product_attention(q, self.keys[index], self.values[index], attn_mask=self.mask_B11L,
                                                 scale=layer.scaling, enable_gqa=layer.groups > 1)
            h = h + layer.o(out.transpose(1, 2).reshape(h.shape[0], 1, -1))
            h = h + layer.mlp(layer.post_norm(h))
        h = fast.final_norm(h)
        self.slot.add_(1)
        return fast.project(h[:, -1:, :])[:, -1, :]

    def capture(self) -> None:
        """Record one step as a CUDA graph (after warm-up steps on a side stream, as torch's docs advise); later
        steps replay it. The warm-ups' writes land where the first real step writes again (slot and mask reset)."""
        start, mask = self.slot.clone(), self.mask_B11L.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._run()
                self.slot.copy_(start)
                self.mask_B11L.copy_(mask)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits_BV = self._run()
        self.slot.copy_(start)
        self.mask_B11L.copy_(mask)

    def step(self, ids_B1: torch.Tensor, positions_B1: torch.Tensor) -> torch.Tensor:
        self.ids_B1.copy_(ids_B1)
        self.positions_B1.copy_(positions_B1)
        if self.graph is None:
            return self._run()
        self.graph.replay()
        assert self.logits_BV is not None
        return self.logits_BV
