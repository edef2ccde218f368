"""SAPO: a soft, temperature-controlled gate on the ratio instead of a hard clip.

Spec: 004 "SAPO" (sapo.py). Paper: arXiv:2511.20347. The spec's providers cannot take ``sapo`` (SkyRL's
Tinker API rejects the name), so its file is a stub; our engine has the loss, so it runs here, and a
provider that does not advertise it fails closed (no substitute clipping loss).

    A_i = R_i - mean_group(R);   loss ``sapo``: -sigmoid(tau (r - 1)) * 4/tau * A,
    tau = tau_pos where A > 0, tau_neg otherwise
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

LOSS = "sapo"
SOURCE = "the provider's default (ours: SkyRL's 1.0 / 1.05)"


def _tau(sign: str) -> Knob:
    return Knob(None, f"gate temperature for A {sign} 0; None: the provider's default",
                optional(number(0.0, open_low=True), "the provider's default"), SOURCE)


@dataclass(frozen=True)
class SAPOOptions(Options):
    tau_pos: float | None = option(_tau(">"))
    """gate temperature for positive advantages; None: the provider's default"""
    tau_neg: float | None = option(_tau("<="))
    """gate temperature for the others; None: the provider's default"""


def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    advantages = [group_mean_advantages(g.rewards_G) for g in sample.groups]
    config = {"tau_pos": ctx.options.tau_pos, "tau_neg": ctx.options.tau_neg}
    return grouped_request(sample, list(advantages), LOSS, ctx, config=config)
