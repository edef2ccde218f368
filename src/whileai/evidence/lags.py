"""The lag table: how much of its on-policy result a method keeps when its sampler lags the policy.

    table = run_lag_table(seeds=5)            # every method at lag 0, 2, 4, 8, 16, five seeds each
    print(table)                              # pass@1 and its share of the method's own lag-0 result

Every cell is one ``wai.train`` per seed on one fixed budget (the same model, taskset, steps, rollouts per step,
learning rate, warm start and held-out tasks at every lag and for every method); only the method and the lag
change. A cell's score is the run's last held-out pass@1. Its *share* is that score over the same method's
lag-0 score at the same seed (same seed: same task order, same sampler seeds, same warm start), and the
interval is the Student-t interval of those per-seed shares; the published anchor is AReaL's decoupled PPO
(16 rollouts per prompt), which keeps 97.6% of its synchronous score at lag 8 and 92.1% at lag 16.

The runs are written to RUN_DIR/METHOD-lagL-seedS/. A run already finished there with the same settings is
read back instead of trained again, so a sweep stopped part way resumes where it stopped, and two processes
given different ``methods`` can fill one RUN_DIR side by side (one per core) before a last call prints the
whole table.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from whileai.errors import ConfigError
from whileai.evidence.papers import BUILTIN_CRITIC_RATE, FLASH_OFF_POLICY, NEVER, REGIME_TASKSET
from whileai.evidence.plan import check_folder, precheck, train_or_read
from whileai.evidence.runner import Arm, Recipe, _check_train, _fmt, _pinned, drift_reached
from whileai.loop.controls import _pooled, _seeds
from whileai.methods.registry import method as build_method

LAGS = (0, 2, 4, 8, 16)
"""the issue's lags, in optimizer steps between the weights that sampled a batch and the step that trains it"""
AREAL_SHARE = {8: 0.976, 16: 0.921}
"""AReaL (Fu et al. 2025), decoupled PPO with 16 rollouts per prompt: its score at a lag as a share of lag 0"""
LAG_SEEDS = 5


def lag_arm(name: str, lag: int, knobs: Mapping[str, Any] | None = None) -> Arm:
    """The lag table's arm for ``name`` at ``lag``: each method at its defaults, FlashReinforce's bound on the lag
    raised to the lag where it is longer, and "reinforce" the flash_reinforce recipe's baseline (FlashReinforce's
    estimator with the trust gate never closing: no trajectory is dropped, the unclipped per-token ratio stays
    in c). ``knobs``: ``{"[METHOD:]KEY": value}``, merged in (METHOD: one of LAG_METHODS; none: every method)."""
    bound = {"off_policy_steps": max(FLASH_OFF_POLICY, lag)}
    arms = {"flash_reinforce": Arm("FlashReinforce", "flash_reinforce", bound),
            "sao": Arm("SAO", "sao", {}),
            "bpco": Arm("BPCO", "bpco", {}),
            "grpo": Arm("GRPO", "grpo", {}),
            "reinforce": Arm("stale REINFORCE, gate off", "flash_reinforce", {**bound, "trust": NEVER})}
    key = name.strip().lower().replace("-", "_")
    if key not in arms:
        raise ConfigError(f"unknown lag-table method {name!r}; choose from {', '.join(arms)}")
    arm = arms[key]
    added = {}
    for target_key, value in (knobs or {}).items():
        target, _, knob = target_key.rpartition(":")
        if target and target.replace("-", "_") not in arms:
            raise ConfigError(f"knob {target_key!r}: no method {target!r} in the lag table; METHOD is one of "
                              f"{', '.join(arms)} (or none, for every method)")
        if not knob:
            raise ConfigError(f"knob {target_key!r}: no knob name; write [METHOD:]KEY=VALUE, e.g. sao:critic_warmup=5")
        if not target or target.replace("-", "_") == key:
            added[knob] = value
    return Arm(arm.label, arm.method, {**arm.knobs, **added})


