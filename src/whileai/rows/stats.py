"""Pass rates with task-clustered intervals, held-out sizing, and paired comparisons.

Tasks are the unit everywhere here. The rollouts of one task are not independent draws from the
eval (they share the prompt), so an interval over rows is too narrow. Two questions, two intervals
for a pass rate (``PassAt``):

* ``ci95``, the task population: the tasks are a sample of the tasks the eval stands for, and a
  new sample of tasks would give another rate. A Wilson score interval at the effective sample
  size the per-task spread implies, with a small-sample correction (Korn and Graubard 1998).
* ``ci95_fixed``, this fixed benchmark: the tasks are the eval, and only the rollouts' sampling
  noise moves the rate. A Wilson score interval at the effective size ``T**2 / sum(k / n_i)``.

A paired comparison (``compare``) uses a Student-t interval over per-task differences. A pass is
``reward >= threshold``; the threshold may be left out only when every reward is 0 or 1
(``pass_threshold``), so a 0-10 grade or partial credit is never read as pass/fail by a guess.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist
from typing import Any

import numpy as np

from whileai.errors import BatchError, ConfigError
from whileai.rows.io import GradedRows, as_graded, pass_threshold, plural

# One place for the defaults every function here reads.
CONFIDENCE = 0.95  # two-sided confidence of every interval
POWER = 0.8  # the chance holdout_size promises of seeing a real effect

Rows = GradedRows | str | os.PathLike[str] | Iterable[Mapping[str, Any]]


# --------------------------------------------------------------------------- quantiles
@lru_cache(maxsize=256)
def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t with ``df`` degrees of freedom (normal when df is huge).

    Exact closed forms for df = 1 and 2; otherwise the CDF is integrated (Simpson, 2001 points)
    and inverted by bisection, accurate to about 1e-9.
    """
    if not 0.0 < q < 1.0:
        raise ConfigError(f"t_quantile: q={q} must be inside (0, 1).")
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    if df > 1e6:
        return NormalDist().inv_cdf(q)
    if df == 1:
        return math.tan(math.pi * (q - 0.5))
    if df == 2:
        return (2 * q - 1) / math.sqrt(2 * q * (1 - q))
    lo, hi = 0.0, 60.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _t_cdf(mid, df) < q else (lo, mid)
    return 0.5 * (lo + hi)


def _t_cdf(x: float, df: float) -> float:
    grid = np.linspace(0.0, x, 2001)
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = np.exp(log_norm - (df + 1) / 2 * np.log1p(grid**2 / df))
    h = x / 2000
    integral = h / 3 * (density[0] + density[-1] + 4 * density[1:-1:2].sum() + 2 * density[2:-1:2].sum())
    return 0.5 + float(integral)


