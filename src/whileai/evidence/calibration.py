"""How often ``compare``'s seed-paired verdict says "shown": simulated recipes with a known true effect.

    print(calibrate(effect=0.0))      # the false "shown" rate under the null, with its own 95% interval
    print(calibrate(effect=0.14))     # the power at BPCO's delta over 5 seeds

One simulated recipe is ``seeds`` paired runs per arm scored on the same ``tasks`` held-out tasks with
``samples`` samples each, as ``wai recipe`` scores them. A task's pass rate in one run is its base rate
(Beta(``task_a``, ``task_b``), fixed for the recipe: the same held-out tasks) plus the seed's shift (the warm
start and task order both arms of a seed share, Normal(0, ``seed_sd``)) plus the run's own training noise
(Normal(0, ``run_sd``), independent per arm and seed) plus ``effect`` in the treatment arm, clipped to
[0, 1]. ``collapse`` is the chance a run collapses (its rates drop by ``collapse_drop``): the heavy tail the
lag table's high learning rate showed. Each run's samples are Bernoulli draws at those rates. The verdict is
``compare``'s own: ``seed_interval`` and ``seed_verdict`` on the per-seed deltas (tests/evidence checks that
these per-seed deltas are ``compare``'s on the same rows).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from whileai.rows.stats import GAIN, LOSS, mean_interval, seed_interval, seed_verdict, wilson


@dataclass(frozen=True)
class Setting:
    """One simulated recipe's noise model (the module docstring)."""

    effect: float = 0.0
    seeds: int = 5
    tasks: int = 64
    samples: int = 4
    seed_sd: float = 0.05
    run_sd: float = 0.05
    collapse: float = 0.0
    collapse_drop: float = 0.5
    task_a: float = 2.0
    task_b: float = 1.0


@dataclass(frozen=True)
class Calibration:
    """How often each verdict came out over ``sims`` simulated recipes of ``setting``."""

    setting: Setting
    sims: int
    gain: int
    loss: int
    pooled_shown: int
    """how often the task-pooled interval alone excluded 0 (what a verdict that ignored seeds would say)"""
    separated: int
    """how often the rule this verdict replaced said "shown": the task-pooled interval excludes 0 and every seed of
    one arm beats every seed of the other"""

    @property
    def shown(self) -> float:
        return (self.gain + self.loss) / self.sims

    @property
    def shown_ci95(self) -> tuple[float, float]:
        return wilson(self.shown, self.sims)

    @property
    def pooled_rate(self) -> float:
        return self.pooled_shown / self.sims

    def __str__(self) -> str:
        lo, hi = self.shown_ci95
        s = self.setting
        return (f"effect {s.effect:+.2f}, {s.seeds} seeds, seed sd {s.seed_sd:g}, run sd {s.run_sd:g}, collapse "
                f"{s.collapse:g}: shown {self.shown:.3f} [{lo:.3f}, {hi:.3f}] (gain {self.gain}, loss {self.loss} of "
                f"{self.sims}); task-pooled interval alone {self.pooled_rate:.3f}; pooled and seeds apart "
                f"{self.separated / self.sims:.3f}")

    def to_dict(self) -> dict[str, object]:
        return {"setting": asdict(self.setting), "sims": self.sims, "gain": self.gain, "loss": self.loss,
                "shown": self.shown, "shown_ci95": list(self.shown_ci95), "pooled_shown": self.pooled_rate,
                "separated": self.separated / self.sims}


