"""A paper recipe: a baseline arm and one or more recipe arms, trained on one budget over N seeds, compared.

    result = run_recipe(recipe("flash_reinforce"), seeds=5, lag=4)
    print(result)        # the lesson's table row per recipe arm, and the drift each arm reached

Every arm is one call of ``wai.train`` with the same model, taskset, seed, lag, steps, rollouts per step,
learning rate (pinned once, by the loop's rule without any method's declared rate, so that both arms move at
the same speed), warm start and held-out tasks; only the method and its knobs differ. Same seed means the same
task order and the same sampler seeds at every draw; the rollouts themselves differ as soon as the two
policies do (the first ``lag`` batches are drawn from the same starting weights in both arms).

``knobs`` changes an arm's method knobs before anything trains: ``{"[ARM:]KEY": value}``, where ARM is
``baseline``, ``recipe`` (every recipe arm) or an arm's label slug (its run folder's name, e.g. ``dr-grpo``), and
no ARM means every arm; the more specific target wins (slug over baseline/recipe over every arm). The knobs each
arm ran are in recipe.json and in the report.

The delta is ``wai.compare`` on every seed's held-out rows pooled and tagged by seed: paired over the held-out
tasks, and its verdict needs two or more seeds per arm that separate (``compare``'s vocabulary). The drift is
read from each run's metrics.jsonl, the numbers the method's ``Update.stats`` gave at every step the policy
trained (a critic's warm-up steps are left out: the policy did not move there).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from whileai.errors import ConfigError, WhileaiError
from whileai.evidence.plan import check_folder, precheck, train_or_read
from whileai.loop.controls import _held_out_rows, _seeds
from whileai.loop.types import PASS
from whileai.methods.registry import method as build_method
from whileai.methods.run_spec import RunSpec
from whileai.rows.stats import compare

RECIPE_SEEDS = 5  # seeds per arm by default: the issue's >= 5; compare needs >= 2 to show anything
# the drift a run reached: metrics.jsonl key -> (label, how it is pooled over steps and seeds)
DRIFT_KEYS: tuple[tuple[str, str, str], ...] = (
    ("drift", "drift", "mean"),
    ("drift", "drift max", "max"),
    ("mean_ratio", "mean ratio", "mean"),
    ("admitted_share", "admitted share", "mean"),
    ("method/masked_token_share", "tokens masked", "mean"),
    ("method/clipped_token_share", "tokens clipped", "mean"),
    ("reply_tokens", "reply tokens", "mean"),
    ("failed_reply_tokens", "failed reply tokens", "mean"),
)


@dataclass(frozen=True)
class Arm:
    """One side of a recipe: a method by name and its knobs."""

    label: str
    """the arm's name in the table ('uncorrected stale REINFORCE')"""
    method: str
    """a name ``wai.method`` accepts"""
    knobs: Mapping[str, Any] = field(default_factory=dict)
    """the method's knobs for this arm (``wai.method(method, **knobs)``)"""
    seed_offset: int = 0
    """the arm trains at seed + seed_offset and its rows still pair with the baseline's at seed (a null control:
    two identical arms whose runs differ only in their seed); 0 for a real recipe, whose pairs share warm start,
    task order and sampler seeds"""


@dataclass(frozen=True)
class ArmContext:
    """What a recipe's arms may follow, resolved once for the run before any arm is built."""

    lag: int
    """the sampler lag in optimizer steps every arm trains at"""
    max_tokens: int | None
    """the run's generation cap: the config's max_tokens, else the taskset's; None when neither sets one (each
    arm then samples up to its own method's max_tokens, the loop's rule)"""


ARM_GROUPS = ("baseline", "recipe")  # the --set targets besides an arm's slug; no arm may be named so


@dataclass(frozen=True)
class Recipe:
    """A paper's claim as a run: a baseline arm and the recipe arm(s) it is compared with."""

    name: str
    """the recipe's name (``wai recipe NAME``)"""
    claim: str
    """one sentence: what the paper claims and what the arms test"""
    arms: Callable[[ArmContext], tuple[Arm, ...]]
    """the arms for a run: the baseline first, then each recipe arm (a knob such as off_policy_steps may follow
    the lag, dr_grpo's max_tokens the generation cap)"""
    builtin_settings: Mapping[str, Any] = field(default_factory=dict)
    """``wai.train`` settings applied on a built-in (random-init) model when not given, e.g. a critic rate the
    papers' billion-parameter values would leave frozen"""
    regime: Mapping[str, Any] = field(default_factory=dict)
    """``wai.train`` settings the recipe runs at on any model when not given (the paper recipes: REGIME, a task
    with headroom at a lag where the corrections engage); empty: the loop's defaults"""


