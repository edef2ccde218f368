"""The run plan: config x method run spec x taskset x model, resolved once at the start of a run.

    plan = make_plan(config, origins, method, taskset)   # every setting with its value and its source
    print(plan.table())                                  # what `wai train` prints at start (and --dry-run)

A ``RunPlan`` is frozen. The loop, the hooks and the summary read their settings from it and nothing
downstream resolves a setting again; RUN_DIR/config.toml holds it whole (``[plan]`` and ``[sources]``) and a
resume reads it back from there (only ``steps`` may change). Each rule for a setting the config leaves empty
is one function below (``RULES``), each the precedence of one setting: the user's value, the method's declared
one, a built-in taskset's measured ``Recommended``, then the rule of ``whileai.loop.plan.rules`` (a warm start from
the taskset's reference answers, a cap from their lengths, a rate by model kind and size), whose constants are
the declared defaults; the loop's few own defaults are ``DEFAULTS``. A rule returns ``(value, source)``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, cast, overload

from whileai.knobs import Knob, integer, number
from whileai.loop.plan import rules
from whileai.loop.plan.config import TrainConfig, tomllib
from whileai.methods.run_spec import RunSpec

if TYPE_CHECKING:
    from whileai.engine.sampling import SamplingParams
    from whileai.envs.core import Recommended, Taskset
    from whileai.methods.base import Method

T = TypeVar("T")

# Where a value came from, as the plan's table prints it.
USER, FILE, TASKSET, METHOD, MODEL_RULE, DEFAULT, RESUME, RULE = ("user", "config file", "taskset", "method",
                                                                  "model rule", "default", "resume", "rule")
LOOP = "loop defaults (whileai.loop.plan.run_plan)"

# The loop's own defaults for the settings a config may leave empty: each declared here, once.
DEFAULTS: dict[str, Knob] = {
    "steps": Knob(40, "RL steps when neither the config nor the taskset says", integer(1), LOOP),
    "lag": Knob(2, "a rollout method's sampler lag (a lagging sampler, as production has)", integer(0), LOOP),
    "sync_every": Knob(1, "with a sampler server: push the weights after every this many optimizer steps",
                       integer(1), LOOP),
    "score_head_learning_rate": Knob(1e-3, "a reward model's scalar head when neither rate is given",
                                     number(0.0, open_low=True), LOOP),
}


def default(name: str) -> Any:
    return DEFAULTS[name].value


@dataclass(frozen=True)
class RunPlan:
    """Every setting a run uses, resolved; ``sources`` says where each came from."""

    method: str
    model: str
    steps: int
    learning_rate: float
    lr_schedule: str
    warm_start_steps: int
    warm_start_learning_rate: float
    warm_start_batch: int
    lag: int
    rollouts_per_step: int
    rollouts_per_prompt: int
    temperature: float
    max_tokens: int
    cap_is_answer_length: bool
    critic_learning_rate: float | None
    seed: int
    eval_tasks: int
    eval_samples: int
    eval_every: int
    save_every: int
    micro_batch_tokens: int
    sampler: str = "in-process"
    """where rollouts are sampled: in-process (the trainer), or the URL of an inference server"""
    sync_every: int = 1
    """with a sampler server: the weights are pushed after every this many optimizer steps"""
    trainer: str | None = None
    """where the model trains: 'in-process', 'wai serve at URL' or 'Tinker API at URL' (--url, --api)"""
    threads: int = 1
    """torch CPU threads (--threads; the rule: $OMP_NUM_THREADS, else free cores)"""
    activation_checkpointing: str | None = None
    """'on' or 'off' for the in-process trainer (--activation-checkpointing; the rule of
    whileai.activation_checkpointing); None: a server's trainer, or a plan saved before the setting existed"""
    sources: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    """what the checks before the warm start found worth saying (whileai.loop.plan.inputs): printed under the table"""

    def source(self, name: str) -> str:
        """Where ``name``'s value came from (a rule's: "rule: " and its sentence)."""
        return dict(self.sources).get(name, DEFAULT)

    def values(self) -> dict[str, Any]:
        """Every setting's value (config.toml's [plan], summary.json's ``plan``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("sources", "notes")}

    def table(self, columns: int = 2) -> str:
        """The compact table `wai train` prints at start: each setting's value and [source], ``columns`` a line."""
        short = {k: RULE if self.source(k).startswith(RULE + ":") else self.source(k) for k in self.values()}
        cells = [f"{k} {v:g} [{short[k]}]" if isinstance(v, float) else f"{k} {v} [{short[k]}]"
                 for k, v in self.values().items() if v is not None]
        width = max(len(c) for c in cells)
        lines = ["  " + "   ".join(c.ljust(width) for c in cells[i:i + columns]).rstrip()
                 for i in range(0, len(cells), columns)]
        why = [f"  {k}: {self.source(k)[len(RULE) + 2:]}" for k in short if short[k] == RULE]
        notes = ["notes:", *(f"  {n}" for n in self.notes)] if self.notes else []
        return "run plan (value [source]):\n" + "\n".join(lines + (["rules:", *why] if why else []) + notes)

    def learning_rate_at(self, step: int) -> float:
        """The policy learning rate of step ``step`` (0-based) under ``lr_schedule`` over ``steps``."""
        if self.lr_schedule == "linear":
            return self.learning_rate * (1.0 - step / self.steps)
        return self.learning_rate

    def sampling(self) -> SamplingParams:
        """The run's sampling parameters: the method's temperature and the cap, what the rollouts sample with
        (each turn with its own cap, stops and seed) and what the trainer scores under (a logged trace's own
        settings replace its fields: ``whileai.loop.step.by_distribution``)."""
        from whileai.engine.sampling import SamplingParams

        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature)

    def with_threads(self, threads: int, source: str) -> RunPlan:
        """The plan of a resumed run: its threads resolved again (the machine's load is not the one it started
        under), or ``--threads`` given to the resume."""
        sources = tuple((k, source if k == "threads" else s) for k, s in self.sources)
        return dataclasses.replace(self, threads=threads, sources=sources)

    def with_steps(self, steps: int) -> RunPlan:
        """The plan of a resumed run trained longer (``--resume --steps N``): the schedule is the N-step run's."""
        sources = tuple((k, RESUME if k == "steps" else s) for k, s in self.sources)
        return dataclasses.replace(self, steps=steps, sources=sources)

    @classmethod
    def from_saved(cls, values: Mapping[str, Any], sources: Mapping[str, str]) -> RunPlan:
        """The plan a run wrote to config.toml (TOML has no null: a missing optional value is None)."""
        fields = [f for f in dataclasses.fields(cls) if f.name not in ("sources", "notes")]
        filled: dict[str, Any] = {f.name: values.get(f.name) for f in fields  # a setting added later: its default
                                  if f.name in values or f.default is dataclasses.MISSING}
        return cls(**filled, sources=tuple(sorted(sources.items())))