def simulate_rates(setting: Setting, sims: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Observed per-task pass shares, baseline and treatment, each ``(sims, seeds, tasks)``."""
    s = setting
    base = rng.beta(s.task_a, s.task_b, size=(sims, 1, s.tasks))
    shift = rng.normal(0.0, s.seed_sd, size=(sims, s.seeds, 1))
    arms = []
    for effect in (0.0, s.effect):
        noise = rng.normal(0.0, s.run_sd, size=(sims, s.seeds, 1))
        noise -= s.collapse_drop * (rng.random((sims, s.seeds, 1)) < s.collapse)
        rate = np.clip(base + shift + noise + effect, 0.0, 1.0)
        arms.append(rng.binomial(s.samples, np.broadcast_to(rate, (sims, s.seeds, s.tasks))) / s.samples)
    return arms[0], arms[1]


def calibrate(effect: float = 0.0, *, sims: int = 2000, rng_seed: int = 0, **noise: float) -> Calibration:
    """``sims`` simulated recipes at ``Setting(effect, **noise)``; each read with ``compare``'s seed verdict."""
    setting = Setting(effect=effect, **noise)  # type: ignore[arg-type]
    base, treat = simulate_rates(setting, sims, np.random.default_rng(rng_seed))
    deltas = (treat - base).mean(axis=2)  # (sims, seeds): each seed's mean per-task delta
    pooled = treat.mean(axis=1) - base.mean(axis=1)  # (sims, tasks): each task's share over the seeds' samples
    b_seed, t_seed = base.mean(axis=2), treat.mean(axis=2)  # (sims, seeds): each run's held-out pass@1
    apart = (t_seed.min(axis=1) > b_seed.max(axis=1)) | (t_seed.max(axis=1) < b_seed.min(axis=1))
    gain = loss = pooled_shown = separated = 0
    for d, p, a in zip(deltas, pooled, apart):
        pooled_ci = mean_interval(p, (-1.0, 1.0))
        verdict, _ = seed_verdict(d, seed_interval(d), pooled_ci)
        gain += verdict == GAIN
        loss += verdict == LOSS
        excludes = not pooled_ci[0] <= 0.0 <= pooled_ci[1]
        pooled_shown += excludes
        separated += excludes and bool(a)
    return Calibration(setting, sims, gain, loss, pooled_shown, separated)


TABLE_SETTINGS: tuple[tuple[dict[str, float], tuple[float, ...]], ...] = (
    ({"run_sd": 0.02, "seeds": 5}, (0.0, 0.05, 0.10, 0.14)),
    ({"run_sd": 0.05, "seeds": 5}, (0.0, 0.05, 0.10, 0.14)),
    ({"run_sd": 0.05, "seeds": 10}, (0.0, 0.05, 0.10, 0.14)),
    ({"run_sd": 0.1, "seeds": 5}, (0.0, 0.05, 0.10, 0.14)),
    ({"run_sd": 0.1, "seeds": 10}, (0.0, 0.05, 0.10, 0.14)),
    ({"run_sd": 0.05, "seeds": 5, "collapse": 0.2}, (0.0, 0.14)),
    ({"run_sd": 0.05, "seeds": 3}, (0.0, 0.14)),
)
"""docs/evidence.md's calibration table: run noise sd 0.02-0.1 spans the per-seed deltas the recipes measured"""

COUNT_SETTINGS: tuple[tuple[dict[str, float], tuple[float, ...]], ...] = tuple(
    ({"run_sd": sd, "seeds": n, "task_a": 1.0, "task_b": 2.0}, (0.0, 0.03, 0.05)) for sd in (0.01, 0.02) for n in (5, 10))
"""docs/evidence.md's second table: task rates from Beta(1, 2) (mean 0.33, builtin:count's held-out start), run
noise 0.01-0.02 (its per-seed deltas at 1e-3 had an sd of 0.01-0.04), at the 0.03 its rows showed"""


def table(sims: int = 2000, settings: tuple[tuple[dict[str, float], tuple[float, ...]], ...] = TABLE_SETTINGS) -> str:
    """A calibration table of docs/evidence.md (markdown), ``sims`` simulated recipes per row: each of
    ``settings``' noise models at each of its effects."""
    lines = ["| run noise sd | seeds | collapse | true delta | seed-paired verdict: shown [95%] | rule it replaced | "
             "task-pooled interval alone |", "|---|---|---|---|---|---|---|"]
    for noise, effects in settings:
        for effect in effects:
            c = calibrate(effect, sims=sims, **noise)  # type: ignore[arg-type]
            lo, hi = c.shown_ci95
            lines.append(f"| {c.setting.run_sd:g} | {c.setting.seeds} | {c.setting.collapse:g} | {effect:+.2f} | "
                         f"{c.shown:.3f} [{lo:.3f}, {hi:.3f}] | {c.separated / sims:.3f} | {c.pooled_rate:.3f} |")
    return "\n".join(lines)
