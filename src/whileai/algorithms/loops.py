"""``rl_loop`` and ``teacher_loop``: any method of the registry end to end, against an engine or the service.

    per cycle: save_weights_for_sampler -> sample -> grade -> [more rounds: run_spec().plan]
               -> [teacher / reference fields] -> method.update -> forward_backward -> optim_step

The method is any name of ``whileai.methods`` (``wai methods``). A method whose ``run_spec().loss`` is
``cross_entropy`` goes through ``whileai.loop.step.policy_step`` (weights = c); one whose loss is an engine
loss sends ``Update.advantages`` with the sampler's logprobs to that loss, its config placed as the provider
advertises it (scalar config keys, or per-token inputs as Tinker Cloud takes clip thresholds). The trainer is
a ``TrainingEngine`` (in-process) or a service ``RunClient`` (over HTTP); both have the same operations.
``teacher_loop`` adds a second, frozen run that fills the teacher's fields (OPD's teacher, OPSD / SDPO's
frozen self-teacher); nothing ever calls ``optim_step`` on it. Spec: 004 "Shared Whitney loop".

The spine's ``wai train --url`` replaces this module; it stays importable until then.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from whileai.errors import ConfigError

DEFAULT_MAX_TOKENS = 256
"""the cap when neither the caller, the taskset nor the method sets one (as ``wai train``)"""
# The teacher weights a frozen second run can stand for: a separate model, or the student's starting weights.
SECOND_RUN = {"model": "teacher", "initial": "reference"}


# ----------------------------------------------------------------------------- what a cycle sampled
@dataclass(frozen=True)
class Completion:
    """One sampled completion, graded."""

    tokens: list[int]
    logprobs: list[float]
    """the sampler's log-probability of each token"""
    stop_reason: str
    reward: float
    text: str
    truncated: bool
    """cut by the cap when the cap is not the answer's own length"""


@dataclass(frozen=True)
class Group:
    """A prompt and its completions."""

    task: Any
    prompt_tokens: list[int]
    completions: list[Completion]


@dataclass(frozen=True)
class SampleRequest:
    """What the sampler was asked for in this cycle (a resample asks the same again)."""

    num_samples: int
    sampling_params: dict[str, Any]
    version: int
    cap_is_answer_length: bool = False


@dataclass
class Teacher:
    """A frozen second run (a trainer nobody calls ``optim_step`` on)."""

    run: Any


@dataclass
class LoopContext:
    """The student's trainer, the provider's capabilities, the tokenizer, the taskset and the frozen run."""

    client: Any
    capabilities: Mapping[str, Any]
    tokenizer: Any
    taskset: Any
    teacher: Teacher | None = None

    def grade(self, task: Any, sequence: Any, request: SampleRequest) -> Completion:
        text = self.tokenizer.decode(list(sequence.tokens), skip_special_tokens=True)
        truncated = sequence.stop_reason == "length" and not request.cap_is_answer_length
        return Completion(list(sequence.tokens), [float(x) for x in sequence.logprobs], str(sequence.stop_reason),
                          self.taskset.grade(task, text), text, bool(truncated))

    def sample_more(self, group: Group, n: int, request: SampleRequest, round_number: int) -> list[Completion]:
        """``n`` more graded completions of ``group``'s prompt from the same weights version."""
        params = {**request.sampling_params, "seed": int(request.sampling_params.get("seed") or 0) + 7919 * round_number}
        sequences = self.client.sample(group.prompt_tokens, n, params, version=request.version)
        return [self.grade(group.task, s, request) for s in sequences]


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


# ----------------------------------------------------------------------------- the method
def resolve(method: Any, options: Mapping[str, Any] | None = None) -> Any:
    """A registry method by name (with ``options``), or a method object as given; refused when it trains on
    rows as pushed or its teacher follows the student (a frozen second run cannot)."""
    from whileai.methods import method as by_name

    chosen = by_name(method, **dict(options or {})) if isinstance(method, str) else method
    spec = chosen.run_spec()
    if spec.source != "rollouts":
        raise ConfigError(f"method {chosen.name!r} trains on rows as pushed ({spec.source}), not on sampled "
                          "rollouts: run it with `wai train --rows FILE` instead of a loop")
    if spec.teacher is not None and spec.teacher.weights not in SECOND_RUN:
        raise ConfigError(f"method {chosen.name!r}'s teacher follows the student's weights "
                          f"({spec.teacher.weights!r}), which a frozen second run cannot: pick a frozen teacher "
                          "(for OPSD: anchor=initial, `--set anchor=initial`), or run it with `wai train`")
    return chosen


