"""The distribution the sampler draws from, the draw, and each sample's random stream.

What a sampled token's logprob means: ``logprobs[t]`` is the log-probability with which the sampler drew
``tokens[t]``, i.e. under the distribution it actually sampled from: the logits divided by the
temperature, then filtered by top-k and top-p, then renormalised. With the defaults (temperature 1,
no top-k, top-p 1) that is the model's own log-probability. With ``temperature=0`` (greedy) the
sampler picks the arg-max with probability 1, so every logprob is 0.0.

Randomness: sample ``j`` of prompt ``i`` draws from its own random stream, seeded from
``(seed, i, j)``. The same seed therefore gives the same samples whatever the batch looks like, and
the streams are made on the CPU, so CPU and CUDA draw the same uniforms. A step's draw is one pass of exp
and cumulative sum over the vocabulary, with no Python work per row.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from whileai.engine.sampling import SamplingParams


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