LAG_METHODS = ("flash_reinforce", "sao", "bpco", "grpo", "reinforce")
"""the rows of the lag table, in order (``lag_arm`` names each)"""
_SETTINGS = Recipe("lags", "the lag table", lambda run: (), {"critic_learning_rate": BUILTIN_CRITIC_RATE},
                   {"taskset": REGIME_TASKSET})


@dataclass
class Cell:
    """One method at one lag: every seed's held-out pass@1, its share of the lag-0 run, the drift reached."""

    method: str
    lag: int
    scores: dict[int, float]
    """seed -> the run's last held-out pass@1"""
    shares: dict[int, float]
    """seed -> score / the same method's lag-0 score at that seed (seeds whose lag-0 score is 0 are left out)"""
    drift: dict[str, float]
    comparison: Any = None
    """``compare`` of this cell's held-out rows against the same method's lag-0 rows, seeds paired (its verdict:
    "loss shown" when the lag cost a shown amount); None at lag 0"""

    @property
    def score(self) -> float:
        return float(np.mean(list(self.scores.values())))

    @property
    def share(self) -> float:
        return float(np.mean(list(self.shares.values()))) if self.shares else math.nan

    @property
    def share_interval(self) -> tuple[float, float]:
        return share_interval(list(self.shares.values()))

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "lag": self.lag, "scores": self.scores, "score": self.score,
                "shares": self.shares, "share": self.share, "share_ci95": list(self.share_interval),
                "drift": self.drift, "vs_lag_0": None if self.comparison is None else self.comparison.to_dict()}


def share_interval(shares: Sequence[float]) -> tuple[float, float]:
    """The 95% Student-t interval of the mean of per-seed shares (lower end at 0; nan with fewer than 2 seeds:
    one seed says nothing about the spread)."""
    from whileai.rows.stats import CONFIDENCE, t_quantile

    values = np.asarray(shares, dtype=float)
    if len(values) < 2:
        return math.nan, math.nan
    mean = float(values.mean())
    half = t_quantile(1.0 - (1.0 - CONFIDENCE) / 2, len(values) - 1) * float(values.std(ddof=1)) / math.sqrt(
        len(values))
    return max(0.0, mean - half), mean + half