def second_run(method: Any) -> str | None:
    """None, 'teacher' (a frozen separate model) or 'reference' (the student's frozen starting weights, also
    what fills ``ref_logprobs``)."""
    spec = method.run_spec()
    if spec.teacher is not None:
        return SECOND_RUN[spec.teacher.weights]
    return "reference" if "ref_logprobs" in spec.needs else None


# ----------------------------------------------------------------------------- the loops
def rl_loop(target: Any, method: Any, taskset: Any, *, model: str = "builtin:tiny", lora_rank: int = 0,
            options: Mapping[str, Any] | None = None, teacher: Teacher | None = None,
            log: Callable[[str], None] = print, **settings: Any) -> LoopResult:
    """Run ``method`` (a registry name with ``options``, or a method object) on ``taskset`` (a spec or a
    ``Taskset``) for ``settings.cycles`` cycles; ``target`` as in ``provider_for``; ``settings`` are
    ``LoopSettings`` fields. Returns a ``LoopResult``."""
    chosen = resolve(method, options)
    loop = LoopSettings(**settings)
    provider, student = provider_for(target)
    preflight(provider.capabilities(), chosen, teacher is not None)
    student = student if student is not None else provider.create_run(model, seed=loop.seed, lora_rank=lora_rank)
    return _run(provider, student, chosen, _taskset(taskset), loop, (model, lora_rank), teacher, log)


def teacher_loop(target: Any, method: Any, taskset: Any, *, model: str = "builtin:tiny", lora_rank: int = 0,
                 teacher_model: str | None = None, teacher_seed: int | None = None,
                 options: Mapping[str, Any] | None = None, log: Callable[[str], None] = print,
                 **settings: Any) -> LoopResult:
    """``rl_loop`` with a second, frozen run (``teacher_model``, default the student's base model, seeded
    ``teacher_seed``, default the student's seed: the same starting weights) that fills the teacher's fields.
    It is created once and never trained."""
    chosen = resolve(method, options)
    loop = LoopSettings(**settings)
    teacher_model = teacher_model or model
    teacher_seed = loop.seed if teacher_seed is None else teacher_seed
    if second_run(chosen) == "teacher" and (teacher_model, teacher_seed) == (model, loop.seed):
        raise ConfigError(f"{chosen.name} distils from a teacher, and the teacher given is the student's own starting "
                          "weights (nothing to learn): pass teacher_model= (--teacher-model), or teacher_seed= "
                          "(--teacher-seed) for a differently initialised built-in")
    provider, student = provider_for(target)
    preflight(provider.capabilities(), chosen, True)
    student = student if student is not None else provider.create_run(model, seed=loop.seed, lora_rank=lora_rank)
    frozen = provider.create_run(teacher_model, seed=teacher_seed, lora_rank=0)
    log(f"teacher: a frozen run of {teacher_model} (seed {teacher_seed}), never trained")
    return _run(provider, student, chosen, _taskset(taskset), loop, (model, lora_rank), Teacher(frozen), log)


LOOP_OPERATIONS = ("save_weights_for_sampler", "sample", "forward_backward", "optim_step")
TEACHER_OPERATIONS = ("forward", "logprobs")


def preflight(capabilities: Mapping[str, Any], method: Any, teacher: bool) -> None:
    """Before any run is created: the provider advertises the method's loss (and can take its config) and
    every operation the loop (and a teacher run) will call; otherwise a ``ConfigError`` and no work."""
    spec = method.run_spec()
    place_config(capabilities, spec.loss, dict(spec.loss_config))
    advertised = capabilities.get("operations")
    if advertised is None:  # the in-process engine has every operation
        return
    needed = LOOP_OPERATIONS + (TEACHER_OPERATIONS if teacher else ())
    missing = [op for op in needed if op not in advertised]
    if missing:
        raise ConfigError(f"provider {capabilities.get('provider', '?')!r} does not advertise the operations "
                          f"{missing}, which {method.name} needs (it advertises {', '.join(advertised)})")


def place_config(capabilities: Mapping[str, Any], loss: str, config: Mapping[str, Any]) -> tuple[dict, dict]:
    """``(loss_fn_config, per_token_inputs)``: each config key where the provider's entry for ``loss`` takes it,
    a scalar config key or a per-token ``loss_fn_inputs`` field (Tinker Cloud's clip thresholds); a loss not
    advertised, or a key taken neither way, fails closed (never another loss)."""
    from whileai.service.client import require_advertised_loss

    losses = capabilities.get("losses")
    if not isinstance(losses, Mapping):
        raise ConfigError("the provider's capabilities answer has no 'losses' table, so nothing can be checked "
                          "before work is sent; use a provider that advertises its losses")
    entry = require_advertised_loss(capabilities, loss)
    scalar, per_token = {}, {}
    for key, value in config.items():
        if key in entry.get("config", {}):
            scalar[key] = value
        elif key in entry.get("optional_inputs", ()):
            per_token[key] = value
        else:
            raise ConfigError(f"provider {capabilities.get('provider', '?')!r} takes {key!r} for loss {loss!r} "
                              "neither as a config key nor as a per-token input; pick another method")
    return scalar, per_token


