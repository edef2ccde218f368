"""DPPO: a binary trust-region mask on probability moved, in place of PPO's ratio clip.

Spec: 004 "DPPO" (dppo.py). Paper: arXiv:2602.04879 (the binary TV / KL variants, as SkyRL implements
them). No critic: the provider masks tokens whose probability left the region, from the same tensors.

    A_i = R_i - mean_group(R);   loss ``dppo``: -r * A * m,  m = 0 where the token left the region

Only the thresholds are set here (``delta_low`` / ``delta_high``); unset, the provider's defaults apply
(ours: 0.2 / 0.2, TV). The divergence variant is a provider setting on the spec's Modal and a config
key here (``dppo_type``), left at the provider's default unless ``divergence`` is given.
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
from whileai.knobs import Knob, number, one_of, optional

LOSS = "dppo"
SOURCE = "the provider's default (ours: SkyRL's 0.2)"


@dataclass(frozen=True)
class DPPOOptions(Options):
    delta_low: float | None = option(Knob(None, "divergence bound for negative advantages; None: the provider's",
                                          optional(number(0.0), "the provider's default"), SOURCE))
    """divergence bound for tokens with A < 0; None: the provider's default"""
    delta_high: float | None = option(Knob(None, "divergence bound for positive advantages; None: the provider's",
                                           optional(number(0.0), "the provider's default"), SOURCE))
    """divergence bound for tokens with A > 0; None: the provider's default"""
    divergence: str | None = option(Knob(None, "'binary_tv' or 'binary_kl'; None: the provider's",
                                         optional(one_of("binary_tv", "binary_kl"), "the provider's default"),
                                         "arXiv:2602.04879"))
    """the mask's divergence ('binary_tv' / 'binary_kl', sent as ``dppo_type``); None: the provider's"""


def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    advantages = [group_mean_advantages(g.rewards_G) for g in sample.groups]
    o = ctx.options
    config = {"delta_low": o.delta_low, "delta_high": o.delta_high, "dppo_type": o.divergence}
    return grouped_request(sample, list(advantages), LOSS, ctx, config=config)
