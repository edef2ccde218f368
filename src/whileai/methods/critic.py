"""The critic methods for one rollout per prompt: SAO and BPCO.

Both read the critic's prediction at every token from the row's ``values`` and compute a
length-adaptive GAE over each trajectory's action tokens (gamma = 1; ``_ops.gae_advantages``)::

    r_k = R on the last action token, 0 before;  V = 0 past the end
    delta_k = r_k + V_{k+1} - V_k;  A_k = delta_k + lambda A_{k+1};  lambda = 1 - 1/(gae_alpha L)

The bootstrap V_{k+1} is the next action token, so a tool/observation token between two actions is
skipped, not scored, and gets c = 0. Both return ``value_targets``: the Monte Carlo return R (gamma = 1)
on every token. The scan reads the critic only at action tokens; observation tokens get R as well
because it is their Monte Carlo return too, so a trainer that regresses the critic on every token
(a shared head) is not pulled toward a placeholder there.

Where both differ from the papers: lambda is floored at 0. The formula gives a negative lambda when
gae_alpha * L < 1 (BPCO's alpha = 0.4 at L = 2: lambda = -0.25), which would flip the sign of credit
passed back; the papers' replies are hundreds of tokens long, where the floor never binds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from whileai.errors import BatchError
from whileai.methods._ops import agree, far_outside, gae_advantages, no_behavior_note, unclipped_is_min
from whileai.methods.base import Sampled, Update, knob, plural, trajectory_list
from whileai.methods.defaults import DEFAULTS
from whileai.methods.run_spec import CriticSpec
from whileai.rows.batch import Batch

VALUES_WHY = "the critic's prediction at every token is the baseline the advantage is measured against"


def _stats(batch: Batch, admitted_B: np.ndarray, ratio_N: np.ndarray, advantage_N: np.ndarray,
           values_N: np.ndarray) -> dict[str, float]:
    return {
        "batch_mean_reward": float(batch.rewards_B.mean()),
        "admitted_share": float(admitted_B.mean()),
        "mean_ratio": batch.action_mean(ratio_N, admitted_B if admitted_B.any() else None),
        "mean_value": batch.action_mean(values_N),
        "mean_advantage": batch.action_mean(advantage_N),
    }


def _value_targets(batch: Batch) -> list[np.ndarray]:
    """R at every token: the Monte Carlo return from any point of the trajectory (gamma = 1)."""
    return batch.split(batch.spread(batch.rewards_B))


def _not_admitted_note(admitted_B: np.ndarray, why: str) -> list[str]:
    """One note naming the trajectories whose every action token was masked or clipped ("why")."""
    dropped = np.flatnonzero(~admitted_B)
    if not dropped.size:
        return []
    fate = agree(dropped.size, "it carries nothing and is", "they carry nothing and are")
    return [f"{plural(dropped.size, 'trajectory', 'trajectories')} {trajectory_list(dropped)} had every action "
            f"token {why}, so {fate} not admitted this update"]


def _token_place(batch: Batch, token: int) -> str:
    row = int(batch.row_index_N[token])
    return f"token {token - int(batch.offsets[row])} of trajectory {row}"


@dataclass(frozen=True)
class SAO(Sampled):
    """SAO, single-rollout asynchronous optimization (Hou et al. 2026, arXiv:2607.07508).

    A value critic in place of the group, length-adaptive GAE that skips observation tokens (Eq. 4-5),
    and a ratio band that masks a drifted token instead of clipping it (Eq. 2-3)::

        f(rho) = rho   if ratio[0] < rho < ratio[1] (strictly inside the band), else 0
        c_i,t  = f(rho_i,t) A_i,t / N                 (Eq. 1; N = action tokens in the batch)

    No advantage normalization: the critic is the baseline. The critic trains toward R at every
    token (squared error), ``critic_steps`` updates per policy update after ``critic_warmup`` critic-only
    ones; those, ``critic_learning_rate``, ``temperature`` and ``max_tokens`` are for the trainer.
    Rows must carry ``values``. Where we differ from the paper: lambda floored at 0 (module docstring);
    a trajectory with every action token outside the band counts as not admitted.
    """

    name = "sao"
    requires = {"values": VALUES_WHY}

    ratio: tuple[float, float] = knob()
    gae_alpha: float = knob()
    critic_steps: int = knob()
    critic_warmup: int = knob()
    critic_learning_rate: float = knob()

    run_settings = {"max_lag": None, "needs": ("values",)}  # the ratio band masks what a stale sampler moved

    def _run_spec(self) -> dict[str, Any]:
        return {"critic": CriticSpec(self.critic_learning_rate, self.critic_steps, self.critic_warmup)}

    def _update(self, batch: Batch) -> Update:
        values_N = batch.token_fields["values"]
        mask_N = batch.action_mask_N
        advantage_N = gae_advantages(batch, values_N, self.gae_alpha)
        ratio_N = batch.ratio_N
        low, high = self.ratio
        inside_N = (ratio_N > low) & (ratio_N < high)
        inside_N &= mask_N
        coefficients_N = np.multiply(ratio_N, advantage_N)  # advantage_N is 0 off action tokens
        coefficients_N *= inside_N
        coefficients_N /= batch.action_count
        admitted_B = batch.any_per_row(inside_N)
        stats = _stats(batch, admitted_B, ratio_N, advantage_N, values_N)
        outside_N = mask_N & ~inside_N
        stats["masked_token_share"] = float(np.count_nonzero(outside_N) / batch.action_count)
        return Update(self.name, batch.split(coefficients_N), batch.split(advantage_N), admitted_B, stats,
                      self._notes(batch, outside_N, admitted_B), _value_targets(batch))

    def _notes(self, batch: Batch, outside_N: np.ndarray, admitted_B: np.ndarray) -> list[str]:
        missing = no_behavior_note(batch, "the ratio band")
        if not outside_N.any():
            return missing
        low, high = self.ratio
        where = np.flatnonzero(outside_N)
        ratio = batch.ratio_N[where]
        k, factor = far_outside(ratio, low, high)
        rows = np.unique(batch.row_index_N[where])
        side = f"{factor:.3g}x below {low:g}" if ratio[k] <= low else f"{factor:.3g}x above {high:g}"
        notes = [
            f"{plural(where.size, 'action token')} in {plural(rows.size, 'trajectory', 'trajectories')} "
            f"{trajectory_list(rows)} had a ratio outside the band ({low:g}, {high:g}) and "
            f"{agree(where.size, 'was', 'were')} masked (c = 0; "
            f"furthest: ratio {ratio[k]:.3g} at {_token_place(batch, int(where[k]))}, {side}); the sampler drifted "
            "from the policy: check behavior_logprobs are the sampler's own, then sample fresher rollouts (lower "
            "off_policy_steps in wai.Async) or widen ratio"
        ]
        return missing + notes + _not_admitted_note(admitted_B, "outside the band")


class _Bound:
    """``BPCO.bound(z)`` on the class (default reward_range) or ``BPCO(...).bound(z)`` on an object."""

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        reward_range = obj.reward_range if obj is not None else DEFAULTS["bpco"]["reward_range"].value
        low, high = reward_range

        def bound(z: Any) -> Any:
            """V = R_min + (R_max - R_min) (1/2 + arctan(z)/pi): any real z lands strictly inside the range."""
            out = low + (high - low) * (0.5 + np.arctan(np.asarray(z, dtype=np.float64)) / np.pi)
            return float(out) if np.ndim(out) == 0 else out

        return bound


@dataclass(frozen=True)
class BPCO(Sampled):
    """BPCO, best-practice critic optimization (Qi et al. 2026, arXiv:2608.23566).

    A critic bounded to the reward's range (Eq. 9, ``bound(z)``), Monte Carlo value targets (R at every
    token; lambda_V = 1, Eq. 11), GAE at its natural scale with lambda = 1 - 1/(gae_alpha L)
    (Eq. 3, 4, 14; not normalized), and DPPO's clip on probability rather than ratio (Eq. 2)::

        mu_t = exp(behavior_logprob)   (exp(logprob) when a row has none)
        surrogate_t = min(rho A, clip(rho, 1 - clip/mu_t, 1 + clip/mu_t) A)
        c_i,t = rho A / B   where the unclipped branch is the minimum (ties included), else 0

    A rare token (small mu) may move its ratio further, because the same ratio change moves less
    probability. The loss sums a sequence's tokens and averages over sequences, so the only normalizer
    is 1/B. ``values`` must lie inside ``reward_range`` (a bounded critic cannot leave it): a value
    outside is a ``BatchError`` naming the row and token. ``critic_warmup``, ``learning_rate``, ``critic_learning_rate``,
    ``temperature`` and ``max_tokens`` are for the trainer. Where we differ from the paper: lambda
    floored at 0 (module docstring); a trajectory with every action token clipped counts as not admitted.
    """

    name = "bpco"
    requires = {"values": VALUES_WHY}

    clip: float = knob()
    gae_alpha: float = knob()
    reward_range: tuple[float, float] = knob()
    critic_warmup: int = knob()
    learning_rate: float = knob()
    critic_learning_rate: float = knob()

    bound = _Bound()

    run_settings = {"max_lag": None, "needs": ("values",)}

    def _run_spec(self) -> dict[str, Any]:
        return {"critic": CriticSpec(self.critic_learning_rate, 1, self.critic_warmup, self.reward_range)}

    def _update(self, batch: Batch) -> Update:
        values_N = batch.token_fields["values"]
        self._check_values(batch, values_N)
        mask_N = batch.action_mask_N
        advantage_N = gae_advantages(batch, values_N, self.gae_alpha)
        ratio_N = batch.ratio_N
        mu_N = np.exp(batch.behavior_logprobs_N)
        with np.errstate(divide="ignore"):  # mu underflowing to 0 gives an unbounded range, as it should
            low_N, high_N = 1.0 - self.clip / mu_N, 1.0 + self.clip / mu_N
        unclipped_N = unclipped_is_min(ratio_N, advantage_N, low_N, high_N)
        kept_N = mask_N & unclipped_N
        coefficients_N = np.multiply(ratio_N, advantage_N)  # advantage_N is 0 off action tokens
        coefficients_N *= kept_N
        coefficients_N /= batch.size
        admitted_B = batch.any_per_row(kept_N)
        clipped_N = mask_N & ~unclipped_N
        stats = _stats(batch, admitted_B, ratio_N, advantage_N, values_N)
        stats["clipped_token_share"] = float(np.count_nonzero(clipped_N) / batch.action_count)
        notes = no_behavior_note(batch, "the DPPO clip") + self._clip_notes(batch, clipped_N, admitted_B, low_N, high_N)
        notes += self._reward_notes(batch)
        return Update(self.name, batch.split(coefficients_N), batch.split(advantage_N), admitted_B, stats, notes,
                      _value_targets(batch))

    def _check_values(self, batch: Batch, values_N: np.ndarray) -> None:
        low, high = self.reward_range
        # action tokens only: the value at an environment token is never read (GAE bootstraps past it)
        outside = np.flatnonzero(((values_N < low) | (values_N > high)) & batch.action_mask_N)
        if outside.size:
            token = int(outside[0])
            raise BatchError(
                f"row {int(batch.row_index_N[token])}: field 'values' is {values_N[token]:g} at token "
                f"{token - int(batch.offsets[batch.row_index_N[token]])}, outside BPCO's reward_range ({low:g}, "
                f"{high:g}) ({plural(outside.size, 'value')} outside in the batch); BPCO's critic is bounded: pass "
                "the critic head's raw output z through BPCO(...).bound(z), or set reward_range to your rewards' range"
            )

    def _clip_notes(self, batch: Batch, clipped_N: np.ndarray, admitted_B: np.ndarray, low_N: np.ndarray,
                    high_N: np.ndarray) -> list[str]:
        if not clipped_N.any():
            return []
        where = np.flatnonzero(clipped_N)
        ratio = batch.ratio_N[where]
        k, factor = far_outside(ratio, low_N[where], high_N[where])
        token = int(where[k])
        rows = np.unique(batch.row_index_N[where])
        notes = [
            f"{plural(where.size, 'action token')} in {plural(rows.size, 'trajectory', 'trajectories')} "
            f"{trajectory_list(rows)} moved past {agree(where.size, 'its', 'their')} clip range 1 +/- clip/mu on the "
            f"side {agree(where.size, 'its', 'their')} advantage pushes and {agree(where.size, 'carries', 'carry')} 0 (furthest: ratio {ratio[k]:.3g} at {_token_place(batch, token)}, {factor:.3g}x past its "
            f"range [{max(low_N[token], 0.0):.3g}, {high_N[token]:.3g}]); the rollouts are staler than clip allows: "
            "sample fresher rollouts (lower off_policy_steps in wai.Async) or raise clip"
        ]
        return notes + _not_admitted_note(admitted_B, "clipped")

    def _reward_notes(self, batch: Batch) -> list[str]:
        low, high = self.reward_range
        outside = np.flatnonzero((batch.rewards_B < low) | (batch.rewards_B > high))
        if not outside.size:
            return []
        return [f"{plural(outside.size, 'reward')} {trajectory_list(outside)} lie outside reward_range ({low:g}, "
                f"{high:g}) (first: {batch.rewards_B[outside[0]]:g}), where the bounded critic can never predict "
                "them: set reward_range to the rewards' range, or rescale the rewards into it"]
