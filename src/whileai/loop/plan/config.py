"""``TrainConfig``: every setting of a training run, its one-line doc, and the checks made before any model loads.

A config comes from defaults, then a TOML file (``--config``), then flags / keyword arguments, in that order.
``check(config)`` lists every problem at once (unknown key, wrong type, an impossible combination) as one
``ConfigError``, each with the key and a fix. The defaults are the embedded default run (``wai train`` with
no arguments): a built-in model and task on a CPU, one rollout per prompt, a sampler lagging two steps.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import math
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whileai.activation_checkpointing import KNOB as CHECKPOINTING
from whileai.errors import ConfigError
from whileai.trainers.open import SERVERS

if TYPE_CHECKING:  # the plan is resolved from the config; the config only writes it out
    from whileai.loop.plan.run_plan import RunPlan

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


@dataclass
class TrainConfig:
    """A training run. Every field can be set in the TOML file or overridden by a flag of the same name."""

    method: str = "flash_reinforce"
    """a method name (`wai methods`), or 'auto': route picks one from a probe of rollouts and says why"""
    knobs: dict[str, Any] = field(default_factory=dict)
    """overrides of the method's knobs, e.g. {trust = 0.01} (flag: --set trust=0.01)"""
    model: str = "builtin:tiny"
    """builtin:tiny|mini|small, a local Hugging Face model directory, or a hub id (needs the hub)"""
    taskset: str | None = "builtin:case"
    """where prompts and graders come from: builtin:NAME, a .jsonl file, hf:NAME_OR_PATH, reasoning_gym:NAME"""
    taskset_options: dict[str, Any] = field(default_factory=dict)
    """options for the taskset, e.g. {grader = "numeric"} (flag: --taskset-option grader=numeric)"""
    rows: str | None = None
    """a JSONL file of rows to train on as pushed (SFT, DPO, RM) or of logged traces for an RL method (the
    library's rows, an OpenAI-compatible server's log, or text rows: docs/traces.md); route reads it first"""
    rows_from: str | None = None
    """a `wai record` URL: train continuously on its traces as they are scored (each once, in score order), and
    push each new weights to --sampler-url, the server its traffic goes to (docs/record.md)"""
    eval_taskset: str | None = None
    """with --rows: a taskset (same spec forms as taskset) whose test split measures pass@1 before and after;
    None: a traces run holds out a slice of its traces and reports their surrogate and drift, not pass@1"""
    teacher: str | None = None
    """the teacher model of a method that distills from one (OPD): builtin:NAME or a model directory with the
    student's tokenizer (e.g. an earlier run's RUN_DIR/final); loaded once, frozen"""
    steps: int | None = None
    """optimizer steps of the policy; None: the taskset's recommendation for a built-in model (builtin:lookup: 60),
    else 40"""
    rollouts_per_step: int = 32
    """trajectories per step; prompts per step = rollouts_per_step // the method's rollouts per prompt"""
    lag: int | None = None
    """the batch trained at step t was sampled with the weights of step t - lag (0 = on-policy); None: 2 for a
    method that learns from rollouts (a lagging sampler, as production has), 0 for rows from a file (no sampler)"""
    learning_rate: float | None = None
    """policy learning rate; None: the method's declared one, else on a built-in model (random init) a built-in
    taskset's recommendation or 1e-2, 1e-3 after the rule's warm start on a taskset of your own; on a loaded
    model a rate by its size and LoRA (whileai.loop.plan.rules.learning_rate; the table at start says which)"""
    lr_schedule: str = "linear"
    """'linear': the learning rate falls linearly to 0 at the last step (TRL's default); 'constant': it stays"""
    critic_learning_rate: float | None = None
    """value head learning rate for critic methods; None: the method's declared one"""
    lora_rank: int = 0
    """0 trains every weight; > 0 trains LoRA adapters of that rank"""
    device: str = "cpu"
    """cpu or cuda"""
    activation_checkpointing: str = CHECKPOINTING.value
    """'on', 'off' or 'auto': keep only each decoder layer's input in the backward and recompute the rest (less
    memory, about a third more compute, the same gradients); auto: on for a model of at least 1B parameters on a
    GPU, off on a CPU and for smaller models (the plan prints which and why)"""
    threads: int | None = None
    """torch CPU threads of the run; None: $OMP_NUM_THREADS when set, else the cores this process may use less the
    1-minute load average (at least 1, at most 8), so a shared machine is not oversubscribed (the plan prints which)"""
    seed: int = 0
    """seeds the model (built-ins), the task order, sampling and the held-out evaluation"""
    max_tokens: int | None = None
    """generation cap per rollout; None: the taskset's, else the method's"""
    warm_start_steps: int | None = None
    """supervised steps on the taskset's reference answers (Task.answer as text) before RL; None: a built-in
    taskset's recommendation for a built-in model (builtin:case, reverse, add: 14; copy: 60; lookup: 200); a taskset
    of your own on a random-init model whose every train task has an answer: the rule's 1200 (the plan prints
    why); else 0"""
    warm_start_batch: int = 16
    """reference answers per supervised warm-start step"""
    warm_start_learning_rate: float | None = None
    """learning rate of the supervised warm start; None: a built-in taskset's recommendation (builtin:lookup:
    3e-3); on a taskset of your own the rule's, 1e-2 for at most 100 steps and 3e-3 for more; else 1e-2. A warm
    start of more than 100 steps falls linearly from it to 0 over its steps"""
    eval_tasks: int = 64
    """held-out tasks scored before and after training (and every eval_every steps)"""
    eval_samples: int = 4
    """samples per held-out task, at the method's temperature"""
    eval_every: int = 0
    """also evaluate every this many steps (0 = only before and after)"""
    save_every: int = 20
    """write a checkpoint every this many steps (and at the end, and on Ctrl-C)"""
    micro_batch_tokens: int = 8192
    """padded tokens per forward pass: peak memory follows this, not the batch; never changes a gradient"""
    run_dir: str | None = None
    """where the run is written; None: runs/<method>-<time>"""
    export: bool = True
    """write the final weights (a PEFT adapter under LoRA, else a merged model) to RUN_DIR/final"""
    progress: bool = True
    """show a progress bar with live reward, pass rate, drift and admitted share"""
    force: bool = False
    """train even when the preflight finds nothing to learn from in the first rollouts (it stops the run, with the
    reasons and the fixes, otherwise)"""
    url: str | None = None
    """train on the server at this address instead of in-process: a `wai serve` (its bearer token: --token or
    $WAI_TOKEN; it may itself run on a Tinker-API server, wai serve --tinker-url), or with --api tinker any
    Tinker-API server"""
    api: str = "wai"
    """with url: 'wai' (a wai serve's own API: every method) or 'tinker' (any Tinker-API server through the Tinker
    SDK: Tinker, SkyRL's, a wai serve's Tinker front; its key: --token or $TINKER_API_KEY)"""
    sampler_url: str | None = None
    """sample rollouts from the OpenAI-compatible inference server at this address (vLLM, SGLang, `wai policy`)
    ahead of the trainer, within the lag, pushing the weights to it (docs/train.md, 'Sampling from an inference
    server'); None: the trainer samples in-process"""
    sync_every: int | None = None
    """with sampler_url: push the weights to the server after every this many optimizer steps (at most lag + 1);
    None: 1"""