def saved_plan(path: Path) -> RunPlan | None:
    """The run plan a run wrote to its config.toml, or None (a run written before plans were saved)."""
    data = tomllib.loads(path.read_text())
    if "plan" not in data:
        return None
    return RunPlan.from_saved(data["plan"], data.get("sources", {}))


class Resolved(TypedDict, total=False):
    """What a rule reads of the settings resolved before it (in ``RULES``' order): the warm start, which the
    warm start's rate, the learning rate and the cap depend on. (Every setting's type is ``RunPlan``'s.)"""

    warm_start_steps: int


Rule = Callable[[TrainConfig, "Method | None", "Taskset | None", Resolved], tuple[T, str]]
"""(config, method, taskset, the values resolved before it) -> (value, source)"""


def _recommended(config: TrainConfig, taskset: Taskset | None, name: str) -> Recommended | None:
    """The taskset's ``Recommended`` when it applies to ``name``: a built-in (random-init) model on the taskset's
    own tasks. Rows as pushed take only the warm start from it (its RL settings were measured for rollouts)."""
    if taskset is None or config.taskset is None or not config.model.startswith("builtin:"):
        return None
    if config.rows is not None and name not in ("warm_start_steps", "warm_start_learning_rate"):
        return None
    return getattr(taskset, "recommended", None)


def _own_tasks(config: TrainConfig, taskset: Taskset | None) -> bool:
    """The run samples a taskset of the user's own (no measured ``Recommended``): the rules fill its settings."""
    return taskset is not None and config.taskset is not None and config.rows is None \
        and getattr(taskset, "recommended", None) is None


def _ruled(ruled: tuple[T, str]) -> tuple[T, str]:
    return ruled[0], f"{RULE}: {ruled[1]}"