def _taskset(taskset: Any) -> Any:
    from whileai.envs import load_taskset

    return load_taskset(taskset) if isinstance(taskset, str) else taskset


def _run(provider: Any, student: Any, method: Any, taskset: Any, loop: LoopSettings,
         model: tuple[str, int], teacher: Teacher | None, log: Callable[[str], None]) -> LoopResult:
    spec = method.run_spec()
    if second_run(method) is not None and teacher is None:
        raise ConfigError(f"{method.name} needs a frozen {second_run(method)} run: use teacher_loop (wai loop does)")
    ctx = LoopContext(student, provider.capabilities(), student.tokenizer, taskset, teacher)
    adam = {"learning_rate": loop.rate(*model, spec.learning_rate)}
    _attach_critic(student, method)
    group = loop.rollouts_per_prompt or spec.rollouts_per_prompt
    cap = loop.max_tokens or taskset.max_tokens or spec.max_tokens or DEFAULT_MAX_TOKENS
    log(f"{method.name} on {taskset.name} with {model[0]} ({provider.where}): loss {spec.loss}, {loop.tasks_per_cycle} "
        f"prompts x {group} rollouts per cycle, max_tokens {cap}, learning rate {adam['learning_rate']:g}")
    history: list[dict[str, Any]] = []
    state = method.initial_state() if spec.stateful else None
    for cycle in range(loop.cycles):
        version = int(student.save_weights_for_sampler())
        request = SampleRequest(group, {"max_tokens": int(cap), "temperature": spec.temperature,
                                        "seed": loop.seed * 1_000_003 + cycle}, version,
                                cap_is_answer_length=loop.max_tokens is None and taskset.max_tokens is not None)
        groups = _sample(ctx, taskset, loop, cycle, request)
        rows = [row(g, c) for g in groups for c in g.completions]
        rows += _planned(spec, groups, request, ctx, rows)
        metrics, notes, state = _cycle(ctx, method, rows, request, adam, state, cycle)
        rewards = np.asarray([r["reward"] for r in rows])
        record = {"cycle": cycle, "version": version, "reward": float(rewards.mean()),
                  "pass_rate": float(np.mean(rewards >= 1.0)), **metrics}
        history.append(record)
        log(_line(record) + "".join(f"\n    note: {n}" for n in notes))
    return LoopResult(history, student, teacher.run if teacher is not None else None, provider.where, provider)


def _attach_critic(trainer: Any, method: Any) -> None:
    """Attach the value head a critic method needs (a trainer without ``add_critic`` cannot run one)."""
    critic = method.run_spec().critic
    if critic is None:
        return
    if not callable(getattr(trainer, "add_critic", None)):
        raise ConfigError(f"method {method.name!r} trains a critic and this trainer ({type(trainer).__name__}) "
                          "cannot attach one; run it in-process (no --url)")
    trainer.add_critic(critic.learning_rate, reward_range=critic.reward_range)


def row(group: Group, completion: Completion) -> dict[str, Any]:
    """A completion as the library's row (plus the step's bookkeeping ``prompt_tokens``, ``completion``)."""
    return {"task_id": group.task.task_id, "reward": completion.reward, "prompt_tokens": list(group.prompt_tokens),
            "tokens": list(completion.tokens), "behavior_logprobs": list(completion.logprobs),
            "truncated": completion.truncated, "completion": completion.text}