# Fields whose value may be None, and the type they have otherwise.
_OPTIONAL = {"taskset": str, "rows": str, "rows_from": str, "eval_taskset": str, "teacher": str, "learning_rate": float, "critic_learning_rate": float, "max_tokens": int,
             "run_dir": str, "url": str, "sampler_url": str, "sync_every": int, "threads": int, "warm_start_steps": int, "lag": int, "steps": int, "warm_start_learning_rate": float}
_AT_LEAST = {"steps": 1, "rollouts_per_step": 1, "lag": 0, "lora_rank": 0, "seed": 0, "warm_start_steps": 0,
             "warm_start_batch": 1, "eval_tasks": 0, "eval_samples": 1, "eval_every": 0, "save_every": 1,
             "micro_batch_tokens": 16, "max_tokens": 1, "sync_every": 1, "threads": 1}


def field_docs() -> dict[str, str]:
    """The doc string under each field above, for --help and the docs."""
    body = ast.parse(textwrap.dedent(inspect.getsource(TrainConfig))).body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr) \
                and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str):
            docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def _type_of(name: str) -> type:
    if name in _OPTIONAL:
        return _OPTIONAL[name]
    default = TrainConfig.__dataclass_fields__[name]
    if default.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return dict
    return type(default.default)


def _type_problem(name: str, value: object) -> str | None:
    if value is None and name in _OPTIONAL:
        return None
    want = _type_of(name)
    ok = isinstance(value, want) and not (want is not bool and isinstance(value, bool))
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if ok:
        return None
    return f"{name} = {value!r} is {_KIND.get(type(value).__name__, 'a ' + type(value).__name__)}; it must be " \
        f"{_KIND.get(want.__name__, 'a ' + want.__name__)}" + (" or left out (None)" if name in _OPTIONAL else "")


