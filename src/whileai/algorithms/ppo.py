"""PPO's clipped surrogate on group-relative advantages (no critic).

Spec: 004 "PPO" (ppo.py). Paper: Schulman et al. 2017, arXiv:1707.06347 (Eq. 7, the clipped objective).
As the spec settles it, plain ``ppo`` reads the same tensors as ``importance_sampling`` and needs no
critic (that is ``ppo_critic``, never sent here); the advantage is GRPO's group-centred reward.

    A_i = R_i - mean_group(R);   loss ``ppo``: -min(r A, clip(r, lo, hi) A)

The clip thresholds are absolute ratio bounds. They go where the provider's capabilities say: scalar
``loss_fn_config`` keys, or per-token ``loss_fn_inputs`` (Tinker Cloud). Unset, nothing is sent and
the provider's own defaults apply (ours: 0.8 / 1.2, ``wai.engine.capabilities()``).
"""

from __future__ import annotations

from dataclasses import dataclass

from whileai.algorithms.core import (
    ForwardRequest,
    LossContext,
    Options,
    Sample,
    SampleRequest,
    group_mean_advantages,
    grouped_request,
    option,
)
from whileai.knobs import Knob, number, optional

LOSS = "ppo"
PROVIDER_DEFAULT = "the provider's default (ours: 0.8 / 1.2)"


def clip_knob(side: str, source: str, value: float | None = None) -> Knob:
    """An optional absolute ratio bound; None sends nothing and the provider's default applies."""
    return Knob(value, f"absolute {side} bound on the ratio (not an epsilon); None: the provider's default",
                optional(number(0.0), "the provider's default"), source)


@dataclass(frozen=True)
class PPOOptions(Options):
    clip_low: float | None = option(clip_knob("lower", PROVIDER_DEFAULT))
    """absolute lower ratio bound (e.g. 0.8); None: the provider's default"""
    clip_high: float | None = option(clip_knob("upper", PROVIDER_DEFAULT))
    """absolute upper ratio bound (e.g. 1.2); None: the provider's default"""


def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    advantages = [group_mean_advantages(g.rewards_G) for g in sample.groups]
    return grouped_request(sample, list(advantages), LOSS, ctx, clip=(ctx.options.clip_low, ctx.options.clip_high))
