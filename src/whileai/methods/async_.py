"""Async: any method trained on rollouts that lag the policy, with one per-token sampler correction.

Yao et al. 2025 (the sampler/trainer gap exists even at zero lag); the three corrections multiply the
wrapped method's coefficient on each action token:

    ipo:    c <- c * 1[|pi - mu| <= threshold]          probabilities, pi = exp(logprobs), mu = exp(behavior)
    icepop: c <- c * 1[ratio[0] <= rho <= ratio[1]]     (Ring-1T, arXiv:2510.18855; band inclusive)
    tis:    c <- c * min(rho, max_ratio) / rho          (verl; the ratio already inside c is capped)

``off_policy_steps`` is the lag bound the sampler is held to (ScaleRL, arXiv:2510.13786); the update
itself reads only the rows. Where we differ from the methods reference: its tis line reads
``c * min(rho, max_ratio)``; every policy-gradient c here already carries rho, so we replace that rho by
the capped one (c * min(rho, max_ratio) / rho) rather than multiplying in a second ratio. For a wrapped
method whose c has no rho (SFT) the same factor caps the weight of a token the policy now prefers; OPD
and OPSD already weight each token by min(rho, their own max_ratio), so wrap them in tis only to cap
harder (the two caps multiply above the smaller one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from whileai.errors import ConfigError
from whileai.methods._ops import agree, no_behavior_note
from whileai.methods.base import Method, Update, knob, plural, trajectory_list
from whileai.methods.registry import method as by_name
from whileai.methods.run_spec import RunSpec
from whileai.rows.batch import Batch


@dataclass(frozen=True)
class Async(Method):
    """A wrapped method (an object or a registry name) plus a per-token off-policy correction.

    ``Async("grpo", correction="icepop")`` or ``Async(wai.GRPO(clip=0.3), correction="tis")``;
    ``.method`` is always the resolved method object. The update is the wrapped method's, with
    c multiplied per action token by the correction's factor (module docstring); advantages,
    admitted trajectories and value targets pass through unchanged.
    """

    name = "async"

    method: Any = None
    correction: str = knob()
    off_policy_steps: int = knob()
    threshold: float = knob()
    ratio: tuple[float, float] = knob()
    max_ratio: float = knob()

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", _resolve(self.method))
        super().__post_init__()

    @property
    def requires(self) -> dict[str, str]:  # type: ignore[override]
        """The wrapped method's required row fields (a loop attaches a critic when it needs values)."""
        return dict(self.method.requires)

    def run_spec(self) -> RunSpec:
        """The wrapped method's, with the lag bound set by this correction's off_policy_steps."""
        return replace(self.method.run_spec(), max_lag=self.off_policy_steps)

    def initial_state(self) -> dict[str, Any] | None:
        return self.method.initial_state()

    def _update(self, batch: Batch) -> Update:
        return self._correct(batch, self.method.update(batch))

    def _update_with_state(self, batch: Batch, state: Mapping[str, Any]) -> Update:
        return self._correct(batch, self.method.update(batch, state=state))

    def _correct(self, batch: Batch, inner: Update) -> Update:
        """The wrapped method's update with this correction's factor on every action token."""
        factor_N, affected_N = self._factor(batch)
        if all(c.ndim == 1 for c in inner.coefficients):  # one flat product instead of one per row
            flat_N = np.concatenate(inner.coefficients)
            flat_N *= factor_N
            coefficients = batch.split(flat_N)
        else:  # top-k coefficients (T_i, K): the token's factor on every slot
            coefficients = [c * f.reshape(f.shape + (1,) * (c.ndim - 1))
                            for c, f in zip(inner.coefficients, batch.split(factor_N))]
        stats = dict(inner.stats)
        key = "correction_capped_share" if self.correction == "tis" else "correction_masked_share"
        stats[key] = float(np.count_nonzero(affected_N) / batch.action_count)
        notes = list(inner.notes) + no_behavior_note(batch, f"the {self.correction} correction")
        notes += self._notes(batch, affected_N)
        return Update(f"async({inner.method}, {self.correction})", coefficients, inner.advantages, inner.admitted,
                      stats, notes, inner.value_targets, inner.state, inner.drift)

    def _factor(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """The per-token multiplier, and the action tokens it changed."""
        mask_N = batch.action_mask_N
        if self.correction == "tis":
            # min(rho, cap) / rho = exp(min(0, log cap - log rho)): finite for any rho
            factor_N = np.exp(np.minimum(0.0, np.log(self.max_ratio) - batch.log_ratio_N))
            return factor_N, mask_N & (factor_N < 1.0)
        if self.correction == "ipo":
            # probabilities, not the (capped) ratio: a token the sampler gave ~0 may still have moved a lot
            keep_N = np.abs(np.exp(batch.logprobs_N) - np.exp(batch.behavior_logprobs_N)) <= self.threshold
        else:
            low, high = self.ratio
            keep_N = (batch.ratio_N >= low) & (batch.ratio_N <= high)
        return keep_N.astype(np.float64), mask_N & ~keep_N

    def _notes(self, batch: Batch, affected_N: np.ndarray) -> list[str]:
        if not affected_N.any():
            return []
        where = np.flatnonzero(affected_N)
        rows = np.unique(batch.row_index_N[where])
        who = (f"{plural(where.size, 'action token')} in {plural(rows.size, 'trajectory', 'trajectories')} "
               f"{trajectory_list(rows)}")
        lag = f"the sampler lags the policy: lower off_policy_steps (now {self.off_policy_steps})"
        if self.correction == "ipo":
            moved = np.abs(np.exp(batch.logprobs_N[where]) - np.exp(batch.behavior_logprobs_N[where]))
            return [f"{who} moved more than threshold {self.threshold:g} in probability and "
                    f"{agree(where.size, 'was', 'were')} masked by ipo "
                    f"(largest move {moved.max():.3g}); {lag} or raise threshold"]
        ratio = np.exp(batch.log_ratio_N[where])
        if self.correction == "icepop":
            low, high = self.ratio
            return [f"{who} had a ratio outside [{low:g}, {high:g}] and "
                    f"{agree(where.size, 'was', 'were')} masked by icepop (ratios from "
                    f"{ratio.min():.3g} to {ratio.max():.3g}); {lag} or widen ratio"]
        return [f"{who} had {agree(where.size, 'its', 'their')} ratio capped at max_ratio {self.max_ratio:g} by tis (largest {ratio.max():.3g}); "
                f"{lag} or raise max_ratio"]


def _resolve(method: Any) -> Method:
    """A method object as is, or one built from its registry name."""
    if isinstance(method, str):
        if method.strip().lower() == "async":
            raise ConfigError("Async.method='async' is invalid: Async wraps another method; name the one to "
                              "correct, e.g. method='grpo'")
        method = by_name(method)
    if isinstance(method, Async):
        raise ConfigError("Async.method is itself an Async; wrap the inner method once and pick one correction")
    if not isinstance(method, Method):
        raise ConfigError(f"Async.method={method!r} is invalid: it must be a method object such as wai.GRPO() or a "
                          "name such as 'grpo' (see wai.method_names(); from the shell: "
                          "--method async --knob method=grpo)")
    return method