_KIND = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false", "dict": "a table",
         "list": "a list", "NoneType": "empty"}


def from_mapping(values: Mapping[str, Any], where: str) -> tuple[dict[str, Any], list[str]]:
    """The known keys of ``values`` with their problems (unknown key, wrong type); nothing is dropped silently."""
    known = TrainConfig.__dataclass_fields__
    good: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in known:
            import difflib

            near = difflib.get_close_matches(name, list(known), n=1)
            problems.append(f"{where}: unknown key {key!r}" + (f"; did you mean {near[0]!r}?" if near else "")
                            + f" (valid keys: {', '.join(known)})")
            continue
        problem = _type_problem(name, value)
        if problem:
            problems.append(f"{where}: {problem}")
            continue
        good[name] = float(value) if _type_of(name) is float and value is not None else value
    return good, problems


def load_toml(path: str) -> dict[str, Any]:
    """The table in a TOML config file (``[train]`` or the top level)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--config {path!r}: no such file; give the path of a TOML file (docs/train.md shows one)")
    try:
        data = tomllib.loads(file.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"--config {path!r} is not valid TOML: {err}") from None
    if "train" not in data:
        return dict(data)
    outside = sorted(k for k in data if k not in ("train", *PLAN_TABLES))
    if outside or not isinstance(data["train"], Mapping):
        raise ConfigError(f"--config {path!r} has a [train] table and also top-level keys {outside}; put every "
                          "setting in one place (all under [train], or none of them)")
    return dict(data["train"])


def build(toml_path: str | None = None, **overrides: object) -> TrainConfig:
    """Defaults, then the TOML file, then ``overrides``; every problem reported at once (nothing loads)."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    if toml_path is not None:
        good, bad = from_mapping(load_toml(toml_path), toml_path)
        values.update(good)
        problems += bad
    good, bad = from_mapping(overrides, "setting")
    for key in ("knobs", "taskset_options"):  # tables merge, key by key
        if key in good and key in values:
            good[key] = {**values[key], **good[key]}
    values.update(good)
    problems += bad
    if problems:
        raise ConfigError(_listing(problems))
    return TrainConfig(**values)


def _listing(problems: list[str]) -> str:
    head = f"{len(problems)} problem{'s' if len(problems) != 1 else ''} in the training config:"
    return head + "".join(f"\n  - {p}" for p in problems)


