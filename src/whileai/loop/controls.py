"""The guide's controls: train the real arm and its random controls on one budget, then ``compare`` them.

    report = wai.train_with_controls(["random-reward"], method="grpo", taskset="builtin:case", seeds=[0, 1])
    print(report)        # the real arm against each control: paired delta of held-out pass@1 and a verdict

* ``random-reward``: the same run, except that every training rollout's reward is replaced by one drawn at
  random from the rewards the run's own training rollouts earned so far (the real grader still scores each
  rollout, so the draws keep the reward's distribution but carry nothing about the completion). Held-out
  tasks are graded truthfully. Training on rows instead of a taskset: the rows' rewards are permuted.
* ``random-selection``: for rows chosen by a selection (``wai select`` / ``wai.select``): the same run on a
  random subset of the pool they were chosen from, as many rows as the selection kept.

Every arm is one call of ``wai.train`` with the same steps, model, rollouts and seed; the settings the real
arm resolved for itself (learning rate, lag, warm start) are passed to the controls so that nothing differs
but the reward or the rows. "If the method doesn't beat its own random control, the selection or the reward
was the problem, not the optimizer" (the pick-a-method guide, section 7).
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whileai.envs import load_taskset
from whileai.errors import ConfigError, WhileaiError
from whileai.loop.plan import config as config_io
from whileai.loop.run import train as train_run
from whileai.loop.types import PASS
from whileai.rows.io import load_rows
from whileai.rows.stats import GAIN, LOSS, TABLE_HEADER, compare, format_table

if TYPE_CHECKING:
    from whileai.envs.core import Task, Taskset
    from whileai.loop.run import Run
    from whileai.rows.stats import Comparison

RowsSource = str | Path | Sequence[Mapping[str, Any]]
"""rows given to a control: a JSONL path or a list of row dicts"""
CONTROLS: tuple[str, ...] = ("random-reward", "random-selection")
CONTROL_SEEDS = 5  # training seeds per arm; at 2 the seed-paired t-interval (1 dof) rarely shows a real gain
REWARD_MEMORY = 256  # how many recent training rewards a random reward is drawn from
PINNED = ("learning_rate", "lag", "warm_start_steps")  # resolved by the real arm, passed to every control


class RandomRewardTaskset:
    """A taskset whose training rewards are random draws from the rewards its training rollouts earned so far;
    a held-out (test split) task is graded by the real grader. Everything else is the wrapped taskset's."""

    def __init__(self, taskset: Taskset, seed: int, memory: int = REWARD_MEMORY) -> None:
        self.taskset = taskset
        self.name = f"{taskset.name} (random reward)"
        self._held_out = {t.task_id for t in taskset.split("test")}
        self._rng = random.Random(seed)
        self._earned: deque[float] = deque(maxlen=memory)

    @property
    def wrapped(self) -> Taskset:
        """The taskset whose grader this one draws from: what checks of the grader probe (their grades are no
        training rollouts, and must not feed the draws; ``whileai.loop.plan.inputs.grader_probe``)."""
        return self.taskset

    def __getattr__(self, name: str) -> Any:  # everything but grade and name is the wrapped taskset's
        if name == "taskset":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.taskset, name)

    def grade(self, task: Task, completion: str) -> float:
        reward = self.taskset.grade(task, completion)
        if task.task_id in self._held_out:
            return reward
        drawn = self._rng.choice(self._earned) if self._earned else reward  # the first rollout: its own
        self._earned.append(reward)
        return drawn


@dataclass
class Controls:
    """The real arm and its controls: the runs of each arm (one per seed) and ``compare`` of each control."""

    dir: Path
    method: str
    seeds: tuple[int, ...]
    runs: dict[str, list[Run]]
    """arm name ('real', then each control) -> its ``Run`` per seed"""
    comparisons: dict[str, Comparison]
    """control name -> ``compare(control, real)`` on held-out pass@1"""

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "seeds": list(self.seeds),
                "runs": {arm: [str(r.dir) for r in runs] for arm, runs in self.runs.items()},
                "comparisons": {name: c.to_dict() for name, c in self.comparisons.items()}, "report": str(self)}

    def __str__(self) -> str:

        lines = [f"controls: {self.method} against {', '.join(self.comparisons)}; {len(self.seeds)} seed"
                 f"{'s' if len(self.seeds) != 1 else ''} per arm ({', '.join(map(str, self.seeds))}), same steps, "
                 "model and rollouts; held-out pass@1, paired over tasks",
                 format_table([TABLE_HEADER, *(c.row() for c in self.comparisons.values())])]
        for name, c in self.comparisons.items():
            lines.append(f"{name}: {c.verdict}: {c.reason}. {_meaning(name, c)}")
        lines.append(f"runs and this report: {self.dir}")
        return "\n".join(lines)


