"""CISPO: the clipped importance weight held constant, times log p and the advantage.

Spec: 004 "CISPO" (cispo.py). Paper: MiniMax-M1, arXiv:2506.13585 (Eq. 4-5): the ratio is clipped and
stop-gradiented, so every token keeps a gradient (PPO's clip drops the clipped ones).

    A_i = R_i - mean_group(R);   loss ``cispo``: -sg(clip(r, lo, hi)) * log p * A

Only the loss name differs from GRPO's datums; never a fallback to ``importance_sampling``. Thresholds
go where the provider advertises them; unset, its defaults apply (ours: one-sided 0.0 / 4.0).
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
from whileai.algorithms.ppo import clip_knob

LOSS = "cispo"
PROVIDER_DEFAULT = "the provider's default (ours: 0.0 / 4.0, Tinker tutorial 202)"


@dataclass(frozen=True)
class CISPOOptions(Options):
    clip_low: float | None = option(clip_knob("lower", PROVIDER_DEFAULT))
    """absolute lower bound of the held-constant ratio; None: the provider's default"""
    clip_high: float | None = option(clip_knob("upper", PROVIDER_DEFAULT))
    """absolute upper bound of the held-constant ratio; None: the provider's default"""


def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    advantages = [group_mean_advantages(g.rewards_G) for g in sample.groups]
    return grouped_request(sample, list(advantages), LOSS, ctx, clip=(ctx.options.clip_low, ctx.options.clip_high))
