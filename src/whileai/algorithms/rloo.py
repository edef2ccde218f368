"""RLOO: REINFORCE with the leave-one-out mean of the other completions as the baseline.

Spec: 004 "RLOO" (rloo.py). Paper: Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740 (Eq. 4;
Kool et al. 2019). Group-mean GRPO is not a substitute: the baseline excludes the completion itself.

    A_i = R_i - (1 / (k - 1)) * sum_{j != i} R_j;   loss ``importance_sampling``

As the spec's file, no reference-KL term (REINFORCE++ shows that pattern with a frozen second run).
"""

from __future__ import annotations

from whileai.algorithms.core import (
    ForwardRequest,
    LossContext,
    Sample,
    SampleRequest,
    grouped_request,
    leave_one_out_baseline,
)

LOSS = "importance_sampling"



def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    advantages = [leave_one_out_baseline(g.rewards_G) for g in sample.groups]
    return grouped_request(sample, list(advantages), LOSS, ctx)
