"""SDPO: self-distillation where the teacher is the base model shown feedback on the student's own attempt.

Spec: 004 "SDPO (Self-Distillation Policy Optimization)" (sdpo.py). Paper: Hübotter et al. 2026,
"Reinforcement Learning via Self-Distillation", arXiv:2601.20802. The mechanics are OPSD's (a frozen
second run of the same base model scores the student's tokens); the teacher's prompt carries the
attempt and the grader's feedback on it instead of a correct answer:

    teacher prompt = template.format(prompt=..., completion=<the attempt>, reward=<its reward>)
    a_{i,t} = kl_coef * (log pi_teacher(a_t | teacher prompt, a_<t) - log pi_student(a_t | prompt, a_<t))

Loss ``importance_sampling``. (Not the unrelated offline-preference "sDPO".)
"""

from __future__ import annotations

from dataclasses import dataclass

from whileai.algorithms.core import ForwardRequest, LossContext, Sample, SampleRequest, option
from whileai.algorithms.opd import DistillOptions, distill_request
from whileai.algorithms.opsd import text_prompt
from whileai.knobs import Knob, anything

TEMPLATE = "{prompt}{completion} scored {reward:.2f}\n{prompt}"


@dataclass(frozen=True)
class SDPOOptions(DistillOptions):
    template: str = option(Knob(TEMPLATE, "the teacher's prompt, with {prompt}, {completion} and {reward}",
                                anything("a str.format template with {prompt}, {completion} and {reward}"),
                                "ours: the grader's reward is the feedback our tasksets give"))
    """the teacher's prompt; {completion} is the attempt, {reward} the grader's feedback on it"""


def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    prompts = [[ctx.render(ctx.options.template.format(prompt=text_prompt(g.task, "SDPO"), completion=c.text,
                                                       reward=c.reward)) for c in g.completions]
               for g in sample.groups]
    return distill_request(sample, ctx, prompts)