def mean_interval(values: np.ndarray, bounds: tuple[float, float] = (0.0, 1.0),
                  confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Student-t interval for the mean of per-task values, clipped to ``bounds`` (``compare``'s).

    One task says nothing about the spread, so its interval is all of ``bounds``. A zero spread
    gets the exact interval of ``_zero_spread``.
    """
    n = len(values)
    if n < 2:
        return bounds
    sd = float(values.std(ddof=1))
    if sd == 0.0:
        return _zero_spread(values, bounds, confidence)
    mean = float(values.mean())
    half = t_quantile(1.0 - (1.0 - confidence) / 2, n - 1) * sd / math.sqrt(n)
    return max(bounds[0], mean - half), min(bounds[1], mean + half)


def _zero_spread(values: np.ndarray, bounds: tuple[float, float], confidence: float) -> tuple[float, float]:
    """Every task has the same value ``v`` (every task fails, every task passes, every task 1 of 2):
    a spread-based interval would be a point. This one is exact and distribution-free: with
    ``confidence``, the share of tasks whose value is not ``v`` is at most ``u = 1 - (alpha/2)**(1/n)``
    (Clopper-Pearson for 0 of n), and those tasks move the mean at most ``u`` of the way to either
    bound: ``[v - u (v - lo), v + u (hi - v)]``."""
    mean = float(values.mean())
    share = 1.0 - ((1.0 - confidence) / 2) ** (1.0 / len(values))
    return mean - share * (mean - bounds[0]), mean + share * (bounds[1] - mean)


def wilson(rate: float, n: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson's score interval for a rate measured as if from ``n`` independent pass/fail draws
    (``n`` need not be whole). Never a point, never outside [0, 1]; right-skewed near 0 and
    left-skewed near 1, as the sampling distribution of a rate is."""
    z = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2)
    denom = 1.0 + z * z / n
    center = (rate + z * z / (2 * n)) / denom
    half = z * math.sqrt(rate * (1.0 - rate) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def clopper_pearson(rate: float, n: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Clopper-Pearson's interval for ``rate`` measured from ``n`` pass/fail draws (``n`` and the pass
    count ``rate * n`` need not be whole): the Beta(x, n - x + 1) and Beta(x + 1, n - x) quantiles."""
    alpha = 1.0 - confidence
    passes = rate * n
    lo = 0.0 if passes <= 0.0 else beta_quantile(alpha / 2, passes, n - passes + 1.0)
    hi = 1.0 if passes >= n else beta_quantile(1.0 - alpha / 2, passes + 1.0, n - passes)
    return lo, hi


def beta_quantile(q: float, a: float, b: float) -> float:
    """The q-quantile of Beta(a, b): the regularized incomplete beta inverted by bisection (1e-15)."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if incomplete_beta(mid, a, b) < q else (lo, mid)
    return 0.5 * (lo + hi)


def incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the Beta(a, b) CDF at x: Lentz's continued fraction (Press et al., Numerical
    Recipes, 3rd ed., section 6.4), on the side of x where it converges fast."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(1.0 - x, b, a) / b


def _beta_fraction(x: float, a: float, b: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return result


def population_interval(values_T: np.ndarray, n_rows: int,
                        confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval for the mean of per-task rates in [0, 1], the tasks a sample of a task population.

    Korn and Graubard (1998, "Confidence intervals for proportions with small expected number of
    positive counts estimated from survey data", Survey Methodology 24(2)): the per-task spread
    ``s`` gives the variance ``s**2 / T`` of the mean, and so an effective sample size
    ``n_eff = r (1 - r) / (s**2 / T)`` (capped at the number of rows); ``n_eff`` shrinks by
    ``(z / t_{T-1})**2`` for the few tasks the spread is estimated from, and the interval is
    Clopper-Pearson's at that size. Unlike a t-interval it is skewed the way a rate near 0 or 1
    is, which is where a t-interval over few tasks falls short (measured in
    ``tests/rows/test_rows_stats.py``; the numbers are in ``docs/rows.md``).
    """
    n = len(values_T)
    if n < 2:
        return 0.0, 1.0
    variance = float(values_T.var(ddof=1))
    if variance == 0.0:
        return _zero_spread(values_T, (0.0, 1.0), confidence)
    rate = float(values_T.mean())
    q = 1.0 - (1.0 - confidence) / 2
    n_eff = min(rate * (1.0 - rate) * n / variance, float(n_rows))
    return clopper_pearson(rate, n_eff * (NormalDist().inv_cdf(q) / t_quantile(q, n - 1)) ** 2, confidence)


def fixed_interval(rate: float, samples_T: np.ndarray, k: int = 1,
                   confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval for pass@k on this fixed set of tasks: only the rollouts' sampling noise counts.

    Task i's unbiased pass@k from ``n_i`` rollouts is a U-statistic of order k, so its variance is
    at most ``(k / n_i) q_i (1 - q_i)`` (Hoeffding 1948), ``q_i`` its true pass@k; and over tasks
    ``mean q_i (1 - q_i) <= q (1 - q)`` (concavity), ``q`` the mean. So with equal rollouts per task
    the variance of the mean is at most ``q (1 - q) / n_fixed``, ``n_fixed = T**2 / sum(k / n_i)``,
    and the interval is Wilson's at ``n_fixed``: right when every task has the same rate, wider
    the more the tasks' rates differ (with unequal rollouts, ``n_fixed`` is an approximation).
    """
    n_fixed = len(samples_T) ** 2 / float(np.sum(k / samples_T))
    return wilson(rate, n_fixed, confidence)


# --------------------------------------------------------------------------- pass@k
def _pass_at_k_per_task(samples_T: np.ndarray, passes_T: np.ndarray, k: int) -> np.ndarray:
    """Chen et al. 2021, eq. 1, per task: 1 - C(n - c, k) / C(n, k), as a stable product.

    C(n-c, k) / C(n, k) = prod_{j = n-c+1}^{n} (1 - k / j); it is 0 when n - c < k.
    """
    out = np.empty(len(samples_T))
    pairs, inverse = np.unique(np.stack([samples_T, passes_T]), axis=1, return_inverse=True)
    values = np.empty(pairs.shape[1])
    for j, (n, c) in enumerate(pairs.T):
        values[j] = 1.0 if n - c < k else 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))
    out[:] = values[np.ravel(inverse)]
    return out


@dataclass(frozen=True, eq=False)
class PassAt:
    """Pass rates of graded rows, per task and overall, with two 95% intervals.

    ``value`` is pass@k at the ``k`` asked for; ``ci95`` its interval for the task population (the
    tasks a sample of the tasks the eval stands for), ``ci95_fixed`` for this fixed benchmark (only
    the rollouts' noise). ``pass_at_1`` is the mean over tasks of each task's pass rate;
    ``per_task`` maps task id to that rate.
    """

    k: int
    threshold: float
    task_ids: tuple[Any, ...]
    samples_T: np.ndarray
    passes_T: np.ndarray
    n_rows: int
    value: float = field(init=False)
    ci95: tuple[float, float] = field(init=False)
    ci95_fixed: tuple[float, float] = field(init=False)

    def __post_init__(self) -> None:
        per_task = self.per_task_at(self.k)
        object.__setattr__(self, "value", float(per_task.mean()))
        object.__setattr__(self, "ci95", population_interval(per_task, self.n_rows))
        object.__setattr__(self, "ci95_fixed", fixed_interval(self.value, self.samples_T, self.k))

    @property
    def n_tasks(self) -> int:
        return len(self.task_ids)

    @property
    def rates_T(self) -> np.ndarray:
        """Each task's pass rate (passes / rollouts), in ``task_ids`` order."""
        return self.passes_T / self.samples_T

    @property
    def pass_at_1(self) -> float:
        return float(self.rates_T.mean())

    @property
    def per_task(self) -> dict[Any, float]:
        return dict(zip(self.task_ids, self.rates_T.tolist()))

    def per_task_at(self, k: int) -> np.ndarray:
        """The unbiased pass@k estimate of every task (Chen et al. 2021)."""
        fewest = int(self.samples_T.min())
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"pass_at: k={k!r} must be an integer >= 1.")
        if k > fewest:
            task = self.task_ids[int(self.samples_T.argmin())]
            raise ConfigError(f"pass_at: k={k} but task {task!r} has only {plural(fewest, 'rollout')}; the unbiased "
                              f"estimator needs k <= the rollouts of every task. Fix: pass k <= {fewest}, "
                              "or sample more rollouts for the short tasks.")
        return _pass_at_k_per_task(self.samples_T, self.passes_T, k)

    def pass_at(self, k: int) -> float:
        """Mean over tasks of the unbiased pass@k estimate; k <= rollouts of every task."""
        return float(self.per_task_at(k).mean())

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "pass_at_k": self.value, "ci95": list(self.ci95), "ci95_fixed": list(self.ci95_fixed),
                "pass_at_1": self.pass_at_1, "n_tasks": self.n_tasks, "n_rows": self.n_rows,
                "threshold": self.threshold}

    def __str__(self) -> str:
        (lo, hi), (f_lo, f_hi) = self.ci95, self.ci95_fixed
        return (f"pass@{self.k} {self.value:.3f} [{lo:.3f}, {hi:.3f}] over {plural(self.n_tasks, 'task')} "
                f"({plural(self.n_rows, 'row')}; 95% interval for the task population; [{f_lo:.3f}, {f_hi:.3f}] "
                "for this fixed benchmark)")


