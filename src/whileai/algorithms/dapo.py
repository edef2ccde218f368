"""DAPO: clip-higher, dynamic sampling, token-level normalization, and overlong filtering with resampling.

Spec: 004 "DAPO" (dapo.py). Paper: Yu et al. 2025, arXiv:2503.14476 (Eq. 8-9). Per group, in one cycle:

1. overlong filtering: drop completions the cap truncated (``Completion.truncated``: stopped by the cap
   when the cap is not the taskset's answer length);
2. resampling: while fewer than ``min_retained`` remain, draw ``request.num_samples`` more from the same
   weights version through ``ctx.client`` (real, ordered ``sample`` operations), at most ``max_rounds``
   times; a group still short is dropped, and the note says so;
3. dynamic sampling: a group whose retained rewards are all equal carries no signal and is dropped;
4. advantages on the retained group, ``(R - mean) / std``, divided by the batch's total retained tokens
   (token-level normalization, Eq. 8);
5. loss ``ppo`` with the clip-higher bounds 1 - 0.2 / 1 + 0.28. No provider exposes the paper's dual
   clip, so this is PPO's clip with asymmetric bounds, placed as the provider advertises.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from whileai.algorithms.core import (
    ForwardRequest,
    Group,
    LossContext,
    Options,
    Sample,
    SampleRequest,
    group_mean_advantages,
    grouped_request,
    option,
)
from whileai.knobs import Knob, integer, number, one_of

LOSS = "ppo"
PAPER = "Yu et al. 2025 (arXiv:2503.14476)"


@dataclass(frozen=True)
class DAPOOptions(Options):
    clip_low: float = option(Knob(0.8, "absolute lower ratio bound (1 - eps_low, eps_low = 0.2)", number(0.0), PAPER))
    """absolute lower ratio bound: 1 - eps_low"""
    clip_high: float = option(Knob(1.28, "absolute upper ratio bound (1 + eps_high, eps_high = 0.28)", number(0.0),
                                   PAPER))
    """absolute upper ratio bound: 1 + eps_high (clip-higher)"""
    min_retained: int = option(Knob(2, "fewest completions a group keeps after overlong filtering", integer(1),
                                    "spec 004 DAPO (MIN_GROUP_SIZE); 2 is the least a baseline needs"))
    """fewest non-truncated completions a group must keep; fewer triggers resampling"""
    max_rounds: int = option(Knob(4, "resampling rounds per group before it is dropped", integer(0),
                                  "ours: bounds the extra sampling per cycle"))
    """resampling rounds per group, at most; a group still short is dropped"""
    dynamic_sampling: bool = option(Knob(True, "drop groups whose retained rewards are all equal", one_of(True, False),
                                         PAPER))
    """drop groups whose rewards are all equal (they carry no signal but count in the token normalizer)"""


def retain(group: Group, request: SampleRequest, ctx: LossContext) -> tuple[Group, int]:
    """The group without truncated completions, topped up by resampling; and the rounds it took."""
    kept = [c for c in group.completions if not c.truncated]
    rounds = 0
    while len(kept) < ctx.options.min_retained and rounds < ctx.options.max_rounds:
        rounds += 1
        more = ctx.sample_more(group, request.num_samples, request, rounds)
        kept += [c for c in more if not c.truncated]
    return replace(group, completions=kept[:max(request.num_samples, ctx.options.min_retained)]), rounds


def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    groups, rounds, short, uniform = [], 0, 0, 0
    for group in sample.groups:
        kept, used = retain(group, request, ctx)
        rounds += used
        if len(kept.completions) < ctx.options.min_retained:
            short += 1
        elif ctx.options.dynamic_sampling and np.ptp(kept.rewards_G) == 0:
            uniform += 1
        else:
            groups.append(kept)
    retained = replace(sample, groups=groups)
    tokens = sum(len(c.tokens) for g in groups for c in g.completions)
    advantages = [group_mean_advantages(g.rewards_G, normalize_std=True) / max(tokens, 1) for g in groups]
    out = grouped_request(retained, list(advantages), LOSS, ctx, clip=(ctx.options.clip_low, ctx.options.clip_high))
    out.metrics.update({"resample_rounds": float(rounds), "groups_short": float(short),
                        "groups_uniform": float(uniform), "groups_kept": float(len(groups))})
    if short:
        out.notes.append(f"{short} group(s) kept fewer than min_retained={ctx.options.min_retained} untruncated "
                         f"completions after {ctx.options.max_rounds} resampling rounds and were dropped: raise "
                         "max_tokens or max_rounds")
    if uniform:
        out.notes.append(f"{uniform} group(s) had equal rewards and were dropped (dynamic sampling)")
    return out
