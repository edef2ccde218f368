"""The engine's named policy losses seen from a method: their config and their coefficient view, in numpy.

A method whose ``run_spec().loss`` is a named loss hands the step per-token advantages ``a`` (its
``Update.advantages``); the engine computes the live ratio ``r = exp(log p - log q)`` in the graph, with
``q`` the sampler's log-probabilities (the rows' ``behavior_logprobs``), and sums the per-token loss.
``Update.coefficients`` of such a method are that loss's gradient at the rows' ``logprobs``,
``c = -d loss / d log p``, so the kernel ``-c log p`` (``cross_entropy`` with weights ``c``) takes the same
first step: the coefficient view every method shares (reference/tinker.md 2.1; engine/losses.py)::

    importance_sampling  c = r a
    ppo                  c = r a where the unclipped branch is the minimum (ties included), else 0
    cispo                c = clip(r, lo, hi) a
    gspo                 c = s a likewise, s = exp(mean over the row's action tokens of log r)  (capped at e^10)
    dppo                 c = r a m, m = 0 where the token left DPPO's TV / KL trust region
    sapo                 c = 4 g (1 - g) r a, g = sigmoid(tau (r - 1)), tau = tau_pos if a > 0 else tau_neg

``clip`` and ``clip_high`` are relative epsilons everywhere in ``whileai.methods``; the loss config takes
absolute ratio bounds, ``clip_low_threshold = 1 - clip`` and ``clip_high_threshold = 1 + clip_high``
(``clip_high`` None: ``clip``). numpy only: the engine's torch functions are the other side of the contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from whileai.methods._ops import unclipped_is_min
from whileai.rows.batch import Batch

# The losses a method can name, and the config keys each takes (the engine's table, engine/losses.py).
NAMED_LOSSES: dict[str, tuple[str, ...]] = {
    "importance_sampling": (),
    "ppo": ("clip_low_threshold", "clip_high_threshold"),
    "cispo": ("clip_low_threshold", "clip_high_threshold"),
    "gspo": ("clip_low_threshold", "clip_high_threshold"),
    "dppo": ("delta_low", "delta_high", "dppo_type"),
    "sapo": ("tau_pos", "tau_neg"),
}
CLIPPED = ("ppo", "cispo", "gspo")
MAX_LOG_SEQUENCE_RATIO = 10.0  # the engine's cap on GSPO's log sequence ratio


def clip_config(clip: float, clip_high: float | None) -> dict[str, float]:
    """Relative epsilons as the loss config's absolute ratio bounds: 1 - clip and 1 + clip_high."""
    return {"clip_low_threshold": 1.0 - float(clip), "clip_high_threshold": 1.0 + float(clip if clip_high is None
                                                                                      else clip_high)}


def as_pairs(config: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A loss config as ``RunSpec.loss_config`` holds it: sorted (key, value) pairs."""
    return tuple(sorted(config.items()))


def coefficients(loss: str, batch: Batch, advantage_N: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """``-d loss / d log p`` per token at the rows' logprobs; 0 wherever the advantage is 0."""
    ratio_N = batch.ratio_N
    if loss == "importance_sampling":
        return ratio_N * advantage_N
    if loss in ("ppo", "gspo"):
        ratio = ratio_N if loss == "ppo" else sequence_ratio_N(batch)
        low, high = config["clip_low_threshold"], config["clip_high_threshold"]
        return np.where(unclipped_is_min(ratio, advantage_N, low, high), ratio * advantage_N, 0.0)
    if loss == "cispo":
        return np.clip(ratio_N, config["clip_low_threshold"], config["clip_high_threshold"]) * advantage_N
    if loss == "dppo":
        return np.where(dppo_kept(batch, advantage_N, config), ratio_N * advantage_N, 0.0)
    if loss == "sapo":
        tau_N = np.where(advantage_N > 0, float(config["tau_pos"]), float(config["tau_neg"]))
        gate_N = 1.0 / (1.0 + np.exp(-tau_N * (ratio_N - 1.0)))
        return 4.0 * gate_N * (1.0 - gate_N) * ratio_N * advantage_N
    raise ValueError(f"no coefficient view for loss {loss!r}")


def sequence_ratio_N(batch: Batch) -> np.ndarray:
    """GSPO's s_i = exp(mean of log r over row i's action tokens), spread over the row's tokens."""
    log_ratio_B = batch.per_row_sum(batch.log_ratio_N * batch.action_weight_N)
    log_ratio_B = log_ratio_B / np.maximum(batch.action_tokens_B, 1)
    return batch.spread(np.exp(np.minimum(log_ratio_B, MAX_LOG_SEQUENCE_RATIO)))


def dppo_kept(batch: Batch, advantage_N: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """DPPO's binary trust-region mask: False where the token's probability left the region."""
    pi_N, mu_N = np.exp(batch.logprobs_N), np.exp(batch.behavior_logprobs_N)
    low, high = config["delta_low"], config["delta_high"]
    if config["dppo_type"] == "binary_tv":
        dropped = ((advantage_N > 0) & (pi_N - mu_N > high)) | ((advantage_N < 0) & (mu_N - pi_N > low))
    else:  # binary_kl: the binary (token vs. rest) KL(mu || pi)
        div = mu_N * (batch.behavior_logprobs_N - batch.logprobs_N)
        div = div + (1 - mu_N) * np.log((1 - mu_N + 1e-8) / (1 - pi_N + 1e-8))
        dropped = ((advantage_N > 0) & (pi_N > mu_N) & (div > high)) | ((advantage_N < 0) & (pi_N < mu_N) & (div > low))
    return ~dropped


def clipped_share(loss: str, batch: Batch, advantage_N: np.ndarray, coefficients_N: np.ndarray) -> float:
    """Share of the action tokens whose advantage is nonzero but whose coefficient the loss set to 0."""
    zeroed = (advantage_N != 0) & (coefficients_N == 0) & batch.action_mask_N
    return float(np.count_nonzero(zeroed) / max(batch.action_count, 1))
