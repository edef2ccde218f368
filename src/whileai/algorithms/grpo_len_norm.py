"""Length-normalized GRPO: GRPO's std-normalized group advantage, divided by the completion's own length.

Spec: 004 "Length-normalized GRPO" (grpo_len_norm.py). Paper: GRPO, Shao et al. 2024, arXiv:2402.03300
(Eq. 3: each sequence's token losses averaged, w_i = 1/T_i; the methods reference's ``loss_type="grpo"``).
The kernel sums, so the 1/T_i lives in the advantage:

    A_i = (R_i - mean_group(R)) / std_group(R),   a_{i,t} = A_i / T_i;   loss ``importance_sampling``
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
    advantages = []
    for group in sample.groups:
        group_adv = group_mean_advantages(group.rewards_G, normalize_std=True)
        advantages.append([a / len(c.tokens) for a, c in zip(group_adv, group.completions)])
    return grouped_request(sample, advantages, LOSS, ctx)
