"""``rl_loop`` and ``teacher_loop``: any algorithm end to end, against an engine or the service.

    per cycle: save_weights_for_sampler -> sample -> grade -> [teacher logprobs] -> build_loss
               -> forward_backward -> optim_step

The trainer is a ``TrainingEngine`` (in-process) or a service ``RunClient`` (over HTTP); both have the
same operations, so this file never asks which. ``teacher_loop`` adds a second, frozen run that only
answers log-probabilities of the student's tokens (OPD's teacher, OPSD / SDPO's self-teacher, REINFORCE++'s
reference); nothing ever calls ``optim_step`` on it. Spec: 004 "Shared Whitney loop".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from whileai.algorithms.core import Group, LossContext, Sample, SampleRequest, Teacher, grade
from whileai.algorithms.registry import algorithm as algorithm_named
from whileai.algorithms.registry import reward_metrics
from whileai.errors import ConfigError

DEFAULT_MAX_TOKENS = 256
"""the cap when neither the caller, the taskset nor the method sets one (as ``wai train``)"""


# ----------------------------------------------------------------------------- where runs live
class LocalProvider:
    """Runs are in-process ``TrainingEngine``s; every loss of the engine's table is advertised."""

    where = "in-process engine"

    def capabilities(self) -> dict[str, Any]:
        from whileai.engine import capabilities

        return {"provider": "local", "losses": capabilities()}

    def create_run(self, model: str, *, seed: int, lora_rank: int) -> Any:
        from whileai.engine import TrainingEngine

        return TrainingEngine(model, seed=seed, lora_rank=lora_rank)

    def close(self) -> None:
        """Nothing to free: the engines go when their last reference does."""


class ServiceProvider:
    """Runs live in a ``wai serve`` process: one session, one run per model."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.session: Any = None
        self.where = f"service at {getattr(client, 'url', '?')}"

    def capabilities(self) -> dict[str, Any]:
        return dict(self.client.capabilities())

    def create_run(self, model: str, *, seed: int, lora_rank: int) -> Any:
        if self.session is None:
            self.session = self.client.create_session()
        return self.session.create_run(model, lora_rank=lora_rank, seed=seed)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


def provider_for(target: Any) -> tuple[Any, Any]:
    """``(provider, student)`` for a target: None (a fresh in-process engine), a service ``Client``, or a
    trainer you built (a ``TrainingEngine``; the student is then that trainer)."""
    if target is None:
        return LocalProvider(), None
    if callable(getattr(target, "create_session", None)):
        return ServiceProvider(target), None
    from whileai.engine import TrainingEngine

    if isinstance(target, TrainingEngine):
        return LocalProvider(), target
    raise ConfigError(f"rl_loop: target={type(target).__name__} is not a TrainingEngine, a whileai.service.Client "
                      "or None; pass the service Client (not one of its runs) so the loop can read its capabilities")


# ----------------------------------------------------------------------------- the result
@dataclass
class LoopResult:
    """The cycles' metrics, the runs, and where they ran."""

    history: list[dict[str, Any]]
    student: Any
    teacher: Any
    where: str
    provider: Any = field(repr=False, default=None)

    def close(self) -> None:
        """Free the service session the loop opened (no-op in-process)."""
        if self.provider is not None:
            self.provider.close()


