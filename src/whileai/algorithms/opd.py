"""On-policy distillation: the student samples, a frozen teacher scores its tokens, the gap is the advantage.

Spec: 004 "On-policy distillation (OPD)" (opd.py). Papers: Agarwal et al. 2023, arXiv:2306.13649; the
Tinker cookbook's ``train_on_policy.py`` (reverse KL as a per-token advantage). The teacher is a second,
frozen run (``teacher_loop``; any model) that only answers log-probabilities of the student's tokens.

    a_{i,t} = kl_coef * (log pi_teacher(a_t | h_t) - log pi_student(a_t | h_t));   loss ``importance_sampling``

No reward enters: a token the teacher liked more than the student did is pushed up by the gap. The
metric ``teacher_kl`` is the mean of ``log pi_student - log pi_teacher`` (the sampled reverse KL).
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
from whileai.errors import ConfigError
from whileai.knobs import Knob, number

LOSS = "importance_sampling"


@dataclass(frozen=True)
class DistillOptions(Options):
    kl_coef: float = option(Knob(1.0, "scale of the teacher-student gap in the advantage", number(0.0, open_low=True),
                                 "Tinker cookbook distillation kl_penalty_coef default 1.0"))
    """scale of the log-probability gap (the reverse-KL weight)"""


def distill_request(sample: Sample, ctx: LossContext, teacher_prompts: list[list[list[int]]]) -> ForwardRequest:
    """The shared tail of OPD / OPSD / SDPO: teacher scores on the student's tokens after
    ``teacher_prompts[g][i]``, the gap as per-token advantages."""
    if ctx.teacher is None:
        raise ConfigError("this algorithm needs a frozen teacher run: run it with teacher_loop (wai loop does)")
    completions = [c for g in sample.groups for c in g.completions]
    prompts = [p for group_prompts in teacher_prompts for p in group_prompts]
    teacher = iter(ctx.teacher.logprobs(prompts, [c.tokens for c in completions]))
    gaps = [[np.asarray(next(teacher)) - np.asarray(c.logprobs) for c in g.completions] for g in sample.groups]
    out = grouped_request(sample, [[ctx.options.kl_coef * gap for gap in group] for group in gaps], LOSS, ctx)
    out.metrics["teacher_kl"] = -float(np.mean(np.concatenate([gap for group in gaps for gap in group])))
    return out


def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    return distill_request(sample, ctx, [[g.prompt_tokens] * len(g.completions) for g in sample.groups])