def steps_rule(config: TrainConfig, method: Method | None, taskset: Taskset | None,
               values: Resolved) -> tuple[int, str]:
    hint = recommended.steps if (recommended := _recommended(config, taskset, "steps")) else None
    return (hint, TASKSET) if hint is not None else (int(default("steps")), DEFAULT)


def warm_start_steps_rule(config: TrainConfig, method: Method | None, taskset: Taskset | None,
                          values: Resolved) -> tuple[int, str]:
    """A built-in taskset's measured count; a taskset of the user's own: the rule (until a pass estimate, on a
    random-init model whose every train task has a reference answer); else 0."""
    hint = recommended.warm_start_steps if (recommended := _recommended(config, taskset, "warm_start_steps")) else None
    if hint is not None:
        return hint, TASKSET
    if taskset is not None and _own_tasks(config, taskset):
        train = taskset.split("train")
        return _ruled(rules.warm_start_steps(random_init=config.model.startswith("builtin:"), train_size=len(train),
                                             answered=sum(t.answer is not None for t in train)))
    return 0, DEFAULT


def warm_start_learning_rate_rule(config: TrainConfig, method: Method | None, taskset: Taskset | None,
                                  values: Resolved) -> tuple[float, str]:
    recommended = _recommended(config, taskset, "warm_start_learning_rate")
    hint = recommended.warm_start_learning_rate if recommended else None
    if hint is not None:
        return hint, TASKSET
    steps = int(values.get("warm_start_steps") or 0)
    if _own_tasks(config, taskset) and steps:
        return _ruled(rules.warm_start_learning_rate(steps))
    return rules.SHORT_WARM_START_LEARNING_RATE, DEFAULT


def learning_rate_rule(config: TrainConfig, method: Method | None, taskset: Taskset | None,
                       values: Resolved) -> tuple[float, str]:
    """The method's declared rate; else, on a built-in model, a built-in taskset's recommendation or the
    random-init rate; else the rule by model kind and size (whileai.loop.plan.rules.learning_rate)."""
    declared = method.run_spec().learning_rate if method is not None else None
    if declared is not None:
        return declared, METHOD
    random_init = config.model.startswith("builtin:")
    if random_init and not _own_tasks(config, taskset):
        hint = recommended.learning_rate if (recommended := _recommended(config, taskset, "learning_rate")) else None
        return (hint, TASKSET) if hint is not None else (rules.RANDOM_INIT_LEARNING_RATE, MODEL_RULE)
    parameters = None if random_init else rules.model_parameters(config.model)
    if not random_init and parameters is None:  # a hub id or a folder without config.json: a pretrained LLM
        return (rules.LORA_LEARNING_RATE if config.lora_rank else rules.FULL_LEARNING_RATE), MODEL_RULE
    return _ruled(rules.learning_rate(random_init=random_init, warm_start_steps=int(values.get("warm_start_steps", 0)),
                                      lora_rank=config.lora_rank, parameters=parameters))


def lag_rule(config: TrainConfig, method: Method | None, taskset: Taskset | None,
             values: Resolved) -> tuple[int, str]:
    """0 for rows from a file (no sampler) or a method that trains on rows as pushed, else the default lag."""
    rows = config.rows is not None or config.rows_from is not None or (method is not None and method.run_spec().source == "rows")
    return (0, DEFAULT) if rows else (int(default("lag")), DEFAULT)


def max_tokens_rule(config: TrainConfig, method: Method | None, taskset: Taskset | None,
                    values: Resolved) -> tuple[int, str]:
    """The taskset's cap; else, for a taskset of the user's own whose completion is the answer, the longest
    reference answer + a margin + EOS; else the method's; else the rules' fallback."""
    method_cap = method.run_spec().max_tokens if method is not None else None
    if taskset is not None and taskset.max_tokens:
        return taskset.max_tokens, TASKSET
    lengths: list[int] = []
    grader = config.taskset_options.get("grader", "exact" if str(config.taskset).endswith(".jsonl") else None)
    whole = rules.whole_answer(grader, int(values.get("warm_start_steps", 0)))
    if taskset is not None and _own_tasks(config, taskset) and whole and _loadable(config.model):
        from whileai.trainers.base import load_tokenizer  # transformers: only for a taskset of the user's own

        encode = load_tokenizer(config.model).encode
        lengths = rules.answer_tokens((t.answer for t in taskset.split("train")),
                                      lambda text: encode(text, add_special_tokens=False))
    value, why = rules.generation_cap(taskset_cap=None, answer_lengths=lengths, whole_answer=whole,
                                      method_cap=method_cap)
    if lengths and whole:
        return value, f"{RULE}: {why}"
    return value, METHOD if method_cap is not None else DEFAULT