@dataclass(frozen=True)
class LoopSettings:
    """How the loop samples and steps; each field has a default that suits builtin:tiny on a CPU."""

    cycles: int = 3
    """optimizer steps, one fresh batch of samples each"""
    tasks_per_cycle: int = 4
    """prompts per cycle, drawn from the taskset's train split"""
    rollouts_per_prompt: int | None = None
    """completions per prompt (None: the algorithm's)"""
    max_tokens: int | None = None
    """generation cap (None: the taskset's, else the method's, else DEFAULT_MAX_TOKENS)"""
    learning_rate: float | None = None
    """AdamW step (None: the method's declared rate, else ``wai train``'s rule without a taskset's
    recommendation: 1e-2 on a random-init built-in model, 2e-4 for LoRA, 1e-5 otherwise)"""
    seed: int = 0
    """seeds the model, the task draw and the sampler"""

    def __post_init__(self) -> None:
        bad = [f"{k}={getattr(self, k)!r} must be an integer >= 1" for k in ("cycles", "tasks_per_cycle")
               if not isinstance(getattr(self, k), int) or getattr(self, k) < 1]
        bad += [f"{k}={getattr(self, k)!r} must be an integer >= 1 or None" for k in ("rollouts_per_prompt", "max_tokens")
                if getattr(self, k) is not None and (not isinstance(getattr(self, k), int) or getattr(self, k) < 1)]
        if self.learning_rate is not None and not self.learning_rate > 0:
            bad.append(f"learning_rate={self.learning_rate!r} must be > 0 or None")
        if bad:
            raise ConfigError("loop settings: " + "; ".join(bad))

    def rate(self, model: str, lora_rank: int, declared: float | None) -> float:
        """``learning_rate``, else ``wai train``'s rule (``whileai.loop.config.default_learning_rate``)."""
        from whileai.loop.config import default_learning_rate

        if self.learning_rate is not None:
            return self.learning_rate
        return default_learning_rate(model, lora_rank, declared)


# ----------------------------------------------------------------------------- the loops
def rl_loop(target: Any, algorithm: Any, taskset: Any, *, model: str = "builtin:tiny", lora_rank: int = 0,
            options: Mapping[str, Any] | None = None, teacher: Teacher | None = None,
            log: Callable[[str], None] = print, **settings: Any) -> LoopResult:
    """Run ``algorithm`` (a name or an algorithm object) on ``taskset`` (a spec or a ``Taskset``) for
    ``settings.cycles`` cycles; ``target`` as in ``provider_for``. ``options`` are the algorithm's
    (``wai loop --list`` shows them); ``settings`` are ``LoopSettings`` fields. Returns a ``LoopResult``."""
    algo = algorithm_named(algorithm) if isinstance(algorithm, str) else algorithm
    loop = LoopSettings(**settings)
    opts = algo.make_options(options)
    provider, student = provider_for(target)
    preflight(provider.capabilities(), algo, opts, teacher is not None)
    student = student if student is not None else provider.create_run(model, seed=loop.seed, lora_rank=lora_rank)
    return _run(provider, student, algo, opts, _taskset(taskset), loop, (model, lora_rank),
                teacher, log)


def teacher_loop(target: Any, algorithm: Any, taskset: Any, *, model: str = "builtin:tiny", lora_rank: int = 0,
                 teacher_model: str | None = None, teacher_seed: int | None = None,
                 options: Mapping[str, Any] | None = None, log: Callable[[str], None] = print,
                 **settings: Any) -> LoopResult:
    """``rl_loop`` with a second, frozen run (``teacher_model``, default the student's base model, seeded
    ``teacher_seed``, default the student's seed: the same starting weights) that answers the teacher's or
    reference's log-probabilities of the student's tokens. It is created once and never trained."""
    algo = algorithm_named(algorithm) if isinstance(algorithm, str) else algorithm
    loop = LoopSettings(**settings)
    opts = algo.make_options(options)
    teacher_model = teacher_model or model
    teacher_seed = loop.seed if teacher_seed is None else teacher_seed
    if algo.loop_needs(opts).second_run == "teacher" and (teacher_model, teacher_seed) == (model, loop.seed):
        raise ConfigError(f"{algo.name} distils from a teacher, and the teacher given is the student's own starting "
                          "weights (nothing to learn): pass teacher_model= (--teacher-model), or teacher_seed= "
                          "(--teacher-seed) for a differently initialised built-in")
    provider, student = provider_for(target)
    preflight(provider.capabilities(), algo, opts, True)
    student = student if student is not None else provider.create_run(model, seed=loop.seed, lora_rank=lora_rank)
    frozen = provider.create_run(teacher_model, seed=teacher_seed, lora_rank=0)
    log(f"teacher: a frozen run of {teacher_model} (seed {teacher_seed}), never trained")
    return _run(provider, student, algo, opts, _taskset(taskset), loop, (model, lora_rank), Teacher(frozen), log)


LOOP_OPERATIONS = ("save_weights_for_sampler", "sample", "forward_backward", "optim_step")
TEACHER_OPERATIONS = ("forward", "logprobs")