def _cycle(ctx: LoopContext, method: Any, rows: list[dict[str, Any]], request: SampleRequest,
           adam: Mapping[str, Any], state: Any, cycle: int) -> tuple[dict[str, float], list[str], Any]:
    """One step: cross_entropy through the loop's policy_step, or the method's named loss."""
    from whileai.loop.step import policy_step

    spec = method.run_spec()
    temperature = request.sampling_params["temperature"]
    # the distribution the tokens are scored under: the model's own at temperature 1 (None, which every trainer
    # takes, a Tinker server included), else the sampler's temperature
    scoring = None if temperature == 1.0 else {"max_tokens": request.sampling_params["max_tokens"],
                                               "temperature": temperature}
    if "ref_logprobs" in spec.needs and ctx.teacher is not None:  # the frozen run is the reference
        for r in rows:
            r["ref_logprobs"] = ctx.teacher.run.compute_logprobs(r["prompt_tokens"] + r["tokens"])["logprobs"][
                -len(r["tokens"]):]
    if spec.loss != "cross_entropy":
        return named_loss_step(ctx, method, rows, scoring, adam)
    warmup = spec.critic.warmup if spec.critic is not None else 0
    result = policy_step(ctx.client, method, rows, adam=dict(adam), state=state, sampling_params=scoring,
                         rescore=False, train_policy=cycle >= warmup,
                         critic_steps=spec.critic.steps if spec.critic is not None else 0,
                         teacher=_teacher(spec, ctx))
    metrics = {k: v for k, v in result.metrics.items() if k not in ("reward", "pass_rate")}
    return metrics, list(result.update.notes), result.state


def named_loss_step(ctx: LoopContext, method: Any, rows: list[dict[str, Any]], scoring: Mapping[str, Any] | None,
                    adam: Mapping[str, Any]) -> tuple[dict[str, float], list[str], Any]:
    """fill -> update -> forward_backward(spec.loss, advantages, the sampler's logprobs) -> optim_step."""
    from whileai.engine.datums import make_datum
    from whileai.loop.step import BOOKKEEPING, fill

    spec = method.run_spec()
    teacher = _teacher(spec, ctx)
    if teacher is not None:
        teacher.fill(rows, scoring)
    for r in rows:
        r["logprobs"] = list(r["behavior_logprobs"])  # on-policy: the sampler's are the policy's
    fill(ctx.client, rows, spec.needs, scoring)
    update = method.update([{k: v for k, v in r.items() if k not in BOOKKEEPING} for r in rows])
    config, per_token = place_config(ctx.capabilities, spec.loss, dict(spec.loss_config))
    data = [make_datum(r["prompt_tokens"], r["tokens"], logprobs=r["behavior_logprobs"], advantages=list(a),
                       **{k: [v] * len(r["tokens"]) for k, v in per_token.items()})
            for r, a in zip(rows, update.advantages) if np.any(a != 0)]
    for d in data:
        del d["loss_fn_inputs"]["weights"]  # trained where the loss scores (the completion), as Tinker reads it
    metrics = {f"method/{k}": float(v) for k, v in update.stats.items()}
    notes = list(update.notes)
    if data:
        out = ctx.client.forward_backward(data, spec.loss, config or None)
        metrics["loss"] = float(out.metrics.get("loss:sum", 0.0))
    else:
        notes.append("no completion carried a signal this cycle: nothing was sent to forward_backward")
    metrics["grad_norm"] = float(ctx.client.optim_step(dict(adam)).grad_norm)
    metrics["datums"] = float(len(data))
    return metrics, notes, None


def _sample(ctx: LoopContext, taskset: Any, loop: LoopSettings, cycle: int, request: SampleRequest) -> list[Group]:
    """One cycle's prompts (a fixed function of seed and cycle), sampled in one call and graded."""
    from whileai.envs import render_prompt
    from whileai.loop.rollouts import step_tasks

    tasks = step_tasks(taskset.split("train"), loop.tasks_per_cycle, loop.seed, cycle)
    prompts = [render_prompt(ctx.tokenizer, t) for t in tasks]
    samples = ctx.client.sample(prompts, request.num_samples, request.sampling_params, version=request.version)
    return [Group(task, prompt, [ctx.grade(task, s, request) for s in sequences])
            for task, prompt, sequences in zip(tasks, prompts, samples)]


def _planned(spec: Any, groups: Sequence[Group], request: SampleRequest, ctx: LoopContext,
             rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """More rows while the method's adaptive plan asks for them (ReinforceAda, DAPO), from the same weights."""
    if spec.plan is None:
        return []
    by_task = {g.task.task_id: g for g in groups}
    extra: list[dict[str, Any]] = []
    for round_number in range(1, 1000):
        plan = spec.plan(rows + extra, list(by_task))
        if not plan.resample:
            break
        for task_id, n in plan.resample.items():
            group = by_task[task_id]
            extra += [row(group, c) for c in ctx.sample_more(group, int(n), request, round_number)]
    return extra


def _teacher(spec: Any, ctx: LoopContext) -> Any:
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


def _line(record: Mapping[str, Any]) -> str:
    shown = {k: v for k, v in record.items() if k not in ("cycle", "version")}
    parts = [f"{k} {v:.4g}" if isinstance(v, float) and np.isfinite(v) else f"{k} {v}" for k, v in shown.items()]
    return f"cycle {record['cycle']}  v{record['version']}  " + "  ".join(parts)
