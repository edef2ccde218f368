"""Memory-efficient per-token log-probabilities.

The naive ``log_softmax(model(x).logits).gather(...)`` materialises a float32 ``(T, V)`` tensor
twice (logits and log-softmax); at V = 151,936 and T = 2,048 that is 2.5 GB. Here the decoder's
last hidden states are projected through the output layer a chunk of positions at a time, each
chunk cast to float32 and reduced to ``logit[target] - logsumexp(logits)`` before the next chunk
starts, and only the positions asked for are projected at all. Under autograd every chunk is
recomputed in the backward pass (activation checkpointing) so the saved state is the hidden
states, not the logits.

Scoring under the sampler's distribution: a ``Distribution`` (temperature, top-k, top-p) makes the
log-probabilities those of the distribution ``whileai.engine.sampling`` draws from, so a token's score
at lag 0 equals the log-probability the sampler recorded for it. Temperature alone keeps the cheap
``logit[target] - logsumexp`` form; top-k / top-p build each chunk's full sampling distribution with
the sampler's own ``sampling_logprobs`` (a sort per position: slower, same memory bound).

Shape suffixes: ``_T`` positions of one sequence, ``_H`` hidden size, ``_V`` vocabulary, ``_K``
targets per position, ``_P`` selected positions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from whileai.engine.draw import sampling_logprobs
from whileai.engine.sampling import SamplingParams
from whileai.errors import ConfigError
from whileai.knobs import SCORED_FIELDS

# Positions projected through the output layer at once: 256 x 151,936 x 4 bytes = 155 MB.
DEFAULT_CHUNK = 256


@dataclass(frozen=True)
class Distribution:
    """The distribution tokens are scored under: the logits divided by ``temperature``, then the
    ``top_k`` most likely kept (0 or -1 = all), then the ``top_p`` nucleus kept (1 = all), renormalised.
    The default is the model's own distribution. Built from sampling settings by :func:`scoring`."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def truncates(self, vocab_size: int) -> bool:
        """Whether top-k or top-p removes tokens (then a token can have probability 0)."""
        return 0 < self.top_k < vocab_size or self.top_p < 1.0

    def describe(self) -> str:
        return f"temperature={self.temperature:g}, top_k={self.top_k}, top_p={self.top_p:g}"


PLAIN = Distribution()


def scoring(sampling_params: object) -> Distribution:
    """The ``Distribution`` of sampling settings: None (the model's own), a ``SamplingParams``, or a
    dict of its fields (only temperature, top_k and top_p change a distribution; ``max_tokens`` may be
    left out). Greedy (temperature 0) has no distribution to score under and is refused."""
    if sampling_params is None:
        return PLAIN
    if isinstance(sampling_params, Mapping):
        fields = list(SamplingParams.__dataclass_fields__)
        unknown = sorted(set(sampling_params) - set(fields))
        if unknown:
            raise ConfigError(f"sampling_params has unknown fields {unknown}; SamplingParams has {fields}")
        sampling_params = SamplingParams(**{"max_tokens": 1, **sampling_params})
    if not isinstance(sampling_params, SamplingParams):
        raise ConfigError(f"sampling_params={sampling_params!r:.80} must be None, a SamplingParams or a dict of "
                          f"its fields {SCORED_FIELDS}")
    if sampling_params.temperature == 0:
        raise ConfigError("sampling_params.temperature=0 (greedy) cannot be scored: the sampler then picks the "
                          "arg-max with probability 1, so every other token has log-probability -inf and no "
                          "gradient reaches the weights. Score with the temperature the tokens were sampled at "
                          "(> 0), or with sampling_params=None for the model's own distribution")
    return Distribution(float(sampling_params.temperature), int(sampling_params.top_k),
                        float(sampling_params.top_p))