def _loadable(model: str) -> bool:
    """The model's tokenizer can be read (a missing folder is reported by the run's checks, not as a hub error)."""
    from whileai.engine.models import model_problem

    return model_problem(model) is None


def critic_learning_rate_rule(config: TrainConfig, method: Method | None, taskset: Taskset | None,
                              values: Resolved) -> tuple[float | None, str]:
    """A critic method's own rate; a scalar head's (RM): the policy rate given, else its default; else none."""
    spec = method.run_spec() if method is not None else None
    if spec is not None and spec.critic is not None:
        return spec.critic.learning_rate, METHOD
    if spec is not None and spec.head == "score":
        return (config.learning_rate, USER) if config.learning_rate else (float(default("score_head_learning_rate")),
                                                                           DEFAULT)
    return None, DEFAULT


# The rule for each setting a config may leave empty (None), in the order they resolve (a later rule reads the
# values before it: the learning rate and the cap read the warm start); ``make_plan`` calls them in this order.
RULES: dict[str, Rule[Any]] = {
    "steps": steps_rule, "warm_start_steps": warm_start_steps_rule,
    "warm_start_learning_rate": warm_start_learning_rate_rule, "learning_rate": learning_rate_rule,
    "lag": lag_rule, "max_tokens": max_tokens_rule, "critic_learning_rate": critic_learning_rate_rule,
}


@overload
def with_cap(method: Method, config: TrainConfig, plan: RunPlan) -> Method: ...
@overload
def with_cap(method: None, config: TrainConfig, plan: RunPlan) -> None: ...
def with_cap(method: Method | None, config: TrainConfig, plan: RunPlan) -> Method | None:
    """The method with the plan's sampling cap as its generation cap where the user did not set that knob
    (``Method.with_cap``: a knob left at its declared default, on a method object too)."""
    return None if method is None else method.with_cap(plan.max_tokens)


class _Resolving:
    """``make_plan``'s settings so far and their sources; each ``rule`` is typed by its rule, so the type checker
    follows every setting from the config's field to the plan's."""

    def __init__(self, config: TrainConfig, origins: Mapping[str, str], method: Method | None,
                 taskset: Taskset | None) -> None:
        self.config, self.origins, self.method, self.taskset = config, origins, method, taskset
        self.values: dict[str, object] = {}
        self.resolved = cast(Resolved, self.values)  # what rules read of it, by the settings' names
        self.sources: dict[str, str] = {}

    def rule(self, name: str, given: T | None, rule: Rule[T]) -> T:
        """The config's value (its source USER or FILE), else the rule's."""
        if given is not None:
            return self.set(name, given, self.origins.get(name, USER))
        return self.set(name, *rule(self.config, self.method, self.taskset, self.resolved))

    def optional(self, name: str, given: T | None, rule: Rule[T | None]) -> T | None:
        """``rule`` for a setting that may stay None."""
        if given is not None:
            return self.set(name, given, self.origins.get(name, USER))
        value, source = rule(self.config, self.method, self.taskset, self.resolved)
        return self.set(name, value, source)

    def config_value(self, name: str, value: T) -> T:
        """A setting the config always holds (its default, or the user's)."""
        return self.set(name, value, self.origins.get(name, DEFAULT))

    def set(self, name: str, value: T, source: str) -> T:
        self.values[name], self.sources[name] = value, source
        return value


