"""Every method of the methods library as an algorithm: ``cross_entropy`` with ``weights = c``.

``method:NAME`` runs ``wai.method(NAME)`` through the loop issue's step, ``whileai.loop.step.policy_step``,
with the trainer the loop holds (a ``TrainingEngine`` or a service ``RunClient``) in the engine's place:
score -> ``method.update`` -> ``forward_backward("cross_entropy", weights = c)`` -> ``optim_step``. The
method's run spec says how many rollouts per prompt, the temperature, which row fields to fill (a
teacher's log-probabilities come from the frozen teacher run), its critic and its adaptive resampling.
Methods that train on pushed rows (SFT, DPO, RM) have no place in a sampling loop and are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from whileai.algorithms.core import Completion, Group, LossContext, Sample, SampleRequest
from whileai.algorithms.registry import CycleResult, LoopNeeds
from whileai.errors import ConfigError

PREFIX = "method:"
# The teacher weights a frozen second run can stand for: a separate model, or the student's starting weights.
SECOND_RUN = {"model": "teacher", "initial": "reference"}
LOSS = "cross_entropy"


def library_names() -> list[str]:
    """``method:NAME`` for every library method that learns from sampled rollouts."""
    import whileai as wai

    names = []
    for name in wai.method_names():
        try:
            source = wai.method(name).run_spec().source
        except ConfigError:  # a wrapper that needs an option (e.g. async's inner method) still samples rollouts
            source = "rollouts"
        if source == "rollouts":
            names.append(PREFIX + name)
    return names


def row(group: Group, completion: Completion) -> dict[str, Any]:
    """A completion as the library's row (plus the step's bookkeeping ``prompt_tokens``, ``completion``)."""
    return {"task_id": group.task.task_id, "reward": completion.reward, "prompt_tokens": list(group.prompt_tokens),
            "tokens": list(completion.tokens), "behavior_logprobs": list(completion.logprobs),
            "truncated": completion.truncated, "completion": completion.text}


@dataclass(frozen=True)
class LibraryAlgorithm:
    """A library method in the loop: its options are the method object (``wai.method(NAME, **options)``)."""

    name: str
    method_name: str
    loss: str = LOSS

    def loop_needs(self, options: Any) -> LoopNeeds:
        """The method's run spec: rollouts per prompt, temperature, cap, and the frozen run its teacher is."""
        spec = options.run_spec()
        second = None if spec.teacher is None else SECOND_RUN[spec.teacher.weights]
        return LoopNeeds(spec.rollouts_per_prompt, spec.temperature, spec.max_tokens, second, spec.learning_rate)

    @property
    def summary(self) -> str:
        import whileai as wai

        try:
            doc = type(wai.method(self.method_name)).__doc__ or ""
        except ConfigError:
            return f"the methods library's {self.method_name} (needs options: `wai methods {self.method_name}`)"
        return f"the methods library's {self.method_name}: " + (doc.strip().splitlines() or [""])[0]

    def make_options(self, given: Mapping[str, Any] | None = None) -> Any:
        import whileai as wai

        method = wai.method(self.method_name, **dict(given or {}))
        spec = method.run_spec()
        if spec.source != "rollouts":
            raise ConfigError(f"method {self.method_name!r} trains on rows as pushed ({spec.source}), not "
                              "on sampled rollouts: run it with `wai train --rows FILE` instead of a loop")
        if spec.teacher is not None and spec.teacher.weights not in SECOND_RUN:
            raise ConfigError(f"method {self.method_name!r}'s teacher follows the student's weights "
                              f"({spec.teacher.weights!r}), which a frozen second run cannot: pick a frozen teacher "
                              "(for OPSD: anchor=initial, `--set anchor=initial`), or run it with `wai train`")
        return method

    def prepare(self, trainer: Any, options: Any, learning_rate: float) -> None:
        """Attach the value head a critic method needs (a trainer without ``add_critic`` cannot run one)."""
        critic = options.run_spec().critic
        if critic is None:
            return
        if not callable(getattr(trainer, "add_critic", None)):
            raise ConfigError(f"method {self.method_name!r} trains a critic and this trainer "
                              f"({type(trainer).__name__}) cannot attach one; run it in-process (no --url)")
        trainer.add_critic(critic.learning_rate, reward_range=critic.reward_range)

    def run_cycle(self, sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext,
                  adam: Mapping[str, Any], state: Any = None) -> CycleResult:
        from whileai.loop.step import policy_step

        method = ctx.options
        spec = method.run_spec()
        rows = [row(g, c) for g in sample.groups for c in g.completions]
        rows += _planned(spec, sample, request, ctx, rows)
        if state is None and spec.stateful:
            state = method.initial_state()
        warmup = spec.critic.warmup if spec.critic is not None else 0
        scoring = {"max_tokens": request.sampling_params["max_tokens"],
                   "temperature": request.sampling_params["temperature"]}
        result = policy_step(ctx.client, method, rows, adam=dict(adam), state=state, sampling_params=scoring,
                             rescore=False, train_policy=cycle >= warmup,
                             critic_steps=spec.critic.steps if spec.critic is not None else 0,
                             teacher=_teacher(spec, ctx))
        metrics = {k: v for k, v in result.metrics.items() if k not in ("reward", "pass_rate")}
        return CycleResult(metrics, list(result.update.notes), result.state)