def decoder_and_head(model: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The decoder stack (input ids -> last hidden states) and the output layer of a causal LM.

    Works for a plain transformers model and for a PEFT wrapper (the LoRA layers live inside
    both modules, so adapters are applied, and ``disable_adapter()`` switches them off).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def hidden_states(model: Any, input_ids_BT: torch.Tensor,
                  attention_mask_BT: torch.Tensor | None = None) -> torch.Tensor:
    """Last hidden states ``(B, T, H)`` of the decoder; the output layer is not applied."""
    decoder, _ = decoder_and_head(model)
    out = decoder(input_ids=input_ids_BT, attention_mask=attention_mask_BT, use_cache=False)
    return out.last_hidden_state


def _logit_transform(model: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """Final-logit soft-capping where the architecture has it (Gemma 2); identity otherwise."""
    cap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    if not cap:
        return lambda logits: logits
    return lambda logits: torch.tanh(logits / cap) * cap


def _at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 logits in float32; a float64 model (finite-difference tests) stays float64."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _distribution_logprobs(logits_PV: torch.Tensor, distribution: Distribution) -> torch.Tensor:
    """Log-probabilities of every token under ``distribution`` (-inf where truncation removed it)."""
    if distribution.truncates(logits_PV.shape[-1]):
        return sampling_logprobs(logits_PV, distribution.temperature, distribution.top_k, distribution.top_p)
    if distribution.temperature != 1.0:
        logits_PV = logits_PV / distribution.temperature
    return logits_PV - torch.logsumexp(logits_PV, dim=-1, keepdim=True)


def _chunk_logprobs(head: torch.nn.Module, transform: Callable[[torch.Tensor], torch.Tensor],
                    hidden_PH: torch.Tensor, targets_PK: torch.Tensor,
                    distribution: Distribution) -> torch.Tensor:
    logits_PV = _at_least_float32(transform(head(hidden_PH)))
    if distribution.truncates(logits_PV.shape[-1]):
        return _distribution_logprobs(logits_PV, distribution).gather(-1, targets_PK)
    if distribution.temperature != 1.0:
        logits_PV = logits_PV / distribution.temperature
    logz_P1 = torch.logsumexp(logits_PV, dim=-1, keepdim=True)
    return logits_PV.gather(-1, targets_PK) - logz_P1


def select_logprobs(model: Any, hidden_PH: torch.Tensor, targets_PK: torch.Tensor, *,
                    chunk_size: int = DEFAULT_CHUNK, distribution: Distribution = PLAIN) -> torch.Tensor:
    """``log pi(targets | hidden)`` for already-selected positions: ``(P, H), (P, K) -> (P, K)``, float32
    (float64 for a float64 model; float32 under truncation, as the sampler computes it).

    Under ``distribution`` with top-k / top-p a target outside the kept set gets ``-inf`` (probability
    0); callers that need a finite score check for it (see :func:`first_impossible`).
    Differentiable; when gradients are on, each chunk's logits are recomputed in the backward
    pass instead of being stored.
    """
    _, head = decoder_and_head(model)
    transform = _logit_transform(model)
    grad = torch.is_grad_enabled() and (hidden_PH.requires_grad or
                                        any(p.requires_grad for p in head.parameters()))
    # Only a head with active dropout (LoRA dropout on the output layer) draws random numbers to replay; for any
    # other, preserving the RNG state would set torch's global RNG in the backward, under the feet of a run that
    # another thread is initialising from its seed (wai serve creates runs concurrently)
    random = head.training and any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in head.modules())
    pieces = []
    for start in range(0, hidden_PH.shape[0], chunk_size):
        h = hidden_PH[start:start + chunk_size]
        t = targets_PK[start:start + chunk_size]
        if grad:
            pieces.append(checkpoint(_chunk_logprobs, head, transform, h, t, distribution,
                                     use_reentrant=False, preserve_rng_state=random))
        else:
            pieces.append(_chunk_logprobs(head, transform, h, t, distribution))
    if not pieces:
        dtype = torch.promote_types(hidden_PH.dtype, torch.float32)
        return torch.zeros(targets_PK.shape, dtype=dtype, device=hidden_PH.device)
    return torch.cat(pieces)


def token_logprobs(model: Any, hidden_TH: torch.Tensor, targets_T: torch.Tensor,
                   positions: torch.Tensor | None = None, *, chunk_size: int = DEFAULT_CHUNK,
                   distribution: Distribution = PLAIN) -> torch.Tensor:
    """Per-position log-probabilities of one sequence's targets.

    ``hidden_TH``: the decoder's last hidden states; ``targets_T`` is ``(T,)`` or ``(T, K)``
    (position i's targets, usually token i+1). ``positions``: a bool mask ``(T,)`` of the
    positions to score; the rest are returned as 0.0 and cost nothing. Returns float32 (float64
    for a float64 model) of the targets' shape.
    """
    flat = targets_T.dim() == 1
    targets_TK = targets_T.unsqueeze(-1) if flat else targets_T
    if positions is None:
        out_TK = select_logprobs(model, hidden_TH, targets_TK, chunk_size=chunk_size, distribution=distribution)
    else:
        index_P = positions.nonzero().squeeze(-1)
        picked = select_logprobs(model, hidden_TH[index_P], targets_TK[index_P],
                                 chunk_size=chunk_size, distribution=distribution)
        out_TK = torch.zeros(targets_TK.shape, dtype=picked.dtype, device=picked.device)
        out_TK = out_TK.index_put((index_P,), picked)
    return out_TK.squeeze(-1) if flat else out_TK


@torch.no_grad()
def topk_logprobs(model: Any, hidden_TH: torch.Tensor, k: int, *, chunk_size: int = DEFAULT_CHUNK,
                  distribution: Distribution = PLAIN) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely next tokens at every position: ``(ids_TK, logprobs_TK)`` under
    ``distribution`` (a token truncation removed has log-probability -inf)."""
    _, head = decoder_and_head(model)
    transform = _logit_transform(model)
    ids, values = [], []
    for start in range(0, hidden_TH.shape[0], chunk_size):
        logits = _at_least_float32(transform(head(hidden_TH[start:start + chunk_size])))
        top = _distribution_logprobs(logits, distribution).topk(k, dim=-1)
        ids.append(top.indices)
        values.append(top.values)
    return torch.cat(ids), torch.cat(values)


def first_impossible(logprobs: torch.Tensor) -> int | None:
    """Index (along the first dim) of the first ``-inf`` score (a target of probability 0), or None."""
    bad = torch.isneginf(logprobs.detach())
    rows = (bad.any(dim=-1) if bad.dim() > 1 else bad).nonzero()
    return int(rows[0]) if len(rows) else None


def naive_logprobs(model: Any, input_ids_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """The obvious reference: full float32 logits, ``log_softmax``, ``gather``. For tests and benchmarks."""
    logits = _at_least_float32(model(input_ids=input_ids_BT, use_cache=False).logits)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets_BT.unsqueeze(-1)).squeeze(-1)
