"""The run plan: config x method run spec x taskset x model, resolved once at the start of a run.

    plan = make_plan(config, origins, method, taskset)   # every setting with its value and its source
    print(plan.table())                                  # what `wai train` prints at start (and --dry-run)

A ``RunPlan`` is frozen. The loop, the hooks and the summary read their settings from it and nothing
downstream resolves a setting again; RUN_DIR/config.toml holds it whole (``[plan]`` and ``[sources]``) and a
resume reads it back from there (only ``steps`` may change). Each rule for a setting the config leaves empty
is one function below (``RULES``), each default one entry of ``DEFAULTS``; a rule returns ``(value, source)``,
so a new rule (whileai.loop.rules: a warm start from reference answers, a cap from their lengths, a rate by
model kind and size) plugs in by replacing an entry of ``RULES``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whileai.knobs import Knob, integer, number
from whileai.loop.config import TrainConfig, tomllib
from whileai.loop.rollouts import Sampling
from whileai.methods.run_spec import RunSpec

# Where a value came from, as the plan's table prints it.
USER, FILE, TASKSET, METHOD, MODEL_RULE, DEFAULT, RESUME = ("user", "config file", "taskset", "method",
                                                            "model rule", "default", "resume")
LOOP = "loop defaults (whileai.loop.plan)"

# The loop's own defaults for the settings a config may leave empty: each declared here, once.
DEFAULTS: dict[str, Knob] = {
    "steps": Knob(40, "RL steps when neither the config nor the taskset says", integer(1), LOOP),
    "warm_start_learning_rate": Knob(1e-2, "the warm start's rate when neither the config nor the taskset says",
                                     number(0.0, open_low=True), LOOP),
    "lag": Knob(2, "a rollout method's sampler lag (a lagging sampler, as production has)", integer(0), LOOP),
    "builtin_learning_rate": Knob(1e-2, "a built-in model's policy rate: random init, tens of steps (adapters too)",
                                  number(0.0, open_low=True), LOOP),
    "lora_learning_rate": Knob(2e-4, "LoRA on a loaded model", number(0.0, open_low=True), LOOP),
    "full_learning_rate": Knob(1e-5, "full fine-tuning of a loaded model", number(0.0, open_low=True), LOOP),
    "score_head_learning_rate": Knob(1e-3, "a reward model's scalar head when neither rate is given",
                                     number(0.0, open_low=True), LOOP),
    "max_tokens": Knob(256, "the generation cap when neither the config, the taskset nor the method sets one",
                       integer(1), LOOP),
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
    sources: tuple[tuple[str, str], ...] = ()

    def source(self, name: str) -> str:
        return dict(self.sources).get(name, DEFAULT)

    def values(self) -> dict[str, Any]:
        """Every setting's value (config.toml's [plan], summary.json's ``plan``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "sources"}

    def table(self, columns: int = 2) -> str:
        """The compact table `wai train` prints at start: each setting's value and [source], ``columns`` a line."""
        cells = [f"{k} {v:g} [{self.source(k)}]" if isinstance(v, float) else f"{k} {v} [{self.source(k)}]"
                 for k, v in self.values().items() if v is not None]
        width = max(len(c) for c in cells)
        lines = ["  " + "   ".join(c.ljust(width) for c in cells[i:i + columns]).rstrip()
                 for i in range(0, len(cells), columns)]
        return "run plan (value [source]):\n" + "\n".join(lines)

    def learning_rate_at(self, step: int) -> float:
        """The policy learning rate of step ``step`` (0-based) under ``lr_schedule`` over ``steps``."""
        if self.lr_schedule == "linear":
            return self.learning_rate * (1.0 - step / self.steps)
        return self.learning_rate

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.max_tokens, self.cap_is_answer_length)

    def with_steps(self, steps: int) -> RunPlan:
        """The plan of a resumed run trained longer (``--resume --steps N``): the schedule is the N-step run's."""
        sources = tuple((k, RESUME if k == "steps" else s) for k, s in self.sources)
        return dataclasses.replace(self, steps=steps, sources=sources)

    @classmethod
    def from_saved(cls, values: Mapping[str, Any], sources: Mapping[str, str]) -> RunPlan:
        """The plan a run wrote to config.toml (TOML has no null: a missing optional value is None)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"sources"}
        filled: dict[str, Any] = {n: values.get(n) for n in names}
        return cls(**filled, sources=tuple(sorted(sources.items())))


def saved_plan(path: Path) -> RunPlan | None:
    """The run plan a run wrote to its config.toml, or None (a run written before plans were saved)."""
    data = tomllib.loads(path.read_text())
    if "plan" not in data:
        return None
    return RunPlan.from_saved(data["plan"], data.get("sources", {}))


Rule = Callable[[TrainConfig, Any, Any], tuple[Any, str]]


def _hint(config: TrainConfig, taskset: Any, name: str) -> Any:
    """The taskset's ``Recommended`` value for ``name`` when it applies: a built-in (random-init) model on the
    taskset's own tasks. Rows as pushed take only the warm start from it (its RL settings were measured for
    rollouts)."""
    if taskset is None or config.taskset is None or not config.model.startswith("builtin:"):
        return None
    if config.rows is not None and name not in ("warm_start_steps", "warm_start_learning_rate"):
        return None
    return getattr(getattr(taskset, "recommended", None), name, None)


def steps_rule(config: TrainConfig, method: Any, taskset: Any) -> tuple[Any, str]:
    hint = _hint(config, taskset, "steps")
    return (hint, TASKSET) if hint is not None else (default("steps"), DEFAULT)


def learning_rate_rule(config: TrainConfig, method: Any, taskset: Any) -> tuple[Any, str]:
    """The method's declared rate; else, on a built-in model, the taskset's recommendation or the built-in
    rate; else the LoRA rate under LoRA and the full fine-tuning rate otherwise."""
    declared = method.run_spec().learning_rate if method is not None else None
    if declared is not None:
        return declared, METHOD
    if config.model.startswith("builtin:"):
        hint = _hint(config, taskset, "learning_rate")
        return (hint, TASKSET) if hint is not None else (default("builtin_learning_rate"), MODEL_RULE)
    return default("lora_learning_rate" if config.lora_rank else "full_learning_rate"), MODEL_RULE


def warm_start_steps_rule(config: TrainConfig, method: Any, taskset: Any) -> tuple[Any, str]:
    hint = _hint(config, taskset, "warm_start_steps")
    return (hint, TASKSET) if hint is not None else (0, DEFAULT)


def warm_start_learning_rate_rule(config: TrainConfig, method: Any, taskset: Any) -> tuple[Any, str]:
    hint = _hint(config, taskset, "warm_start_learning_rate")
    return (hint, TASKSET) if hint is not None else (default("warm_start_learning_rate"), DEFAULT)


def lag_rule(config: TrainConfig, method: Any, taskset: Any) -> tuple[Any, str]:
    """0 for rows from a file (no sampler) or a method that trains on rows as pushed, else the default lag."""
    rows = config.rows is not None or (method is not None and method.run_spec().source == "rows")
    return (0, DEFAULT) if rows else (default("lag"), DEFAULT)


def max_tokens_rule(config: TrainConfig, method: Any, taskset: Any) -> tuple[Any, str]:
    """The taskset's cap, else the method's, else the loop's default."""
    if taskset is not None and taskset.max_tokens:
        return taskset.max_tokens, TASKSET
    spec_cap = method.run_spec().max_tokens if method is not None else None
    return (spec_cap, METHOD) if spec_cap else (default("max_tokens"), DEFAULT)


