"""MaxRL: the group-centred reward divided by the group's mean reward.

Spec: 004 "MaxRL" (maxrl.py). Paper: arXiv:2602.02710, the estimator of the methods reference (prime-rl's
``max_rl``): dividing by the group mean (the pass rate p for 0/1 rewards) makes the gradient the
maximum-likelihood one and weights a rarely solved prompt by about 1/p.

    A_i = (R_i - mean_group(R)) / mean_group(R)       (default ``estimator="mean"``; 0 when the mean <= 0)
    A_i = R_i - max_{j != i} R_j                       (``estimator="beat_the_best"``: the spec file's choice)

The spec's file calls its leave-one-out "beat the group's best" one reasonable choice, not a formula;
the paper's is the default (docs/decisions.md, "Algorithms"). Loss ``importance_sampling``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from whileai.algorithms.core import (
    ForwardRequest,
    LossContext,
    Options,
    Sample,
    SampleRequest,
    grouped_request,
    option,
)
from whileai.knobs import Knob, one_of

LOSS = "importance_sampling"


@dataclass(frozen=True)
class MaxRLOptions(Options):
    estimator: str = option(Knob("mean", "'mean': (R - mean) / mean (the paper); 'beat_the_best': R_i minus the "
                                 "best other reward in the group (the spec file)", one_of("mean", "beat_the_best"),
                                 "arXiv:2602.02710; 'beat_the_best' is the spec file maxrl.py"))
    """'mean' (the paper's estimator) or 'beat_the_best' (the spec file's leave-one-out max)"""


def mean_relative_advantage(rewards_G: np.ndarray) -> np.ndarray:
    """``(R - mean) / mean``; a group whose mean is <= 0 carries nothing (the division is undefined)."""
    mean = rewards_G.mean()
    return (rewards_G - mean) / mean if mean > 0 else np.zeros_like(rewards_G)


def beat_the_best_advantage(rewards_G: np.ndarray) -> np.ndarray:
    """``R_i - max_{j != i} R_j`` (0 for a group of one)."""
    if rewards_G.size < 2:
        return np.zeros_like(rewards_G)
    return np.asarray([r - np.delete(rewards_G, i).max() for i, r in enumerate(rewards_G)])


def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    estimate = mean_relative_advantage if ctx.options.estimator == "mean" else beat_the_best_advantage
    advantages = [estimate(g.rewards_G) for g in sample.groups]
    out = grouped_request(sample, list(advantages), LOSS, ctx)
    skipped = sum(1 for g in sample.groups if g.rewards_G.mean() <= 0 and np.ptp(g.rewards_G) > 0)
    if ctx.options.estimator == "mean" and skipped:
        out.notes.append(f"{skipped} group(s) had mixed rewards but a mean <= 0 and carry nothing: MaxRL divides "
                         "by the mean, so rewards must be >= 0 (a pass rate)")
    return out
