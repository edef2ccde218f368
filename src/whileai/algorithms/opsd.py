"""On-policy self-distillation (SDFT): the teacher is the base model shown the task's answer.

Spec: 004 "On-policy self-distillation (OPSD)" (opsd.py). Paper: Shenfeld et al. 2026, "Self-Distillation
Enables Continual Learning", arXiv:2601.19897, in the Tinker cookbook's per-token form (``topk=0``). The
teacher is a frozen second run of the same base model (SDFT's default, no sync); its prompt is the
task's question with a correct answer as a demonstration, written and tokenized caller-side:

    teacher prompt = template.format(prompt=task.prompt, answer=task.answer)
    a_{i,t} = kl_coef * (log pi_teacher(a_t | teacher prompt, a_<t) - log pi_student(a_t | prompt, a_<t))

A task without an answer, or with chat-message prompts, is refused (no placeholder teacher prompt).
Loss ``importance_sampling``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from whileai.algorithms.core import ForwardRequest, LossContext, Sample, SampleRequest, option
from whileai.algorithms.opd import DistillOptions, distill_request
from whileai.errors import ConfigError
from whileai.knobs import Knob, anything

TEMPLATE = "{answer}\n{prompt}"


@dataclass(frozen=True)
class OPSDOptions(DistillOptions):
    template: str = option(Knob(TEMPLATE, "the teacher's prompt, with {prompt} and {answer}",
                                anything("a str.format template with {prompt} and {answer}"),
                                "ours: short for the built-in byte-level tasks (SDFT's DEFAULT_DEMO_TEMPLATE is a "
                                "longer chat demonstration)"))
    """the teacher's prompt; {prompt} is the task's prompt, {answer} its answer"""


def text_prompt(task: Any, what: str) -> str:
    if not isinstance(task.prompt, str):
        raise ConfigError(f"task_id={task.task_id!r}: {what} builds the teacher's prompt from text, and this prompt "
                          "is a list of chat messages; use a plain-text taskset")
    return task.prompt


def build_loss(sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext) -> ForwardRequest:
    prompts = []
    for group in sample.groups:
        if group.task.answer is None:
            raise ConfigError(f"task_id={group.task.task_id!r} has no answer, and OPSD's teacher is shown one: use a "
                              "taskset with answers (the built-ins have them)")
        text = ctx.options.template.format(prompt=text_prompt(group.task, "OPSD"), answer=group.task.answer)
        prompts.append([ctx.render(text)] * len(group.completions))
    return distill_request(sample, ctx, prompts)
