"""GSPO: PPO's clip on the sequence-level importance ratio (the token form).

Spec: 004 "GSPO" (gspo.py). Paper: Zheng et al. 2025, arXiv:2507.18071 (Eq. 5-7, GSPO-token). The
provider computes ``s_i = exp(mean_t(log p - log q))`` from the same datums as PPO; nothing extra is
built caller-side.

    A_i = R_i - mean_group(R);   loss ``gspo``: -min(s_t A, clip(s_t, lo, hi) A)

The paper's bounds are tiny (3e-4 / 4e-4 as epsilons); unset, the provider's default applies (ours:
SkyRL's 0.8 / 1.2). A provider that does not advertise ``gspo`` (Tinker Cloud) fails closed.
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

LOSS = "gspo"
PROVIDER_DEFAULT = "the provider's default (ours: SkyRL's 0.8 / 1.2; the paper: 1 - 3e-4 / 1 + 4e-4)"


@dataclass(frozen=True)
class GSPOOptions(Options):
    clip_low: float | None = option(clip_knob("lower", PROVIDER_DEFAULT))
    """absolute lower bound of the sequence ratio; None: the provider's default"""
    clip_high: float | None = option(clip_knob("upper", PROVIDER_DEFAULT))
    """absolute upper bound of the sequence ratio; None: the provider's default"""


def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    advantages = [group_mean_advantages(g.rewards_G) for g in sample.groups]
    return grouped_request(sample, list(advantages), LOSS, ctx, clip=(ctx.options.clip_low, ctx.options.clip_high))