def _planned(spec: Any, sample: Sample, request: SampleRequest, ctx: LossContext,
             rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """More rows while the method's adaptive plan asks for them (ReinforceAda), from the same weights."""
    if spec.plan is None:
        return []
    groups = {g.task.task_id: g for g in sample.groups}
    extra: list[dict[str, Any]] = []
    for round_number in range(1, 1000):
        plan = spec.plan(rows + extra, list(groups))
        if not plan.resample:
            break
        for task_id, n in plan.resample.items():
            group = groups[task_id]
            extra += [row(group, c) for c in ctx.sample_more(group, int(n), request, round_number)]
    return extra


def _teacher(spec: Any, ctx: LossContext) -> Any:
    """The loop's ``RunTeacher`` (its privileged prompts, its fields) scoring through the frozen second run."""
    if spec.teacher is None:
        return None
    if ctx.teacher is None:
        raise ConfigError("this method needs a teacher's log-probabilities: run it with teacher_loop (wai loop does)")
    from whileai.loop.teacher import RunTeacher

    return RunTeacher(spec.teacher, RunScorer(ctx.teacher.run), ctx.tokenizer, ctx.taskset.split("train"))


@dataclass
class RunScorer:
    """A teacher scorer (``whileai.engine.teacher.Teacher``'s ``score``) made of one frozen run's public
    ``compute_logprobs``: the same over HTTP as in-process. Scores at temperature 1, untruncated."""

    run: Any
    ema: Any = None

    def score(self, sequences: Any, distribution: Any, top_k: int = 0) -> list[Any]:
        from whileai.engine.teacher import TeacherScores

        if (distribution.temperature, distribution.top_k, distribution.top_p) != (1.0, 0, 1.0):
            raise ConfigError(f"the frozen teacher run scores the model's own distribution, and the student sampled "
                              f"with {distribution.describe()}: sample at temperature 1 without top-k / top-p")
        out = []
        for context, tokens in sequences:
            answer = self.run.compute_logprobs(list(context) + list(tokens), top_k=top_k)
            n = len(tokens)
            score = TeacherScores(np.asarray(answer["logprobs"][-n:], dtype=np.float64))
            if top_k:
                slots = answer["topk"][-n:]  # entry j: the distribution token j was drawn from
                score.topk_tokens = np.asarray([[int(t) for t, _ in row] for row in slots], dtype=np.int64)
                score.topk_logprobs = np.asarray([[float(v) for _, v in row] for row in slots], dtype=np.float64)
            out.append(score)
        return out

    def after_step(self, params: Any) -> None:
        """A frozen run never follows the student."""


def library_algorithm(method_name: str) -> LibraryAlgorithm:
    """``method:NAME`` as an algorithm; an unknown name lists the valid ones."""
    names = library_names()
    if PREFIX + method_name not in names:
        raise ConfigError(f"{PREFIX}{method_name} is not a library method that samples rollouts; use one of "
                          f"{', '.join(names)}")
    return LibraryAlgorithm(PREFIX + method_name, method_name)
