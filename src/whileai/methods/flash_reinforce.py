"""FlashReinforce: a batch-mean baseline, a sequence trust region on drift, and 1/T per trajectory.

Hu et al. 2026, FlashREINFORCE (NVIDIA). For trajectory i with reward R_i and T_i action tokens:

    A_i   = R_i - mean_j R_j                                  (Eq. 5; no std division)
    d_i,t = p log(p/q) + (1-p) log((1-p)/(1-q)),  p = mu, q = pi   (Eq. 6; Bernoulli KL per token)
    D_i   = mean_t d_i,t over action tokens;  m_i = 1[D_i <= trust]      (Eq. 7, 8)
    c_i,t = m_i A_i rho_i,t / (T_i B)                         (gradient of Eq. 9 with rho, A, m fixed)

Where we differ from the paper: nothing in the arithmetic. The paper leaves the batch normalizer
implicit; we put 1/B inside c so that splitting a batch never changes the summed gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from whileai.methods._ops import no_behavior_note
from whileai.methods.base import Sampled, Update, knob, plural, trajectory_list
from whileai.rows.batch import Batch


def bernoulli_kl(behavior_logprobs: np.ndarray, logprobs: np.ndarray,
                 log_ratio: np.ndarray | None = None) -> np.ndarray:
    """KL(Bernoulli(p) || Bernoulli(q)) per token, p = exp(behavior), q = exp(logprobs); always finite.

    The "this token versus everything else" divergence: it needs only the one probability each side
    gave the sampled token. Written as ``(1 - p) log((1 - p) / (1 - q)) - p (log q - log p)`` with
    ``1 - x = -expm1(log x)``; each ``1 - x`` is floored at 1e-30, so a token with probability 1 under
    the trained policy gives a large finite KL, not inf. ``log_ratio`` (log q - log p, uncapped) may be
    passed when already computed. Three transcendental calls per token, the rest in place.
    """
    if log_ratio is None:
        log_ratio = np.subtract(logprobs, behavior_logprobs)
    one_minus_p = np.expm1(behavior_logprobs)
    np.negative(one_minus_p, out=one_minus_p)
    p_log_ratio = np.subtract(1.0, one_minus_p)
    p_log_ratio *= log_ratio
    one_minus_q = np.expm1(logprobs)
    np.negative(one_minus_q, out=one_minus_q)
    np.maximum(one_minus_q, 1e-30, out=one_minus_q)
    np.maximum(one_minus_p, 1e-30, out=one_minus_p)
    kl = np.log(np.divide(one_minus_p, one_minus_q, out=one_minus_q), out=one_minus_q)
    kl *= one_minus_p
    kl -= p_log_ratio
    return kl


@dataclass(frozen=True)
class FlashReinforce(Sampled):
    """Critic-free REINFORCE for one rollout per prompt (Hu et al. 2026, FlashREINFORCE)."""

    name = "flash_reinforce"

    trust: float = knob()
    off_policy_steps: int = knob()

    def _run_spec(self) -> dict[str, Any]:
        return {"max_lag": self.off_policy_steps}

    def _update(self, batch: Batch) -> Update:
        tokens_B = batch.action_tokens_B
        advantage_B = batch.rewards_B - batch.rewards_B.mean()
        kl_N = bernoulli_kl(batch.behavior_logprobs_N, batch.logprobs_N, batch.log_ratio_N)
        kl_N *= batch.action_weight_N
        mean_kl_B = batch.per_row_sum(kl_N) / tokens_B
        admitted_B = mean_kl_B <= self.trust
        ratio_N = batch.ratio_N
        scale_B = np.where(admitted_B, advantage_B / (tokens_B * batch.size), 0.0)
        coefficients_N = batch.spread(scale_B)
        coefficients_N *= ratio_N
        coefficients_N *= batch.action_weight_N
        stats = {
            "batch_mean_reward": float(batch.rewards_B.mean()),
            "admitted_share": float(admitted_B.mean()),
            "mean_sequence_kl": float(mean_kl_B.mean()),
            "max_sequence_kl": float(mean_kl_B.max()),
            "mean_ratio": batch.action_mean(ratio_N, admitted_B if admitted_B.any() else None),
        }
        advantage_N = batch.spread(advantage_B)
        advantage_N *= batch.action_weight_N
        return Update(
            method=self.name,
            coefficients=batch.split(coefficients_N),
            advantages=batch.split(advantage_N),
            admitted=admitted_B,
            stats=stats,
            notes=self._notes(batch, mean_kl_B, admitted_B),
            drift=stats["mean_sequence_kl"],
        )

    def _notes(self, batch: Batch, mean_kl_B: np.ndarray, admitted_B: np.ndarray) -> list[str]:
        notes = no_behavior_note(batch, "the trust gate (it measured no drift and admitted them)")
        dropped = np.flatnonzero(~admitted_B)
        if dropped.size:
            notes.append(
                f"{plural(dropped.size, 'trajectory', 'trajectories')} {trajectory_list(dropped)} over trust "
                f"{self.trust:g} masked whole (max mean KL {mean_kl_B[dropped].max():.3f}); the sampler drifted "
                "further than the gate allows: check behavior_logprobs are the sampler's own, then lower "
                "off_policy_steps or raise trust"
            )
        if np.ptp(batch.rewards_B) == 0:
            notes.append(
                f"all {batch.size} rewards equal {batch.rewards_B[0]:g}, so every advantage is 0 and the update is "
                "empty; a batch baseline needs rewards that differ: grade more rows or mix easier and harder asks"
            )
        return notes
