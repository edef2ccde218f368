"""Dr. GRPO: no std in the advantage, and one constant length for every completion.

Spec: 004 "Dr.GRPO" (drgrpo.py). Paper: Liu et al. 2025, "Understanding R1-Zero-Like Training",
arXiv:2503.20783: dropping the 1/std and the per-sequence 1/T_i removes the bias toward long wrong
answers; the loss is normalized by one constant instead (the methods reference: w_i = 1/L_max).

    A_i = R_i - mean_group(R),   a_{i,t} = A_i / L_max     (default ``length="max_tokens"``)
    a_{i,t} = A_i / T_i                                      (``length="own"``: the spec file's choice)

L_max is the cycle's generation cap. The spec's file composes grpo_nostd and grpo_len_norm (each
completion divided by its own length); the paper's constant is the default and the spec's reading a
named option (docs/decisions.md, "Algorithms"). No KL term: none is added anywhere in this loop.
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
from whileai.knobs import Knob, one_of

LOSS = "importance_sampling"


@dataclass(frozen=True)
class DrGRPOOptions(Options):
    length: str = option(Knob("max_tokens", "the length each advantage is divided by: 'max_tokens' (one "
                              "constant, the cycle's cap L_max) or 'own' (the completion's own length)",
                              one_of("max_tokens", "own"), "Liu et al. 2025 (arXiv:2503.20783); 'own' is "
                              "the spec file drgrpo.py"))
    """'max_tokens': divide by the cap L_max (the paper); 'own': by each completion's length (the spec file)"""


def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    max_tokens = int(request.sampling_params["max_tokens"])
    advantages = []
    for group in sample.groups:
        group_adv = group_mean_advantages(group.rewards_G, normalize_std=False)
        lengths = [max_tokens if ctx.options.length == "max_tokens" else len(c.tokens) for c in group.completions]
        advantages.append([a / n for a, n in zip(group_adv, lengths)])
    return grouped_request(sample, advantages, LOSS, ctx)
