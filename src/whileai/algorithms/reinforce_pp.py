"""REINFORCE++: REINFORCE with a per-token K2 penalty to a frozen reference, normalized over the batch.

Spec: 004 "REINFORCE++" (reinforce_pp.py). Paper: Hu 2025, arXiv:2501.03262 (REINFORCE++); the K2
estimator is Schulman 2020's k2 = 1/2 (log pi - log pi_ref)^2. The reference is a frozen second run
(``teacher_loop``) that scores the student's own tokens each cycle.

Default ``kl_in="return"`` (the paper, as OpenRLHF's ``reinforce`` estimator): the penalty is a
per-token reward, the return is summed to the end (gamma = 1), and the advantages are normalized over
every completion token of the batch:

    G_{i,t} = R_i - beta * sum_{s >= t} k2_{i,s},     a_{i,t} = (G_{i,t} - mean(G)) / std(G)

``kl_in="token"`` (the spec file's reading): the group advantage minus the token's own penalty,

    a_{i,t} = (R_i - mean_group(R)) - beta * k2_{i,t}

Loss ``importance_sampling``.
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
    group_mean_advantages,
    grouped_request,
    option,
)
from whileai.errors import ConfigError
from whileai.knobs import Knob, number, one_of

LOSS = "importance_sampling"


@dataclass(frozen=True)
class ReinforcePPOptions(Options):
    kl_coef: float = option(Knob(0.01, "beta: weight of the K2 penalty to the reference", number(0.0),
                                 "OpenRLHF --algo.kl.init_coef default 0.01 (reference/peers.md)"))
    """beta, the weight of the per-token K2 penalty"""
    kl_in: str = option(Knob("return", "'return': penalty summed into the return-to-go, batch-normalized "
                             "(the paper); 'token': group advantage minus the token's penalty (the spec file)",
                             one_of("return", "token"), "arXiv:2501.03262; 'token' is the spec file"))
    """where the penalty enters: 'return' (the paper) or 'token' (the spec file)"""


def k2(student_T: np.ndarray, reference_T: np.ndarray) -> np.ndarray:
    """Schulman's k2 estimator of KL(student || reference) at each sampled token."""
    return 0.5 * (student_T - reference_T) ** 2


def return_advantages(rewards: list[np.ndarray], penalties: list[list[np.ndarray]], kl_coef: float) -> list[list]:
    """``G_t = R - beta * sum_{s >= t} k2_s``, then z-scored over every token of the batch."""
    returns = [[r - kl_coef * np.cumsum(p[::-1])[::-1] for r, p in zip(group_r, group_p)]
               for group_r, group_p in zip(rewards, penalties)]
    flat = np.concatenate([g for group in returns for g in group])
    mean, std = flat.mean(), flat.std()
    return [[(g - mean) / (std + 1e-8) for g in group] for group in returns]


def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    if ctx.teacher is None:
        raise ConfigError("REINFORCE++ needs a frozen reference run: run it with teacher_loop (wai loop does)")
    completions = [c for g in sample.groups for c in g.completions]
    prompts = [g.prompt_tokens for g in sample.groups for _ in g.completions]
    reference = iter(ctx.teacher.logprobs(prompts, [c.tokens for c in completions]))
    penalties = [[k2(np.asarray(c.logprobs), np.asarray(next(reference))) for c in g.completions]
                 for g in sample.groups]
    beta = ctx.options.kl_coef
    if ctx.options.kl_in == "return":
        advantages = return_advantages([g.rewards_G for g in sample.groups], penalties, beta)
    else:
        advantages = [[a - beta * p for a, p in zip(group_mean_advantages(g.rewards_G), group_p)]
                      for g, group_p in zip(sample.groups, penalties)]
    out = grouped_request(sample, advantages, LOSS, ctx)
    out.metrics["k2"] = float(np.mean(np.concatenate([p for group in penalties for p in group])))
    return out