def critic_learning_rate_rule(config: TrainConfig, method: Any, taskset: Any) -> tuple[Any, str]:
    """A critic method's own rate; a scalar head's (RM): the policy rate given, else its default; else none."""
    spec = method.run_spec() if method is not None else None
    if spec is not None and spec.critic is not None:
        return spec.critic.learning_rate, METHOD
    if spec is not None and spec.head == "score":
        return (config.learning_rate, USER) if config.learning_rate else (default("score_head_learning_rate"), DEFAULT)
    return None, DEFAULT


# The rule for each setting a config may leave empty (None). A rule of whileai.loop.rules replaces an entry.
RULES: dict[str, Rule] = {
    "steps": steps_rule, "learning_rate": learning_rate_rule, "warm_start_steps": warm_start_steps_rule,
    "warm_start_learning_rate": warm_start_learning_rate_rule, "lag": lag_rule, "max_tokens": max_tokens_rule,
    "critic_learning_rate": critic_learning_rate_rule,
}


def make_plan(config: TrainConfig, origins: Mapping[str, str], method: Any, taskset: Any) -> RunPlan:
    """Resolve every setting once. ``origins``: where each field the config sets came from (USER or FILE);
    ``method`` None (``--method auto`` before route, or a recipe's method-independent part) leaves the
    method's settings at a one-rollout method's."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, rule in RULES.items():
        given = getattr(config, name)
        if given is not None:
            values[name], sources[name] = given, origins.get(name, USER)
        else:
            values[name], sources[name] = rule(config, method, taskset)
    if taskset is None:
        values["warm_start_steps"], sources["warm_start_steps"] = 0, DEFAULT  # no reference answers to take
    spec = method.run_spec() if method is not None else RunSpec()
    knob_source = f"{METHOD} (--set)" if config.knobs else METHOD
    for name in ("method", "model", "lr_schedule", "warm_start_batch", "rollouts_per_step", "seed", "eval_tasks",
                 "eval_samples", "eval_every", "save_every", "micro_batch_tokens"):
        values[name] = getattr(config, name)
        sources[name] = origins.get(name, DEFAULT)
    values["rollouts_per_prompt"], values["temperature"] = spec.rollouts_per_prompt, spec.temperature
    sources["rollouts_per_prompt"] = sources["temperature"] = knob_source
    task_cap = taskset.max_tokens if taskset is not None else None
    values["cap_is_answer_length"] = config.max_tokens is None and task_cap is not None
    sources["cap_is_answer_length"] = sources["max_tokens"]
    return RunPlan(**values, sources=tuple(sorted(sources.items())))
