"""GRPO without the standard deviation: the group-centred reward, nothing else.

Spec: 004 "GRPO without standard deviation" (grpo_nostd.py). Paper: GRPO, Shao et al. 2024,
arXiv:2402.03300, with the division by the group's std removed as Dr. GRPO (Liu et al. 2025,
arXiv:2503.20783) argues and the Tinker cookbook does by default.

    A_i = R_i - mean_group(R)        on every completion token; loss ``importance_sampling``
"""

from __future__ import annotations

from whileai.algorithms.core import (
    ForwardRequest,
    LossContext,
    Sample,
    SampleRequest,
    group_mean_advantages,
    grouped_request,
)

LOSS = "importance_sampling"



def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    advantages = [group_mean_advantages(g.rewards_G, normalize_std=False) for g in sample.groups]
    return grouped_request(sample, list(advantages), LOSS, ctx)