def pass_at(rows: Rows, k: int = 1, threshold: float | None = None) -> PassAt:
    """Pass@k of graded rows (dicts, ``GradedRows`` or a file path): a row passes at reward >= threshold.

    Every task counts once, however many rollouts it has. ``threshold`` may be left out only when
    every reward is 0 or 1 (``pass_threshold``).
    """
    graded = as_graded(rows)
    threshold = pass_threshold(graded.reward_R, threshold, graded.source)
    samples, passes = task_counts(graded, threshold)
    return PassAt(k, threshold, graded.task_ids, samples, passes, graded.n_rows)


def task_counts(graded: GradedRows, threshold: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(rollouts, passes) per task, in ``graded.task_ids`` order (``threshold``: see ``pass_threshold``)."""
    threshold = pass_threshold(graded.reward_R, threshold, graded.source)
    samples = np.bincount(graded.task_R, minlength=graded.n_tasks)
    passes = np.bincount(graded.task_R, weights=graded.reward_R >= threshold, minlength=graded.n_tasks)
    return samples.astype(np.int64), passes.astype(np.int64)


# --------------------------------------------------------------------------- held-out size
@dataclass(frozen=True)
class HoldoutSize:
    """How many held-out tasks a paired comparison needs, and what that number assumes."""

    n_tasks: int
    effect: float
    k: int
    sd: float
    power: float
    confidence: float
    assumptions: tuple[str, ...]

    def __int__(self) -> int:
        return self.n_tasks

    def __index__(self) -> int:
        return self.n_tasks

    def to_dict(self) -> dict[str, Any]:
        return {"n_tasks": self.n_tasks, "effect": self.effect, "k": self.k, "sd": self.sd,
                "power": self.power, "confidence": self.confidence, "assumptions": list(self.assumptions)}

    def __str__(self) -> str:
        lines = [f"holdout_size: {self.n_tasks} held-out tasks, {self.k} rollout(s) each per arm, to see a "
                 f"pass@1 change of {self.effect:+.3f} with {self.confidence:.0%} confidence and "
                 f"{self.power:.0%} power", "  assuming:"]
        return "\n".join(lines + [f"  - {a}" for a in self.assumptions])


def holdout_size(effect: float, k: int = 1, *, p: float | None = None, spread: float = 0.0, sd: float | None = None,
                 power: float = POWER, confidence: float = CONFIDENCE) -> HoldoutSize:
    """Held-out tasks a paired comparison of two arms needs to see a pass@1 change of ``effect``.

    The test is ``compare``'s: the mean over tasks of the per-task difference in pass rate, with a
    two-sided t-interval at ``confidence``; "seeing" the effect means the interval excludes 0.
    It needs the spread ``sd`` of that per-task difference. Unless you pass ``sd`` (measured from a
    pilot: ``compare(...).sd``), it is worked out from these assumptions:

    * each arm samples ``k`` rollouts per task, independently, so a task's pass rate carries
      binomial noise ``p(1 - p) / k``;
    * the baseline passes each task with probability ``p`` and the treatment with ``p + effect``;
      by default ``p = 0.5 - effect / 2``, the two rates either side of 0.5, which maximizes the
      binomial noise ``p(1-p) + q(1-q)``: the answer is then enough for any baseline rate, equal
      across tasks or not (a task's noise is largest at 0.5);
    * the true effect may differ between tasks with standard deviation ``spread`` (default 0);
    * the tasks are a random sample of the tasks you care about, and one training seed's noise
      is not in it: a difference between two training runs needs seeds as well (``compare``).

    Then ``sd**2 = (p(1-p) + q(1-q)) / k + spread**2`` with ``q = p + effect`` and the answer is the
    smallest ``n`` with ``n >= ((t_{1-a/2, n-1} + t_{power, n-1}) * sd / effect)**2``.
    """
    _check_fraction("power", power)
    _check_fraction("confidence", confidence)
    if not (isinstance(effect, (int, float)) and math.isfinite(effect) and 0 < abs(effect) <= 1):
        raise ConfigError(f"holdout_size: effect={effect!r} must be a non-zero change in pass@1, in [-1, 1].")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"holdout_size: k={k!r} must be an integer >= 1 (rollouts per task per arm).")
    worst = p is None
    p = 0.5 - effect / 2 if p is None else p
    q = p + effect
    assumptions: list[str]
    if sd is None:
        _check_fraction("p", p, closed=True)
        if not 0.0 <= q <= 1.0:
            raise ConfigError(f"holdout_size: p={p!r} plus effect={effect!r} is {q:.3f}, not a pass rate. Fix: "
                              "give the baseline rate p the treatment can move by effect, or leave p out.")
        sd = math.sqrt((p * (1 - p) + q * (1 - q)) / k + spread**2)
        assumptions = [
            f"baseline pass rate p={p:.3f} on every task, treatment {q:.3f}"
            + (" (rates either side of 0.5: the worst case, so any other rates need no more tasks)"
               if worst else ""),
            f"{k} independent rollout(s) per task per arm: binomial noise p(1-p)/k in each task's rate",
            f"the true effect varies across tasks with sd {spread:.3f}",
            f"so the per-task difference has sd {sd:.3f}"]
    else:
        assumptions = [f"the per-task difference has sd {sd:.3f} (as given, e.g. measured by a pilot compare)"]
    if not (math.isfinite(sd) and sd > 0):
        raise ConfigError(f"holdout_size: sd={sd!r} must be a positive number.")
    assumptions += ["tasks drawn at random from the tasks you care about; paired: both arms see the same tasks",
                    "a two-sided t-test on the mean per-task difference (compare's interval excludes 0)",
                    "training-seed noise is not included: separate two runs with seeds as well"]
    return HoldoutSize(_smallest_n(abs(effect), sd, power, confidence), effect, k, sd, power, confidence,
                       tuple(assumptions))


def _smallest_n(effect: float, sd: float, power: float, confidence: float) -> int:
    z = NormalDist().inv_cdf
    n = max(2, math.ceil(((z(1 - (1 - confidence) / 2) + z(power)) * sd / effect) ** 2))
    while True:  # the t-quantiles shrink as n grows, so walk up from the normal answer
        needed = ((t_quantile(1 - (1 - confidence) / 2, n - 1) + t_quantile(power, n - 1)) * sd / effect) ** 2
        if n >= needed:
            return n
        n += 1


def _check_fraction(name: str, value: float, closed: bool = False) -> None:
    ok = isinstance(value, (int, float)) and (0 <= value <= 1 if closed else 0 < value < 1)
    if not ok:
        raise ConfigError(f"holdout_size: {name}={value!r} must be in {'[0, 1]' if closed else '(0, 1)'}.")


# --------------------------------------------------------------------------- paired comparison
GAIN, LOSS, UNRESOLVED = "gain shown", "loss shown", "unresolved"
TABLE_HEADER = ("Recipe", "Baseline arm", "Recipe arm", "Delta (tasks)", "Delta (seeds paired)", "Verdict")


@dataclass(frozen=True)
class Comparison:
    """Treatment against baseline on the tasks both were scored on, one table row of the lesson."""

    name: str
    baseline_name: str
    treatment_name: str
    baseline: float
    treatment: float
    delta: float
    ci95: tuple[float, float]
    """the task-pooled interval: a t-interval over the shared tasks, every seed's samples pooled per task"""
    sd: float
    n_tasks: int
    only_baseline: int
    only_treatment: int
    baseline_seeds: int
    treatment_seeds: int
    verdict: str
    reason: str
    seed_delta: float | None = None
    """the mean over paired seeds of each seed's delta (None: the rows carry no seeds to pair)"""
    seed_ci95: tuple[float, float] | None = None
    """the verdict's interval: a t-interval over the per-seed deltas, paired_seeds - 1 degrees of freedom"""
    paired_seeds: int = 0
    """seeds found in both arms' rows (the pairs: same seed, same warm start and sampler seeds)"""

    def row(self) -> tuple[str, str, str, str, str, str]:
        lo, hi = self.ci95
        seeds = "-" if self.seed_ci95 is None else (f"{self.seed_delta:+.2f} [{self.seed_ci95[0]:+.2f}, "
                                                    f"{self.seed_ci95[1]:+.2f}] ({self.paired_seeds} seeds)")
        return (self.name, f"{self.baseline_name}, {self.baseline:.2f}", f"{self.treatment_name}, "
                f"{self.treatment:.2f}", f"{self.delta:+.2f} [{lo:+.2f}, {hi:+.2f}]", seeds, self.verdict)

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["ci95"] = list(self.ci95)
        out["seed_ci95"] = None if self.seed_ci95 is None else list(self.seed_ci95)
        return out

    def __str__(self) -> str:
        table = format_table([TABLE_HEADER, self.row()])
        return f"{table}\n{self.verdict}: {self.reason}"


def compare(baseline_rows: Rows, treatment_rows: Rows, *, threshold: float | None = None,
            seeds: int | None = None, name: str = "compare", baseline_name: str = "baseline",
            treatment_name: str = "treatment") -> Comparison:
    """Paired delta of pass@1, treatment minus baseline: task-pooled and paired by seed, with a verdict.

    Only tasks scored in both arms count; how many were left out is reported. ``ci95`` is a t-interval
    over the shared tasks (each task's pass share over every seed's samples). When the rows carry
    ``seed``, each seed found in both arms is a pair (same seed: same warm start, task order and
    sampler seeds); its delta is the mean over the shared tasks of that seed's per-task difference,
    and ``seed_ci95`` is a t-interval over those per-seed deltas. The verdict is "gain shown" or
    "loss shown" when ``seed_ci95`` excludes 0 (two or more paired seeds), else "unresolved": the seed
    is the unit of training variance, and the task-pooled interval does not see it
    (docs/decisions.md, "Evidence"). Rows without seeds: ``seeds=N`` states how many runs each arm
    pooled, and the task-pooled interval decides (the caller vouches for the seeds); one seed per arm
    is always "unresolved".
    """
    base, treat = as_graded(baseline_rows, seeds=True, lines=True), as_graded(treatment_rows, seeds=True, lines=True)
    pass_threshold(treat.reward_R, threshold, treat.source)  # each arm's rewards read by the same rule
    threshold = pass_threshold(base.reward_R, threshold, base.source)
    shared = sorted(set(base.task_ids) & set(treat.task_ids), key=str)
    if not shared:
        raise BatchError("compare: the two files share no task_id, so there is nothing to pair. Fix: score "
                         "both arms on the same held-out tasks (same task_id values).")
    b_rates, t_rates = _rates_on(base, shared, threshold), _rates_on(treat, shared, threshold)
    diff = t_rates - b_rates
    ci = mean_interval(diff, (-1.0, 1.0))
    b_seeds, t_seeds = _seed_count(base, seeds), _seed_count(treat, seeds)
    pairs = _seed_deltas(base, treat, shared, threshold) if seeds is None and base.seeds and treat.seeds else None
    if pairs is None:
        verdict, reason = _pooled_verdict(ci, b_seeds, t_seeds)
        seed_delta, seed_ci = None, None
    else:
        seed_delta, seed_ci = (float(pairs.mean()) if len(pairs) else math.nan), seed_interval(pairs)
        verdict, reason = seed_verdict(pairs, seed_ci, ci, len(base.seeds) + len(treat.seeds) - 2 * len(pairs))
    return Comparison(name, baseline_name, treatment_name, float(b_rates.mean()), float(t_rates.mean()),
                      float(diff.mean()), ci, float(diff.std(ddof=1)) if len(diff) > 1 else 0.0, len(shared),
                      base.n_tasks - len(shared), treat.n_tasks - len(shared), b_seeds, t_seeds, verdict, reason,
                      seed_delta=seed_delta, seed_ci95=seed_ci, paired_seeds=0 if pairs is None else len(pairs))


def _rates_on(graded: GradedRows, shared: list[Any], threshold: float,
              rows_mask: np.ndarray | None = None) -> np.ndarray:
    mask = np.ones(graded.n_rows, bool) if rows_mask is None else rows_mask
    samples = np.bincount(graded.task_R[mask], minlength=graded.n_tasks)
    passes = np.bincount(graded.task_R[mask], weights=graded.reward_R[mask] >= threshold, minlength=graded.n_tasks)
    position = {task: i for i, task in enumerate(graded.task_ids)}
    idx = np.array([position[t] for t in shared])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(samples[idx] > 0, passes[idx] / np.maximum(samples[idx], 1), np.nan)


def _seed_count(graded: GradedRows, seeds: int | None) -> int:
    missing = np.flatnonzero(graded.seed_R < 0) if graded.seeds else np.zeros(0, np.int64)
    if len(missing):
        first = int(missing[0])
        raise BatchError(f"compare: {graded.source}: {plural(len(missing), 'row')} without a 'seed' while others have "
                         f"one (the first: {graded.where(first)}, task {graded.task_ids[graded.task_R[first]]!r}), so "
                         "they would belong to no seed. Fix: give every row of the file its training seed, or none.")
    if seeds is not None:
        if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
            raise ConfigError(f"compare: seeds={seeds!r} must be an integer >= 1 (training runs per arm).")
        return seeds
    return max(1, len(graded.seeds))


def _seed_deltas(base: GradedRows, treat: GradedRows, shared: list[Any], threshold: float) -> np.ndarray:
    """Per seed found in both arms (in the baseline's order): the mean over the shared tasks that seed scored
    in both arms of treatment rate minus baseline rate."""
    out = []
    for label in [s for s in base.seeds if s in set(treat.seeds)]:
        b = _rates_on(base, shared, threshold, base.seed_R == base.seeds.index(label))
        t = _rates_on(treat, shared, threshold, treat.seed_R == treat.seeds.index(label))
        both = ~(np.isnan(b) | np.isnan(t))
        if both.any():
            out.append(float(np.mean(t[both] - b[both])))
    return np.array(out)


def seed_interval(deltas: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The verdict's interval: Student-t over per-seed deltas (``mean_interval`` in [-1, 1]; fewer than two
    seeds give all of [-1, 1], equal deltas the exact zero-spread interval)."""
    return mean_interval(np.asarray(deltas, float), (-1.0, 1.0), confidence)


def seed_verdict(deltas: np.ndarray, seed_ci: tuple[float, float], pooled_ci: tuple[float, float],
                 unpaired: int = 0) -> tuple[str, str]:
    """(verdict, reason) from the seed-paired interval; the task-pooled one is named for context only."""
    lo, hi = seed_ci
    left = f"; {plural(unpaired, 'seed')} in one arm only left out" if unpaired else ""
    pooled = "excludes" if not pooled_ci[0] <= 0.0 <= pooled_ci[1] else "holds"
    if len(deltas) < 2:
        return UNRESOLVED, (f"{plural(len(deltas), 'seed')} in both arms{left}: the seed is the unit of training "
                            "variance, so run two or more seeds of each arm at the same seeds")
    if lo <= 0.0 <= hi:
        return UNRESOLVED, (f"the seed-paired 95% interval [{lo:+.3f}, {hi:+.3f}] over {len(deltas)} seeds holds 0 "
                            f"(the task-pooled interval {pooled} 0){left}; more seeds narrow it")
    return (GAIN if lo > 0 else LOSS), (f"the seed-paired 95% interval [{lo:+.3f}, {hi:+.3f}] over {len(deltas)} "
                                        f"seeds excludes 0 (the task-pooled interval {pooled} 0){left}")


def _pooled_verdict(ci: tuple[float, float], b_seeds: int, t_seeds: int) -> tuple[str, str]:
    lo, hi = ci
    if lo <= 0.0 <= hi:
        return UNRESOLVED, f"the 95% interval [{lo:+.3f}, {hi:+.3f}] holds 0"
    if min(b_seeds, t_seeds) < 2:
        return UNRESOLVED, (f"the interval excludes 0, but {min(b_seeds, t_seeds)} training seed per arm cannot "
                            "separate a method from run-to-run training noise; run a second seed of each arm")
    return (GAIN if lo > 0 else LOSS), (f"the task-pooled interval excludes 0 with {b_seeds} and {t_seeds} seeds "
                                        "(as given; rows tagged with their seed get the seed-paired verdict)")


# --------------------------------------------------------------------------- tables
def format_table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces, a rule under the header."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