@dataclass
class RecipeResult:
    """The runs of every arm (one per seed), ``compare`` of each recipe arm with the baseline, the drift."""

    dir: Path
    recipe: str
    seeds: tuple[int, ...]
    settings: dict[str, Any]
    """the settings every arm shared (pinned learning rate, lag, steps, model, ...)"""
    arms: tuple[Arm, ...]
    runs: dict[str, list[Any]]
    """arm label -> its ``Run`` per seed"""
    comparisons: list[Any]
    """``compare(baseline, arm)`` per recipe arm, in order"""
    drift: dict[str, dict[str, float]]
    """arm label -> what its runs reached (DRIFT_KEYS' labels)"""
    seconds: float
    knobs: dict[str, Any] = field(default_factory=dict)
    """the knobs the user set (``{"[ARM:]KEY": value}``), already merged into ``arms``"""
    warnings: list[str] = field(default_factory=list)
    """lines the report prints before the table, e.g. two arms that run the same method and knobs"""

    def scores(self, label: str) -> list[float]:
        """The arm's held-out pass@1 per seed, in seed order."""
        return [float(run.summary["eval_after"]["pass_at_1"]) for run in self.runs[label]]

    def to_dict(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "seeds": list(self.seeds), "settings": self.settings,
                "arms": [{"label": a.label, "method": a.method, "knobs": dict(a.knobs)} for a in self.arms],
                "runs": {label: [str(r.dir) for r in runs] for label, runs in self.runs.items()},
                "knobs_set": dict(self.knobs), "warnings": list(self.warnings),
                "rows": [c.to_dict() for c in self.comparisons], "drift": self.drift,
                "seconds": round(self.seconds, 1), "report": str(self)}

    def __str__(self) -> str:
        from whileai.rows.stats import TABLE_HEADER, format_table

        n = len(self.seeds)
        lines = [f"recipe {self.recipe}: {n} seed{'s' if n != 1 else ''} per arm ({', '.join(map(str, self.seeds))}); "
                 f"lag {self.settings['lag']}, {self.settings['steps']} steps, learning rate "
                 f"{self.settings['learning_rate']:g}, model {self.settings['model']}, taskset "
                 f"{self.settings['taskset']}; held-out pass@1; Delta (tasks): paired over tasks, seeds pooled; "
                 "Delta (seeds paired): over per-seed deltas, the verdict's",
                 *self.warnings,
                 format_table([TABLE_HEADER, *(c.row() for c in self.comparisons)])]
        lines += [f"{c.treatment_name}: {c.verdict}: {c.reason}" for c in self.comparisons]
        knobs_set = ", ".join(f"{k}={json.dumps(v)}" for k, v in self.knobs.items())
        lines.append("arms as run (method and knobs" + (f"; knobs set: {knobs_set})" if knobs_set else ")") + ":")
        lines += describe_arms(self.arms)
        if self.settings.get("critic_learning_rate") is not None:
            lines.append(f"  critic learning rate {self.settings['critic_learning_rate']:g} for every critic arm (a "
                         "shared setting: it overrides an arm's own critic rate knob)")
        lines.append("held-out pass@1 per seed (seeds in order):")
        for arm in self.arms:
            lines.append(f"  {arm.label}: " + " ".join(f"{score:.3f}" for score in self.scores(arm.label)))
        base = self.scores(self.arms[0].label)
        for arm in self.arms[1:]:
            lines.append(f"  {arm.label} minus {self.arms[0].label}, per seed: "
                         + " ".join(f"{t - b:+.3f}" for t, b in zip(self.scores(arm.label), base)))
        lines.append("drift reached (policy steps of every seed; mean unless marked max):")
        for arm in self.arms:
            lines.append(f"  {arm.label}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in self.drift[arm.label].items()))
        lines.append(f"{self.seconds:.0f} s; runs and this report: {self.dir}")
        return "\n".join(lines)


def _paired(runs: Sequence[Any], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Every run's held-out rows, each tagged with its pair's seed (the recipe's seed, whatever the arm's offset):
    ``compare`` pairs the arms by that tag."""
    return [{"task_id": r["task_id"], "reward": r["reward"], "seed": str(seed)}
            for run, seed in zip(runs, seeds) for r in _held_out_rows(run)]


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e-2 and value != 0 else f"{value:.3f}"


def describe_arms(arms: Sequence[Arm]) -> list[str]:
    """One line per arm: its role, label, slug (the --set target and run folder) and what it runs."""
    return [f"  {'baseline' if i == 0 else 'recipe arm'}: {arm.label} [{_slug(arm.label)}] "
            f"({arm.method} {json.dumps(dict(arm.knobs))})" + (f", at seed + {arm.seed_offset}" if arm.seed_offset else "")
            for i, arm in enumerate(arms)]


def run_recipe(recipe: Recipe, *, seeds: int | Sequence[int] = RECIPE_SEEDS, progress: bool = False,
               knobs: Mapping[str, Any] | None = None, **train: Any) -> RecipeResult:
    """Train every arm of ``recipe`` at every seed on one budget; compare each recipe arm with the baseline.

    ``train`` holds ``wai.train``'s settings shared by every arm (model, taskset, lag, steps, learning_rate,
    rollouts_per_step, eval_tasks, device, ...; not method, seed or resume). ``seeds``: how many seeds
    per arm, counted up from ``train['seed']`` (default 0), or the seeds themselves. ``knobs``:
    ``{"[ARM:]KEY": value}`` (the module docstring). Writes
    RUN_DIR/LABEL-seedS/ per run and recipe.json, recipe.txt under ``run_dir`` (default
    runs/recipe-NAME-TIME)."""
    began = time.perf_counter()
    seed_list = _seeds(seeds, train.pop("seed", 0))
    _check_train(train)
    base = check_folder(Path(train.pop("run_dir", None) or f"runs/recipe-{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}"))
    shared, _, arms, warnings = check_recipe(recipe, knobs, **train, seed=seed_list[0])
    plan = [(arm, {**shared, "method": arm.method, "knobs": dict(arm.knobs), "seed": seed + arm.seed_offset,
                   "progress": progress, "run_dir": str(base / f"{_slug(arm.label)}-seed{seed + arm.seed_offset}")})
            for seed in seed_list for arm in arms]
    for line in warnings:
        print(line)
    runs: dict[str, list[Any]] = {arm.label: [] for arm in arms}
    for arm, settings in plan:
        run, _ = train_or_read(settings)
        _held_out_rows(run)
        runs[arm.label].append(run)
    _same_budget(runs, arms)
    baseline = arms[0]
    comparisons = [compare(_paired(runs[baseline.label], seed_list), _paired(runs[arm.label], seed_list), threshold=PASS,
                               name=recipe.name, baseline_name=baseline.label, treatment_name=arm.label)
                   for arm in arms[1:]]
    drift = {arm.label: drift_reached(runs[arm.label]) for arm in arms}
    settings = {k: v for k, v in shared.items() if k not in ("export",)}
    result = RecipeResult(base, recipe.name, tuple(seed_list), settings, arms, runs, comparisons, drift,
                          time.perf_counter() - began, dict(knobs or {}), warnings)
    (base / "recipe.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    (base / "recipe.txt").write_text(str(result) + "\n")
    return result


def check_recipe(recipe: Recipe, knobs: Mapping[str, Any] | None = None,
                 **train: Any) -> tuple[dict[str, Any], ArmContext, tuple[Arm, ...], list[str]]:
    """Everything ``run_recipe`` checks before it trains, without training: the shared settings resolved once,
    what the arms follow, the arms with ``knobs`` merged in, the loop's checks of every arm's run (all problems
    at once), and the warnings (two arms that run the same thing). ``wai recipe --list`` prints this."""
    seed = train.pop("seed", 0)
    shared, context = _resolved(recipe, train)
    arms = recipe_arms(recipe, context, knobs or {})
    _shared_run_settings(recipe, context, arms, knobs or {}, shared)
    plans = [{**shared, "method": arm.method, "knobs": dict(arm.knobs), "seed": seed} for arm in arms]
    names = {id(settings): f"arm {_slug(arm.label)!r}" for arm, settings in zip(arms, plans)}
    precheck(plans, label=lambda settings: names[id(settings)])
    return shared, context, arms, _same_arms(arms)


def _shared_run_settings(recipe: Recipe, context: ArmContext, arms: Sequence[Arm], knobs: Mapping[str, Any],
                         shared: Mapping[str, Any]) -> None:
    """Refuse, before anything trains, knobs that would make the arms differ in more than the method: another
    sampling temperature (the arms would not draw from the same distribution), or an arm's own critic rate
    where the run's shared critic_learning_rate overrides it (the knob would be shown but not used)."""
    specs = {arm.label: build_method(arm.method, **arm.knobs).run_spec() for arm in arms}
    temperatures = {label: spec.temperature for label, spec in specs.items()}
    if len(set(temperatures.values())) > 1:
        raise ConfigError(f"the arms would sample at different temperatures {temperatures}: a recipe compares methods "
                          "on rollouts from the same distribution; set temperature for every arm "
                          "(--set temperature=T, no ARM:)")
    if shared.get("critic_learning_rate") is None:
        return
    rates = {label: _critic_rate(spec) for label, spec in specs.items()}
    plain = {a.label: _critic_rate(build_method(a.method, **a.knobs).run_spec())
             for a in recipe_arms(recipe, context, {})}
    moved = [label for label, rate in rates.items() if None not in (rate, plain[label]) and rate != plain[label]]
    if moved:
        raise ConfigError(f"--set changes the critic rate of {', '.join(map(repr, moved))}, but the run's "
                          f"critic_learning_rate {shared['critic_learning_rate']:g} is shared by every critic arm and "
                          "overrides it; give --critic-learning-rate instead")


def _critic_rate(spec: RunSpec) -> float | None:
    """The critic's own learning rate, or None for a method without a critic."""
    return spec.critic.learning_rate if spec.critic is not None else None


def drift_reached(runs: Sequence[Any]) -> dict[str, float]:
    """What the runs' methods saw, from metrics.jsonl: each DRIFT_KEYS entry over every step where the policy
    trained, of every run (mean, or max), for the keys the metrics hold."""
    records = [r for run in runs for r in run.metrics() if r.get("policy_trained", True)]
    out: dict[str, float] = {}
    for key, label, how in DRIFT_KEYS:
        values = [float(r[key]) for r in records if key in r and math.isfinite(float(r[key]))]
        if values:
            out[label] = max(values) if how == "max" else sum(values) / len(values)
    return out


def _check_train(train: Mapping[str, Any]) -> None:
    taken = sorted(set(train) & {"method", "knobs", "resume", "rows", "config", "config_file"})
    if taken:
        raise ConfigError(f"a recipe sets the method and knobs of each arm and trains on a taskset; "
                          f"{', '.join(taken)} cannot be given (got {taken})")
    if train.get("eval_tasks") == 0:
        raise ConfigError("eval_tasks = 0: a recipe compares the arms on held-out pass@1; give eval_tasks >= 1")


def recipe_arms(recipe: Recipe, context: ArmContext, knobs: Mapping[str, Any]) -> tuple[Arm, ...]:
    """The recipe's arms for ``context`` with ``knobs`` merged in, every arm's method built (so every knob is
    checked) before anything trains; a ConfigError names the arm."""
    arms = recipe.arms(context)
    _check_arms(arms)
    arms = with_knobs(arms, knobs, recipe.name)
    for arm in arms:
        try:
            build_method(arm.method, **arm.knobs)
        except ConfigError as e:
            raise ConfigError(f"arm {_slug(arm.label)!r} ({arm.label}) of recipe {recipe.name}: {e}") from e
    return arms


def with_knobs(arms: Sequence[Arm], knobs: Mapping[str, Any],
               recipe: str = "this recipe") -> tuple[Arm, ...]:
    """``arms`` with ``{"[ARM:]KEY": value}`` merged into their knobs. ARM: ``baseline``, ``recipe`` (every arm
    after the first) or an arm's slug; none: every arm. A slug beats baseline/recipe, which beat no ARM."""
    targets: dict[str, Sequence[Arm]] = {"baseline": arms[:1], "recipe": arms[1:],
                                         **{_slug(a.label): (a,) for a in arms}}
    added: dict[str, dict[str, Any]] = {a.label: {} for a in arms}
    if not isinstance(knobs, Mapping) or not all(isinstance(k, str) for k in knobs):
        raise ConfigError(f"knobs={knobs!r}: give a mapping of '[ARM:]KEY' strings to values, e.g. "
                          "{'recipe:trust': 0.01}")
    nested = [k for k in knobs if k in targets and isinstance(knobs[k], Mapping)]
    if nested:
        raise ConfigError(f"knobs[{nested[0]!r}] is a mapping; knobs are flat: write "
                          f"{{'{nested[0]}:KEY': value}}, e.g. {{'{nested[0]}:trust': 0.01}}")

    def specificity(key: str) -> int:
        target = key.rpartition(":")[0]
        return 0 if not target else 1 if target in ARM_GROUPS else 2

    for key in sorted(knobs, key=specificity):
        target, sep, name = key.rpartition(":")
        if not name:
            raise ConfigError(f"knob {key!r}: no knob name after the arm; write [ARM:]KEY=VALUE, "
                              "e.g. recipe:trust=0.01")
        if sep and target not in targets:
            raise ConfigError(f"knob {key!r}: no arm {target!r} in recipe {recipe}; ARM is one of "
                              f"{', '.join(targets)} (or none, for every arm)")
        for arm in targets[target] if sep else arms:
            added[arm.label][name] = knobs[key]
    return tuple(replace(a, knobs={**a.knobs, **added[a.label]}) for a in arms)


def _same_arms(arms: Sequence[Arm]) -> list[str]:
    """A warning per pair of arms that build the same method with the same knobs (a sanity check, not an error:
    their delta is 0 by construction)."""
    built = [build_method(a.method, **a.knobs) for a in arms]
    return [f"warning: arms {a.label!r} and {b.label!r} run the same method with the same knobs; their delta is "
            "0 by construction (a sanity check, not a comparison)"
            for i, a in enumerate(arms) for j, b in enumerate(arms)
            if i < j and built[i] == built[j] and a.seed_offset == b.seed_offset]


def _check_arms(arms: Sequence[Arm]) -> None:
    labels = [a.label for a in arms]
    if len(arms) < 2:
        raise ConfigError(f"a recipe needs a baseline arm and at least one recipe arm, got {labels}")
    if len(set(map(_slug, labels))) != len(labels):
        raise ConfigError(f"the arms' labels {labels} must differ (they name the run folders)")
    reserved = [label for label in labels if _slug(label) in ARM_GROUPS]
    if reserved:
        raise ConfigError(f"arm label {reserved[0]!r}: {', '.join(ARM_GROUPS)} name groups of arms for --set; "
                          "label the arm otherwise")


def _pinned(recipe: Recipe, train: Mapping[str, Any]) -> dict[str, Any]:
    """The shared settings with every method-independent value resolved once (``_resolved``'s first half)."""
    return _resolved(recipe, train)[0]


def _resolved(recipe: Recipe, train: Mapping[str, Any]) -> tuple[dict[str, Any], ArmContext]:
    """The shared settings with every method-independent value resolved once, by the loop's rules: steps,
    warm start, lag, and the learning rate without any method's declared rate; and what the arms follow: the
    lag and the generation cap (the config's max_tokens, else the taskset's, as the loop samples)."""
    from whileai.envs import load_taskset
    from whileai.loop.plan import config as config_io
    from whileai.loop.plan.run_plan import make_plan

    shared = {**recipe.regime, **train}
    if str(shared.get("model", "builtin:tiny")).startswith("builtin:"):
        shared = {**recipe.builtin_settings, **shared}
    config = config_io.build(None, **shared)
    problems = config_io.check_ranges(config)
    if problems:
        raise ConfigError(config_io._listing(problems))
    taskset = load_taskset(config.taskset, **config.taskset_options) if config.taskset is not None else None
    if taskset is None:
        raise ConfigError("a recipe compares the arms on a taskset's held-out tasks: give a taskset")
    resolved = make_plan(config, {}, None, taskset)
    shared.update(steps=resolved.steps, lag=resolved.lag, learning_rate=resolved.learning_rate,
                  warm_start_steps=resolved.warm_start_steps,
                  warm_start_learning_rate=resolved.warm_start_learning_rate)
    shared.setdefault("model", config.model)
    shared.setdefault("taskset", config.taskset)
    shared.setdefault("export", False)  # the arms' weights are not what a recipe is for
    return shared, ArmContext(int(resolved.lag), config.max_tokens or taskset.max_tokens)


def _same_budget(runs: Mapping[str, Sequence[Any]], arms: Sequence[Arm]) -> None:
    """Every arm trained as long, as fast and on the same model, tasks and seeds as the baseline (a guard: a
    difference here is a bug, not something a user can trip)."""
    keys = ("steps", "rollouts_per_step", "model", "lag", "lora_rank", "eval_tasks", "eval_samples",
            "taskset", "device")
    first = runs[arms[0].label]
    for arm in arms[1:]:
        for a, b in zip(first, runs[arm.label]):
            differ = {k: (getattr(a.config, k), getattr(b.config, k)) for k in keys
                      if getattr(a.config, k) != getattr(b.config, k)}
            if b.config.seed - a.config.seed != arm.seed_offset - arms[0].seed_offset:
                differ["seed"] = (a.config.seed, b.config.seed)
            left = {k: v for k, v in a.summary["resolved"].items() if k != "critic_learning_rate"}
            right = {k: v for k, v in b.summary["resolved"].items() if k != "critic_learning_rate"}
            if left != right:
                differ["resolved"] = (left, right)
            if differ:
                raise WhileaiError(f"arm {arm.label!r} ran on another budget than the baseline (baseline, arm): "
                                   f"{differ}")


def _slug(label: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in label.lower()).strip("-")