def check_ranges(config: TrainConfig) -> list[str]:
    """Per-field rules (no method, no taskset needed)."""
    problems = []
    for name in TrainConfig.__dataclass_fields__:
        value = getattr(config, name)
        problem = _type_problem(name, value)
        if problem:
            problems.append(problem)
            continue
        low = _AT_LEAST.get(name)
        if low is not None and value is not None and value < low:
            problems.append(f"{name} = {value!r} must be >= {low}")
    for name in ("learning_rate", "critic_learning_rate", "warm_start_learning_rate"):
        value = getattr(config, name)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            problems.append(f"{name} = {value!r} must be a finite number > 0")
        elif value is not None and value > MAX_LEARNING_RATE:
            meant = f" (did you mean {value:g}e-3?)" if value < 1000 else ""
            problems.append(f"{name} = {value!r} is above {MAX_LEARNING_RATE:g}: Adam would move every weight by about "
                            f"that much each step and the model diverges at once; rates are 1e-5 .. 1e-2{meant}")
    for name in ("steps", "warm_start_steps"):
        value = getattr(config, name)
        if isinstance(value, int) and value > MAX_STEPS:
            problems.append(f"{name} = {value:,} is above {MAX_STEPS:,}: years on a CPU, and each step's record is "
                            "kept; train in runs of at most that many (--resume --steps N continues one)")
    if config.lr_schedule not in SCHEDULES:
        problems.append(f"lr_schedule = {config.lr_schedule!r} must be one of {', '.join(map(repr, SCHEDULES))}")
    if config.api not in APIS:
        problems.append(f"api = {config.api!r} must be one of {', '.join(map(repr, APIS))} (with --url)")
    elif config.api != "wai" and config.url is None:
        problems.append(f"api = {config.api!r} names the API of a server, and no --url is given: add --url URL, "
                        "or drop --api to train in-process")
    if (rule := CHECKPOINTING.check(config.activation_checkpointing)) is not None:
        problems.append(f"activation_checkpointing = {config.activation_checkpointing!r} must be {rule}")
    elif config.url is not None and config.activation_checkpointing != "auto":
        problems.append(f"activation_checkpointing = {config.activation_checkpointing!r} applies to the in-process "
                        "trainer; a run with --url trains on the server's settings: drop it")
    if config.device not in ("cpu", "cuda") and not str(config.device).startswith("cuda:"):
        problems.append(f"device = {config.device!r} must be 'cpu' or 'cuda' (or 'cuda:N')")
    if config.taskset is None and config.rows is None and config.rows_from is None:
        problems.append("neither taskset nor rows is set: give --taskset (prompts + a grader) or --rows (a JSONL "
                        "file of rows to train on)")
    return problems


SCHEDULES = ("linear", "constant")
PYTHON_TASKSET = "<taskset passed in Python>"
"""config.taskset of a run given a Taskset object: a config file cannot hold it; a resume hands it back"""
MAX_LEARNING_RATE = 1.0
"""the largest learning rate a config may hold (a rate above it diverges at the first Adam step)"""
MAX_STEPS = 10_000_000
"""the most RL or warm-start steps a config may ask for"""
APIS = tuple(SERVERS)
"""what answers at --url: a wai serve's own API, or the Tinker API (through the Tinker SDK): whileai.trainers"""


def as_dict(config: TrainConfig) -> dict[str, Any]:
    """Plain values, for config.json and summaries."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def to_toml(config: TrainConfig, plan: RunPlan | None = None) -> str:
    """RUN_DIR/config.toml: the config as given (``[train]``), and the run plan every value was resolved to
    (``[plan]``, ``[sources]``: the value and the source of every setting). ``None`` values are left out (TOML
    has no null)."""
    import tomli_w

    tables: dict[str, Any] = {"train": {k: v for k, v in as_dict(config).items() if v is not None}}
    if plan is not None:
        tables["plan"] = {k: v for k, v in plan.values().items() if v is not None}
        tables["sources"] = dict(plan.sources)
    return tomli_w.dumps(tables)


PLAN_TABLES = ("plan", "sources")  # a run's record in its config.toml; a config read from it ignores them