@dataclass
class LagTable:
    dir: Path
    methods: tuple[str, ...]
    lags: tuple[int, ...]
    seeds: tuple[int, ...]
    settings: dict[str, Any]
    cells: dict[tuple[str, int], Cell]
    seconds: float
    trained: int
    """runs trained (or resumed) by this call; the rest were read back from RUN_DIR"""
    knobs: dict[str, Any] = field(default_factory=dict)
    """the knobs the user set (``{"[METHOD:]KEY": value}``)"""

    def to_dict(self) -> dict[str, Any]:
        return {"methods": list(self.methods), "lags": list(self.lags), "seeds": list(self.seeds),
                "settings": self.settings, "areal_share": {str(k): v for k, v in AREAL_SHARE.items()},
                "cells": [c.to_dict() for c in self.cells.values()], "seconds": round(self.seconds, 1),
                "trained": self.trained, "knobs_set": dict(self.knobs), "report": str(self)}

    def __str__(self) -> str:
        from whileai.rows.stats import format_table

        s = self.settings
        n = len(self.seeds)
        lines = [f"lag table: {n} seed{'s' if n != 1 else ''} per cell ({', '.join(map(str, self.seeds))}); "
                 f"{s['steps']} steps of {s['rollouts_per_step']} rollouts, learning rate {s['learning_rate']:g}, "
                 f"model {s['model']}, taskset {s['taskset']}; held-out pass@1 after the budget, and its share of "
                 "the method's lag-0 result per seed (95% interval over seeds)"]
        header = ["Method", *(f"lag {lag}" for lag in self.lags)]
        rows = [[lag_arm(m, 0).label + _per_prompt(m, self.knobs)] + [self._cell_text(m, lag) for lag in self.lags]
                for m in self.methods]
        areal = ["AReaL decoupled PPO (16 per prompt; published share)"] + [
            "-" if lag == 0 else (f"- ({AREAL_SHARE[lag]:.1%})" if lag in AREAL_SHARE else "-") for lag in self.lags]
        lines.append(format_table([header, *rows, areal]))
        lines.append("against the same method at lag 0 (compare, paired by seed: delta [95% interval over per-seed "
                     "deltas], verdict):")
        verdicts = [[lag_arm(m, 0).label] + [self._verdict_text(m, lag) for lag in self.lags if lag]
                    for m in self.methods]
        lines.append(format_table([["Method", *(f"lag {lag}" for lag in self.lags if lag)], *verdicts]))
        if self.knobs:
            lines.append("knobs set: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in self.knobs.items()))
        lines.append("per seed (held-out pass@1, seeds in order):")
        for m in self.methods:
            parts = [f"lag {lag}: " + " ".join(f"{v:.3f}" for v in self.cells[m, lag].scores.values())
                     for lag in self.lags]
            lines.append(f"  {lag_arm(m, 0).label}: " + "; ".join(parts))
        lines.append("drift reached (policy steps of every seed; drift mean / max, admitted share, tokens masked or "
                     "clipped; drift is FlashReinforce's sequence KL for its rows, the per-token k3 KL otherwise):")
        for m in self.methods:
            parts = [f"lag {lag}: {_drift_text(self.cells[m, lag].drift)}" for lag in self.lags]
            lines.append(f"  {lag_arm(m, 0).label}: " + "; ".join(parts))
        lines.append(f"{self.seconds:.0f} s ({self.trained} runs trained, "
                     f"{len(self.cells) * len(self.seeds) - self.trained} read back); runs and this table: {self.dir}")
        return "\n".join(lines)

    def _cell_text(self, method: str, lag: int) -> str:
        cell = self.cells[method, lag]
        if lag == 0:
            return f"{cell.score:.3f}"
        lo, hi = cell.share_interval
        share = "n/a" if math.isnan(cell.share) else (
            f"{cell.share:.0%}" + ("" if math.isnan(lo) else f" [{lo:.0%}, {hi:.0%}]"))
        return f"{cell.score:.3f} ({share})"


    def _verdict_text(self, method: str, lag: int) -> str:
        c = self.cells[method, lag].comparison
        if c is None or c.seed_ci95 is None:
            return "-"
        return f"{c.seed_delta:+.3f} [{c.seed_ci95[0]:+.3f}, {c.seed_ci95[1]:+.3f}] {c.verdict}"


def _per_prompt(method: str, knobs: Mapping[str, Any]) -> str:
    arm = lag_arm(method, 0, knobs)
    n = build_method(arm.method, **arm.knobs).run_spec().rollouts_per_prompt
    return f" ({n} per prompt)"


def _drift_text(drift: Mapping[str, float]) -> str:
    parts = [f"{_fmt(drift.get('drift', math.nan))} / {_fmt(drift.get('drift max', math.nan))}",
             f"admitted {drift.get('admitted share', 1.0):.2f}"]
    for key in ("tokens masked", "tokens clipped"):
        if key in drift:
            parts.append(f"{key.split()[1]} {drift[key]:.3f}")
    return ", ".join(parts)


def run_lag_table(*, methods: Sequence[str] = LAG_METHODS, lags: Sequence[int] = LAGS,
                  seeds: int | Sequence[int] = LAG_SEEDS, progress: bool = False,
                  knobs: Mapping[str, Any] | None = None, **train: Any) -> LagTable:
    """Train every method at every lag and seed on one budget; each cell's pass@1 and share of lag 0.

    ``train`` holds ``wai.train``'s settings shared by every run (model, taskset, steps, learning_rate,
    rollouts_per_step, eval_tasks, device, run_dir, ...; not method, lag or resume); ``knobs``:
    ``{"[METHOD:]KEY": value}`` (``lag_arm``). The learning rate is
    pinned once by the loop's rule without any method's declared rate, so every method moves at the same speed;
    on a built-in model the critic methods get critic_learning_rate 1e-2 unless given (as in the recipes).
    Writes RUN_DIR/METHOD-lagL-seedS/ per run (read back when finished with the same settings, resumed when
    stopped: ``whileai.evidence.plan``), and lags.json, lags.txt under ``run_dir`` (default runs/lags-TIME)."""
    began = time.perf_counter()
    methods, lags = _check(methods, lags, train)
    seed_list = _seeds(seeds, train.pop("seed", 0))
    base = check_folder(Path(train.pop("run_dir", None) or f"runs/lags-{time.strftime('%Y%m%d-%H%M%S')}"))
    shared = _pinned(_SETTINGS, {**train, "lag": 0})
    shared.pop("lag")
    knobs = dict(knobs or {})
    plan = [(m, lag, {**shared, "method": lag_arm(m, lag, knobs).method, "knobs": dict(lag_arm(m, lag, knobs).knobs),
                      "seed": seed, "lag": lag, "progress": progress,
                      "run_dir": str(base / f"{m.replace('_', '-')}-lag{lag}-seed{seed}")})
            for seed in seed_list for m in methods for lag in lags]
    names = {id(settings): f"{m} at lag {lag}" for m, lag, settings in plan}
    precheck([settings for _, _, settings in plan[:len(methods) * len(lags)]],  # before anything trains
             label=lambda settings: names[id(settings)])
    runs: dict[tuple[str, int], list[Any]] = {}
    trained = 0
    for m, lag, settings in plan:
        run, fresh = train_or_read(settings)
        trained += fresh
        runs.setdefault((m, lag), []).append(run)
    cells = {key: _cell(key, runs, lags) for key in runs}
    settings_out = {k: v for k, v in shared.items() if k != "export"}
    table = LagTable(base, tuple(methods), tuple(lags), tuple(seed_list), settings_out, cells,
                     time.perf_counter() - began, trained, knobs)
    (base / "lags.json").write_text(json.dumps(table.to_dict(), indent=2) + "\n")
    (base / "lags.txt").write_text(str(table) + "\n")
    return table


def _check(methods: Sequence[str], lags: Sequence[int], train: Mapping[str, Any]) -> tuple[list[str], list[int]]:
    if isinstance(methods, str) or not methods:
        raise ConfigError(f"methods={methods!r}: give a list of one or more of {', '.join(LAG_METHODS)}")
    for m in methods:
        lag_arm(m, 0)  # an unknown name is refused with the choices
    keys = [m.strip().lower().replace("-", "_") for m in methods]
    bad = [lag for lag in lags if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0]
    if isinstance(lags, str) or not lags or bad or len(set(lags)) != len(lags):
        raise ConfigError(f"lags={lags!r}: give distinct integers >= 0, e.g. {list(LAGS)}")
    if 0 not in lags:
        raise ConfigError(f"lags={list(lags)!r} has no 0: each cell's share is over the same method's lag-0 "
                          f"result; add 0, e.g. {[0, *sorted(lags)]}")
    if len(set(keys)) != len(keys):
        raise ConfigError(f"methods={methods!r} names a method twice")
    taken = sorted(set(train) & {"lag"})
    if taken:
        raise ConfigError("the lag table sets each run's lag from lags; give lags=[...], not lag")
    _check_train(train)
    return keys, sorted(lags)


def _cell(key: tuple[str, int], runs: Mapping[tuple[str, int], Sequence[Any]], lags: Sequence[int]) -> Cell:
    method, lag = key
    scores = {int(r.config.seed): float(r.summary["eval_after"]["pass_at_1"]) for r in runs[key]}
    base = {int(r.config.seed): float(r.summary["eval_after"]["pass_at_1"]) for r in runs[method, lags[0]]} \
        if lags[0] == 0 else {}
    shares = {s: v / base[s] for s, v in scores.items() if base.get(s, 0.0) > 0.0}
    comparison = None
    if lag != 0 and lags[0] == 0:
        from whileai.loop.types import PASS
        from whileai.rows.stats import compare

        comparison = compare(_pooled(runs[method, 0]), _pooled(runs[key]), threshold=PASS, name=f"{method} lag {lag}",
                             baseline_name="lag 0", treatment_name=f"lag {lag}")
    return Cell(method, lag, scores, shares, drift_reached(runs[key]), comparison)