def _meaning(control: str, comparison: Comparison) -> str:

    what = "reward" if control == "random-reward" else "selection"
    low, high = comparison.ci95
    if comparison.verdict == GAIN:
        return f"The method beats its {control} control: the {what} carries signal."
    if comparison.verdict == LOSS:
        return f"The {control} control beats the method: check the {what} before the optimizer."
    if low > 0 or high < 0:
        return f"The interval favours {'the method' if low > 0 else 'the control'}; more seeds per arm decide."
    return (f"The method does not beat its {control} control: the {what} was the problem, not the optimizer "
            "(or this budget is too small to tell).")


def train_with_controls(controls: Sequence[str], *, seeds: int | Sequence[int] = CONTROL_SEEDS,
                        select_from: RowsSource | None = None, progress: bool = False, **train: Any) -> Controls:
    """Train the real arm and each control in ``controls`` at every seed, on one budget; compare each control
    with the real arm on held-out pass@1 (``wai.compare``). ``train`` holds ``wai.train``'s arguments (not
    ``seed`` or ``resume``). ``seeds``: how many seeds per arm, counted up from ``train['seed']`` (default 0),
    or the seeds themselves. ``select_from``: for random-selection, the rows (a JSONL path or a list of dicts)
    that ``rows`` was selected from. Writes RUN_DIR/real-seedS/, RUN_DIR/CONTROL-seedS/, controls.json and
    controls.txt under ``run_dir`` (default runs/controls-METHOD-TIME)."""
    seed_list = _seeds(seeds, train.pop("seed", 0))
    _check(controls, select_from, train)
    method = train.get("method") or "flash_reinforce"
    method_name = method if isinstance(method, str) else method.name
    base = Path(train.pop("run_dir", None) or f"runs/controls-{method_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if (base / "controls.json").exists():
        raise ConfigError(f"run_dir {str(base)!r} already holds a controlled run; pick another --run-dir")
    taskset = _taskset(train)
    arms = {(name, seed): _control_arm(name, train, taskset, select_from, seed) for seed in seed_list
            for name in controls}  # every control's data is built (and checked) before anything trains
    runs: dict[str, list[Any]] = {"real": []}
    for seed in seed_list:
        real = train_run(**train, seed=seed, run_dir=str(base / f"real-seed{seed}"), progress=progress)
        _held_out_rows(real)
        runs["real"].append(real)
        pinned = {k: real.summary["resolved"][k] for k in PINNED if k in real.summary["resolved"]}
        for name in controls:
            run = train_run(**{**arms[name, seed], **pinned}, seed=seed, run_dir=str(base / f"{name}-seed{seed}"),
                            progress=progress)
            _same_budget(real, run, name)
            runs.setdefault(name, []).append(run)
    real_rows, method_name = _pooled(runs["real"]), runs["real"][0].config.method  # the name the run resolved
    comparisons = {name: compare(_pooled(runs[name]), real_rows, threshold=PASS, name=name,
                                 baseline_name=name, treatment_name=method_name) for name in controls}
    report = Controls(base, method_name, tuple(seed_list), runs, comparisons)
    (base / "controls.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    (base / "controls.txt").write_text(str(report) + "\n")
    return report


def _seeds(seeds: int | Sequence[int], first: int) -> list[int]:
    if isinstance(seeds, bool) or not isinstance(seeds, (int, Sequence)):
        raise ConfigError(f"seeds={seeds!r}: give how many seeds per arm (an integer >= 1) or a list of seeds")
    if isinstance(seeds, int) and (isinstance(first, bool) or not isinstance(first, int) or first < 0):
        raise ConfigError(f"seed={first!r}: the first seed must be an integer >= 0 (the runs use seed .. seed+N-1)")
    out = list(range(first, first + seeds)) if isinstance(seeds, int) else list(seeds)
    bad = [s for s in out if isinstance(s, bool) or not isinstance(s, int) or s < 0]
    if not out or bad or len(set(out)) != len(out):
        raise ConfigError(f"seeds={seeds!r}: need at least one seed, each a distinct integer >= 0"
                          + (f" (not {bad})" if bad else ""))
    return out


def _check(controls: Sequence[str], select_from: RowsSource | None, train: Mapping[str, Any]) -> None:
    """Every problem with the request at once, before any model is built."""
    problems = []
    unknown = [c for c in controls if c not in CONTROLS]
    if isinstance(controls, str) or not controls or unknown:
        problems.append(f"controls={controls!r}: give a list of one or more of {', '.join(map(repr, CONTROLS))}")
    if len(set(controls)) != len(controls):
        problems.append(f"controls={controls!r} names a control twice")
    if "resume" in train:
        problems.append("resume: a controlled run cannot be resumed (its random rewards are not checkpointed); "
                        "start it again")
    if "random-selection" in controls and (select_from is None or train.get("rows") is None):
        problems.append("random-selection trains on a random subset of the rows a selection chose from: give the "
                        "selected rows (rows=, --rows KEPT) and the pool they came from (select_from=, "
                        "--select-from POOL)")
    if select_from is not None and "random-selection" not in controls:
        problems.append("select_from is read only by the random-selection control; add it (--control "
                        "random-selection) or drop --select-from")
    if problems:
        raise ConfigError("\n".join(["controls:", *(f"  - {p}" for p in problems)]))


def _control_arm(name: str, train: Mapping[str, Any], taskset: Taskset | None, select_from: RowsSource | None,
                 seed: int) -> dict[str, Any]:
    """``wai.train``'s arguments for the control ``name`` at ``seed``. A control trains on the budget the real
    arm had whatever its first batch shows (its rewards are noise on purpose), so the preflight does not stop it."""
    arm = {**train, "force": True}
    if name == "random-selection":
        arm["rows"] = _random_subset(_rows(train["rows"], "rows"), _rows(select_from, "select_from"), seed)
    elif train.get("rows") is not None:  # the rewards to train on are in the rows: permute them
        rows = _rows(train["rows"], "rows")
        rewards = [r.get("reward", 1.0) for r in rows]
        random.Random(seed).shuffle(rewards)
        arm["rows"] = [{**r, "reward": w} for r, w in zip(rows, rewards)]
    else:  # rollouts graded by the taskset: draw their rewards at random
        assert taskset is not None  # a run without rows samples a taskset
        arm["taskset"] = RandomRewardTaskset(taskset, seed)
        arm.pop("taskset_options", None)  # already applied to the loaded taskset
    return arm


def _taskset(train: Mapping[str, Any]) -> Taskset | None:
    """The taskset the real arm samples from, loaded (None for a run on rows); refused when the run would hold
    no held-out evaluation to compare the arms on."""

    given = train.get("taskset", "")
    fields = {k: v for k, v in train.items() if k not in ("method", "rows", "taskset", "config_file", "config")}
    if given != "":
        fields["taskset"] = given if given is None or isinstance(given, str) else "<object>"
    elif train.get("rows") is not None:
        fields["taskset"] = None
    base = config_io.as_dict(train["config"]) if train.get("config") is not None else {}
    resolved = config_io.build(train.get("config_file"), **{**base, **fields})
    if (resolved.taskset is None and getattr(resolved, "eval_taskset", None) is None) or resolved.eval_tasks == 0:
        raise ConfigError("controls compare the arms on held-out pass@1, and this run has no held-out evaluation: "
                          "give a taskset with a test split (--taskset, or --eval-taskset with --rows) and "
                          "eval_tasks > 0")
    if train.get("rows") is not None or resolved.taskset is None:
        return None
    if given is not None and not isinstance(given, str):
        return given
    return load_taskset(resolved.taskset, **resolved.taskset_options)


def _rows(rows: object, where: str) -> list[dict[str, Any]]:
    if isinstance(rows, (str, Path)):
        return [dict(r) for r in load_rows(str(rows))]
    if not isinstance(rows, Sequence) or not all(isinstance(r, Mapping) for r in rows):
        raise ConfigError(f"{where}: give a JSONL path or a list of row dicts, not {type(rows).__name__}")
    return [dict(r) for r in rows]


def _random_subset(kept: list[dict[str, Any]], pool: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    if any("pair" in r for r in kept):
        raise ConfigError("random-selection: the selected rows are preference pairs ('pair' / 'chosen'), and a "
                          "random subset of rows would break the pairs; run this control on rows, not pairs")
    if len(kept) > len(pool):
        raise ConfigError(f"random-selection: the selection kept {len(kept)} rows but select_from holds only "
                          f"{len(pool)}: give the pool the selection was made from")
    return random.Random(seed).sample(pool, len(kept))


def _held_out_rows(run: Run) -> list[dict[str, Any]]:
    path = run.dir / "heldout.jsonl"
    if not path.is_file():  # _taskset refused a run without one; a run that skipped it anyway is a bug
        raise WhileaiError(f"the run in {run.dir} wrote no heldout.jsonl, so the arms cannot be compared")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _pooled(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Every seed's held-out rows, each marked with its seed (``compare`` reads it)."""
    return [{"task_id": r["task_id"], "reward": r["reward"], "seed": str(run.config.seed)}
            for run in runs for r in _held_out_rows(run)]


def _same_budget(real: Run, control: Run, name: str) -> None:
    """The control trained as long, as often and on the same model as the real arm (a guard, not a check a
    user can trip: a difference here is a bug)."""
    keys = ("steps", "rollouts_per_step", "model", "seed", "lora_rank", "eval_tasks", "eval_samples")
    differ = {k: (getattr(real.config, k), getattr(control.config, k)) for k in keys
              if getattr(real.config, k) != getattr(control.config, k)}
    if real.summary["resolved"] != control.summary["resolved"]:
        differ["resolved"] = (real.summary["resolved"], control.summary["resolved"])
    if differ:
        raise WhileaiError(f"the {name} control ran on another budget than the real arm (real, control): {differ}")