def preflight(capabilities: Mapping[str, Any], algo: Any, options: Any, teacher: bool) -> None:
    """Before any run is created: the provider advertises the loss the algorithm sends and every operation
    the loop (and a teacher run) will call; otherwise a ``ConfigError`` and no work (spec 004: fail closed)."""
    from whileai.algorithms.core import require_advertised_loss

    require_advertised_loss(LossContext(None, capabilities, None, None, options), algo.loss)
    advertised = capabilities.get("operations")
    if advertised is None:  # the in-process engine has every operation
        return
    needed = LOOP_OPERATIONS + (TEACHER_OPERATIONS if teacher else ())
    missing = [op for op in needed if op not in advertised]
    if missing:
        raise ConfigError(f"provider {capabilities.get('provider', '?')!r} does not advertise the operations "
                          f"{missing}, which {algo.name} needs (it advertises {', '.join(advertised)})")


def _taskset(taskset: Any) -> Any:
    from whileai.envs import load_taskset

    return load_taskset(taskset) if isinstance(taskset, str) else taskset


def _run(provider: Any, student: Any, algo: Any, options: Any, taskset: Any, loop: LoopSettings,
         model: tuple[str, int], teacher: Teacher | None, log: Callable[[str], None]) -> LoopResult:
    needs = algo.loop_needs(options)
    if needs.second_run is not None and teacher is None:
        raise ConfigError(f"{algo.name} needs a frozen {needs.second_run} run: use teacher_loop (wai loop does)")
    ctx = LossContext(student, provider.capabilities(), student.tokenizer, taskset, options, teacher)
    adam = {"learning_rate": loop.rate(*model, needs.learning_rate)}
    algo.prepare(student, options, adam["learning_rate"])
    group = loop.rollouts_per_prompt or needs.rollouts_per_prompt
    cap = loop.max_tokens or taskset.max_tokens or needs.max_tokens or DEFAULT_MAX_TOKENS
    log(f"{algo.name} on {taskset.name} with {model[0]} ({provider.where}): loss {algo.loss}, {loop.tasks_per_cycle} "
        f"prompts x {group} rollouts per cycle, max_tokens {cap}, learning rate {adam['learning_rate']:g}")
    history: list[dict[str, Any]] = []
    state = None
    for cycle in range(loop.cycles):
        version = int(student.save_weights_for_sampler())
        request = SampleRequest(group, {"max_tokens": int(cap), "temperature": needs.temperature,
                                        "seed": loop.seed * 1_000_003 + cycle}, version,
                                cap_is_answer_length=loop.max_tokens is None and taskset.max_tokens is not None)
        sample = _sample(ctx, taskset, loop, cycle, request)
        result = algo.run_cycle(sample, cycle, request, ctx, adam, state)
        state = result.state
        record = {"cycle": cycle, "version": version, **reward_metrics(sample), **result.metrics}
        history.append(record)
        log(_line(record) + "".join(f"\n    note: {n}" for n in result.notes))
    return LoopResult(history, student, teacher.run if teacher is not None else None, provider.where, provider)


def _sample(ctx: LossContext, taskset: Any, loop: LoopSettings, cycle: int, request: SampleRequest) -> Sample:
    """One cycle's prompts (a fixed function of seed and cycle), sampled in one call and graded."""
    from whileai.envs import render_prompt
    from whileai.loop.rollouts import step_tasks

    tasks = step_tasks(taskset.split("train"), loop.tasks_per_cycle, loop.seed, cycle)
    prompts = [render_prompt(ctx.tokenizer, t) for t in tasks]
    samples = ctx.client.sample(prompts, request.num_samples, request.sampling_params, version=request.version)
    groups = [Group(task, prompt, [grade(ctx, task, s, request) for s in sequences])
              for task, prompt, sequences in zip(tasks, prompts, samples)]
    return Sample(groups, request.version)


def _line(record: Mapping[str, Any]) -> str:
    shown = {k: v for k, v in record.items() if k not in ("cycle", "version")}
    parts = [f"{k} {v:.4g}" if isinstance(v, float) and np.isfinite(v) else f"{k} {v}" for k, v in shown.items()]
    return f"cycle {record['cycle']}  v{record['version']}  " + "  ".join(parts)