def make_plan(config: TrainConfig, origins: Mapping[str, str], method: Method | None,
              taskset: Taskset | None) -> RunPlan:
    """Resolve every setting once. ``origins``: where each field the config sets came from (USER or FILE);
    ``method`` None (``--method auto`` before route, or a recipe's method-independent part) leaves the
    method's settings at a one-rollout method's."""
    r = _Resolving(config, origins, method, taskset)
    steps = r.rule("steps", config.steps, steps_rule)
    warm_start_steps = r.rule("warm_start_steps", config.warm_start_steps, warm_start_steps_rule)
    if taskset is None:
        warm_start_steps = r.set("warm_start_steps", 0, DEFAULT)  # no reference answers to take
    warm_start_learning_rate = r.rule("warm_start_learning_rate", config.warm_start_learning_rate,
                                      warm_start_learning_rate_rule)
    learning_rate = r.rule("learning_rate", config.learning_rate, learning_rate_rule)
    lag = r.rule("lag", config.lag, lag_rule)
    max_tokens = r.rule("max_tokens", config.max_tokens, max_tokens_rule)
    critic_learning_rate = r.optional("critic_learning_rate", config.critic_learning_rate, critic_learning_rate_rule)
    spec = method.run_spec() if method is not None else RunSpec()
    knob_source = f"{METHOD} (--set)" if config.knobs else METHOD
    task_cap = taskset.max_tokens if taskset is not None else None
    cap_is_answer_length = config.max_tokens is None and task_cap is not None
    sync_every = r.rule("sync_every", config.sync_every, lambda *_: (int(default("sync_every")), DEFAULT))
    return RunPlan(
        method=r.config_value("method", config.method), model=r.config_value("model", config.model), steps=steps,
        learning_rate=learning_rate, lr_schedule=r.config_value("lr_schedule", config.lr_schedule),
        warm_start_steps=warm_start_steps, warm_start_learning_rate=warm_start_learning_rate,
        warm_start_batch=r.config_value("warm_start_batch", config.warm_start_batch), lag=lag,
        rollouts_per_step=r.config_value("rollouts_per_step", config.rollouts_per_step),
        rollouts_per_prompt=r.set("rollouts_per_prompt", spec.rollouts_per_prompt, knob_source),
        temperature=r.set("temperature", spec.temperature, knob_source), max_tokens=max_tokens,
        cap_is_answer_length=r.set("cap_is_answer_length", cap_is_answer_length,
                                   TASKSET if cap_is_answer_length else "derived"),
        critic_learning_rate=critic_learning_rate, seed=r.config_value("seed", config.seed),
        eval_tasks=r.config_value("eval_tasks", config.eval_tasks),
        eval_samples=r.config_value("eval_samples", config.eval_samples),
        eval_every=r.config_value("eval_every", config.eval_every),
        save_every=r.config_value("save_every", config.save_every),
        micro_batch_tokens=r.config_value("micro_batch_tokens", config.micro_batch_tokens),
        sampler=r.set("sampler", config.sampler_url or "in-process",
                      origins.get("sampler_url", DEFAULT) if config.sampler_url else DEFAULT),
        sync_every=sync_every,
        threads=r.rule("threads", config.threads, lambda *_: threads_rule()),
        activation_checkpointing=r.set("activation_checkpointing", *checkpointing_rule(config, origins)),
        trainer=r.set("trainer", trainer_of(config), origins.get("url", DEFAULT) if config.url is not None else DEFAULT),
        sources=tuple(sorted(r.sources.items())))


def threads_rule() -> tuple[int, str]:
    """The rule's torch threads from this process's surroundings ($OMP_NUM_THREADS, its CPU affinity, the load)."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return _ruled(rules.threads(omp=os.environ.get("OMP_NUM_THREADS"), cores=cores, load=load))


def checkpointing_rule(config: TrainConfig, origins: Mapping[str, str]) -> tuple[str | None, str]:
    """'on' / 'off' as given, else the rule of ``whileai.activation_checkpointing`` for the model's size (its
    config.json's estimate, embeddings included) on the run's device; None with a server's trainer."""
    from whileai.activation_checkpointing import rule

    if config.url is not None:
        return None, DEFAULT
    if config.activation_checkpointing != "auto":
        return config.activation_checkpointing, origins.get("activation_checkpointing", USER)
    size = None
    path = Path(config.model) / "config.json"
    if not config.model.startswith("builtin:") and path.is_file():
        try:
            size = rules.estimate_parameters(json.loads(path.read_text()))
        except (OSError, ValueError):
            size = None
    on, why = rule(size, config.device, builtin=config.model.startswith("builtin:"))
    return ("on" if on else "off"), f"{RULE}: {why}"


def trainer_of(config: TrainConfig) -> str:
    """Where the run's model trains, as the plan shows it (``trainers.open.title``)."""
    from whileai.trainers.open import title

    return title(config.api, config.url)
