"""CustomLoss: your own advantage function over a batch, run through an engine loss (the build_loss hook).

The service page's ``build_loss(sample, ...)`` lets a user write the caller-side math of an algorithm the
library does not ship. Here that is a method like any other: ``CustomLoss(advantages=fn, loss="ppo")``
calls ``fn(batch)`` (a validated ``whileai.rows.Batch``) on every update and sends what it returns as the
per-token advantages of ``loss``; ``Update.coefficients`` are that loss's gradient at the rows' logprobs
(``whileai.methods.losses``), so ``wai update``, the loop and a Tinker server all read it the same way::

    def leave_one_out(batch):                      # one number per row, broadcast over its tokens
        r = batch.rewards_B
        return r - (r.sum() - r) / (len(r) - 1)

    wai.CustomLoss(advantages=leave_one_out, loss="importance_sampling", rollouts_per_prompt=4)

``fn`` returns one number per row (shape ``(B,)``), one per token of the batch (``(N,)``), or a list of
one array per row; observation tokens (``action_mask`` false) get 0 whatever it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from whileai.errors import BatchError
from whileai.methods import losses
from whileai.methods.base import SampledPerPrompt, Update, knob
from whileai.methods.run_spec import FILLABLE
from whileai.rows.batch import Batch

AdvantageFn = Callable[[Batch], Any]


@dataclass(frozen=True)
class CustomLoss(SampledPerPrompt):
    """A user's advantage function (``advantages``) under an engine ``loss``; the other knobs say how to sample.

    ``needs`` lists row fields the loop must fill before the update (keys of ``RunSpec``'s ``FILLABLE``,
    e.g. ``("ref_logprobs",)``), which ``fn`` may then read from ``batch.token_fields``.
    """

    name = "custom_loss"

    advantages: AdvantageFn | None = None
    loss: str = knob()
    clip: float = knob()
    clip_high: float | None = knob()
    needs: tuple[str, ...] = ()

    def _check(self) -> list[str]:
        problems = []
        if not callable(self.advantages):
            problems.append(f"CustomLoss.advantages={self.advantages!r} is invalid: it must be a function taking a "
                            "whileai Batch and returning one advantage per row or per token")
        unknown = [n for n in self.needs if n not in FILLABLE]
        if unknown:
            problems.append(f"CustomLoss.needs={self.needs!r} is invalid: {unknown[0]!r} is not a field a loop fills; "
                            f"the fields are {', '.join(FILLABLE)}")
        return problems

    def loss_config(self) -> dict[str, Any]:
        return losses.clip_config(self.clip, self.clip_high) if self.loss in losses.CLIPPED else {}

    run_settings = {"max_lag": None}

    def _run_spec(self) -> dict[str, Any]:
        return {"needs": tuple(self.needs)}

    def _update(self, batch: Batch) -> Update:
        assert self.advantages is not None  # _check
        advantage_N = per_token(batch, self.advantages(batch)) * batch.action_weight_N
        if self.loss == "cross_entropy":
            coefficients_N = advantage_N
        else:
            coefficients_N = losses.coefficients(self.loss, batch, advantage_N, self.loss_config())
        admitted_B = batch.any_per_row(advantage_N != 0)
        stats = {"batch_mean_reward": float(batch.rewards_B.mean()), "admitted_share": float(admitted_B.mean()),
                 "mean_abs_advantage": float(np.abs(advantage_N).sum() / max(batch.action_count, 1))}
        return Update(self.name, batch.split(coefficients_N), batch.split(advantage_N), admitted_B, stats)


def per_token(batch: Batch, out: Any) -> np.ndarray:
    """The function's answer as one float per token of the batch; a wrong shape or a non-finite value is a
    ``BatchError`` naming what it should have been."""
    if isinstance(out, (list, tuple)) and len(out) == batch.size and batch.size != len(batch.logprobs_N):
        parts = [np.broadcast_to(np.asarray(a, dtype=np.float64), (int(n),)) for a, n in zip(out, batch.lengths_B)]
        values = np.concatenate(parts) if parts else np.zeros(0)
    else:
        values = np.asarray(out, dtype=np.float64)
        if values.shape == (batch.size,) and batch.size != len(batch.logprobs_N):
            values = batch.spread(values)
        elif values.shape != (len(batch.logprobs_N),):
            raise BatchError(f"custom_loss: the advantages function returned shape {values.shape}; return one number "
                             f"per row ({batch.size},), one per token ({len(batch.logprobs_N)},), or a list of one "
                             "array per row")
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        row = int(batch.row_index_N[bad[0]])
        raise BatchError(f"row {row}: the custom_loss advantages function gave {values[bad[0]]} at token "
                         f"{int(bad[0] - batch.offsets[row])}; every advantage must be a finite number")
    return values.astype(np.float64, copy=True)
