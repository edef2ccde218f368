"""Methods that shape a grouped update: GroupwiseGrading (GRS / GAR) and ReinforceAda.

**GroupwiseGrading** (LLM-Core Xiaomi 2026, *MiMo-V2.6: Scaling Reinforcement Learning Towards
Self-Improvement*, section 4.3, Fig. 7, Eq. 2-3). Binary reward makes every pass of a group equal; a
grader tells them apart. ``grader(passing_rows)`` returns one score per pass of a ``task_id`` group
(``reward >= pass_reward``), turned into a quality factor ``f`` in [0, 1]:

- ``scores="rank"`` (default; the guide's contract: any finite score, higher is better): a pass that
  ``h`` of the group's ``n_p`` passes outscore gets ``f = 1 - spread * h / (n_p - 1)``; the best (and
  ties with it) get 1, a group with one pass is not graded (f = 1).
- ``scores="factor"`` (the paper's rubric scores): each score is ``f`` as it is and must lie in [0, 1];
  every pass is graded, a single one too.

``mode="reward"`` (GRS, Eq. 2, ``R_i = R_test * S_sol * S_beh``): a pass's reward becomes ``R' = f R``
(the grader's factor stands for the product of the two rubric scores; a fail's reward is untouched, as
``R_test = 0`` makes the product 0 there); the wrapped grouped method (default GRPO) then runs on R', so
a group where every rollout passes is no longer unanimous.

``mode="advantage"`` (GAR, Eq. 3): the wrapped method's advantages ``A`` are kept for fails; over the
group's passes with ``A > 0`` (set P), ``A'_i = lam f_i A_i`` with ``lam = sum_P A / sum_P f A``, so the
passes' positive total is kept and moved toward the better ones; ``lam`` is capped at ``cap`` (the
paper caps it; its value is not in what we read), and the group's advantages are shifted by the mean
change so the group keeps the wrapped method's mean (zero for GRPO and RLOO). ``c`` is then GRPO's
surrogate with the wrapped method's ``clip`` and length weight (``loss_type``, via its ``_weights``).

Where we read it: the report itself was not reachable from here; the formulas come from a page-cited
reading of its 44-page PDF (github.com/xiaofengShi/paper-reading-skill, examples/mimo-v2.6-deep-read.md,
PDF pp. 16-19). Differs from the paper: an LLM grader there scores each trajectory against offline
rubrics (GRS) or compares a group's patches (GAR) and zeroes answer-leaking passes; here the grader is
any callable, and ``scores="rank"`` turns its ranking into ``f``. The paper applies GRS to high-pass-rate
code tasks and GAR to mixed groups; here ``mode`` picks one for every group.

**ReinforceAda** (Xiong et al. 2025, arXiv:2510.04996; the authors' code RLHFlow/Reinforce-Ada,
``_generate_multi_round_adaptive_downsampling`` and ``compute_grpo_outcome_advantage``). Sample a
prompt in rounds of ``round_size`` (authors: ``round_repeat`` 8) for at most ``max_rounds`` (4), and
stop it once it can teach: ``exit="balance"`` (Reinforce-Ada-balance) once it holds ``n // 2`` passes
and ``n - n // 2`` fails, ``exit="pos"`` (Reinforce-Ada-pos, the code's ``positive_focused``) once it
holds one pass, with ``n = group_size`` (the authors' ``rollout.n`` = 4). Every row of a round counts,
also the rows past the exit. ``plan(rows)`` is that sampling side as a pure function of the rows so far.
``update(rows)`` keeps ``group_size`` rows per prompt, the authors' ``downsample_cache``: ``n // 2``
passes, then fails up to ``n``, then more passes, then more fails, first come first kept (the same rule
serves a prompt that ran out of rounds); the baseline is the mean reward of *every* row collected for
the prompt (the pass rate for 0/1 rewards; the authors' ``global_stat_est``), divided by that pool's
sample std as their code can: ``A = (R - mean) / (max(std, 1e-6) + 1e-6)``; ``divide_by_std=False`` is
their run (``norm_adv_by_std_in_grpo=False``): ``A = R - mean``. ``c`` is GRPO's surrogate with ``w_i =
1/(B_kept T_i)``. Rows not kept get ``c = 0`` and a note.
Differs from the authors: their rounds run inside the sampler (here the loop calls ``plan`` between
rounds); their run divides by no std (our default does, as wai.GRPO does); their verl run aggregates
with ``token-mean`` and clips at (0.2, 0.28), here ``w_i = 1/(B_kept T_i)`` and a symmetric ``clip`` unless
``clip_high`` is set (``clip_high=0.28`` is their band; ``dual_clip=3.0`` verl's dual clip, which their run had);
a prompt with one row gets A = 0 (theirs: mean 0, std 1, so A = R).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from whileai.errors import BatchError
from whileai.methods.base import Method, Update, knob, plural, trajectory_list
from whileai.methods.grouped import ONE_ROLLOUT_FIX, band_of, clipped_surrogate
from whileai.methods.registry import method as by_name
from whileai.methods.run_spec import RunSpec
from whileai.methods.supervised import mean_ratio
from whileai.rows.batch import Batch, as_batch, as_label

Grader = Callable[[list[Mapping[str, Any]]], Sequence[float]]
STD_FLOOR = 1e-6  # the authors' epsilon: std clamped at it, then added to it


# --------------------------------------------------------------------- shared arithmetic
def sequence_weights(batch: Batch, include_B: np.ndarray) -> np.ndarray:
    """GRPO's w_i = 1/(B T_i), with B the number of included trajectories."""
    return 1.0 / (max(int(include_B.sum()), 1) * batch.action_tokens_B.astype(np.float64))


def groups_of(batch: Batch, method: str) -> dict[Hashable, list[int]]:
    """Row indices per task_id, in batch order."""
    task_ids = batch.row_field("task_id", method, "rollouts of one prompt form a group")
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, task in enumerate(task_ids):
        groups[task].append(i)
    return groups


def outscored_by(scores: np.ndarray) -> np.ndarray:
    """For each entry, how many others score strictly higher."""
    return (scores[None, :] > scores[:, None]).sum(axis=1).astype(np.float64)


def rank_factors(scores: np.ndarray, spread: float) -> np.ndarray:
    """f = 1 - spread * h / (n - 1), h = how many of the n scores are strictly higher (n >= 2)."""
    return 1.0 - spread * outscored_by(scores) / (len(scores) - 1)


def redistribute(advantages: np.ndarray, factors: np.ndarray, cap: float) -> tuple[np.ndarray, bool]:
    """GAR (Eq. 3) on the positive advantages of a group's passes: lam f_i A_i, lam = sum A / sum f A <= cap.

    Returns the new advantages and whether the cap bound lam."""
    weighted = float((factors * advantages).sum())
    lam = float(advantages.sum()) / weighted if weighted > 0 else math.inf
    return min(lam, cap) * factors * advantages, lam > cap


def first_token_advantages(batch: Batch, update: Update) -> np.ndarray:
    """One advantage per row: the value on its first action token."""
    first_action = np.array([int(np.flatnonzero(m)[0]) for m in batch.split(batch.action_mask_N)])
    return np.array([a[k] for a, k in zip(update.advantages, first_action)], dtype=np.float64)


# --------------------------------------------------------------------- GroupwiseGrading
@dataclass(frozen=True)
class GroupwiseGrading(Method):
    """Grade the passes of each group and shape a grouped method's reward (GRS, Eq. 2) or advantage
    (GAR, Eq. 3); MiMo-V2.6 2026, section 4.3. Formulas and sources: module docstring.

    ``grader(rows) -> scores``: called once per graded group with that group's passing rows (GAR: the
    passes with a positive advantage), returning one finite score per row: with ``scores="rank"`` any
    number, higher is better; with ``scores="factor"`` the quality factor in [0, 1] itself. ``method``:
    the grouped method to wrap, an object or a name (default ``"grpo"``).
    """

    name = "groupwise_grading"

    grader: Grader | None = None
    mode: str = knob()
    method: Any = "grpo"
    scores: str = knob()
    spread: float = knob()
    cap: float = knob()
    pass_reward: float = knob()

    def __post_init__(self) -> None:
        if isinstance(self.method, str):
            object.__setattr__(self, "method", by_name(self.method))
        super().__post_init__()

    def _check(self) -> list[str]:
        problems = []
        if not callable(self.grader):
            problems.append(f"GroupwiseGrading.grader={self.grader!r} is invalid: it must be a callable taking one "
                            "group's passing rows and returning one score per row (higher is better); it is Python "
                            "code, so GroupwiseGrading runs from Python, not from `wai update` or `wai train`: "
                            "wai.train(method=wai.GroupwiseGrading(grader=my_grader, method=wai.GRPO(rollouts_per_prompt=4)))")
        if not isinstance(self.method, Method) or isinstance(self.method, GroupwiseGrading):
            problems.append(f"GroupwiseGrading.method={self.method!r} is invalid: it must be a grouped method "
                            "(wai.GRPO(), wai.RLOO(), wai.MaxRL(), or its name)")
        elif self.mode == "advantage" and (beta := float(getattr(self.method, "beta", 0.0) or 0.0)) > 0:
            problems.append("GroupwiseGrading(mode='advantage') recomputes the surrogate without the KL term, so "
                            f"the wrapped method's beta must be 0 (got {beta:g}); use mode='reward'")
        return problems

    @property
    def _fewest(self) -> int:
        """Passes a group needs before the grader can change anything (a lone pass ranks first: f = 1)."""
        return 1 if self.scores == "factor" else 2

    def run_spec(self) -> RunSpec:
        return self.method.run_spec()

    def _update(self, batch: Batch) -> Update:
        inner: Method = self.method
        capped = 0
        if self.mode == "reward":
            passes = [[i for i in rows if batch.rewards_B[i] >= self.pass_reward]
                      for rows in groups_of(batch, self.name).values()]
            graded = self._grade(batch, passes)
            shaped_B = batch.rewards_B.copy()
            for rows, factors in graded:
                shaped_B[rows] *= factors
            update = inner.update(replace(batch, rewards_B=shaped_B))
            shift = float(np.abs(shaped_B - batch.rewards_B).mean())
        else:
            update = inner.update(batch)
            include_B = ~(batch.truncated_B & (getattr(inner, "truncated", "mask") == "mask"))
            raw_B = np.where(include_B, first_token_advantages(batch, update), 0.0)
            shaped_B = raw_B.copy()
            groups = [[i for i in rows if include_B[i]] for rows in groups_of(batch, self.name).values()]
            positive = [[i for i in rows if batch.rewards_B[i] >= self.pass_reward and raw_B[i] > 0]
                        for rows in groups]
            graded = self._grade(batch, positive)
            group_of = {i: rows for rows in groups for i in rows}
            for rows, factors in graded:
                shaped_B[rows], bound = redistribute(raw_B[rows], factors, self.cap)
                members = group_of[int(rows[0])]
                shaped_B[members] -= (shaped_B[members] - raw_B[members]).mean()
                capped += bound
            update = self._surrogate(batch, update, shaped_B, include_B)
            shift = float(np.abs(shaped_B - raw_B).mean())
        update.method = self.name
        update.stats["graded_groups"] = float(len(graded))
        update.stats["mean_shaping"] = shift
        if capped:
            update.notes.append(f"{plural(capped, 'group')}: the grader's factors asked for lam above cap={self.cap:g}, "
                                "so their passes' positive advantage shrank and the group was re-centred; raise cap "
                                "or check the grader's scores")
        if not graded:
            update.notes.append(f"no group has {self._fewest} or more passes (reward >= {self.pass_reward:g})"
                                f"{' with A > 0' if self.mode == 'advantage' else ''}, so the grader graded nothing "
                                "and this is the plain grouped update; sample more rollouts per task")
        return update

    def _grade(self, batch: Batch, groups: list[list[int]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """(rows, quality factors) for each group with enough passes; the grader is called once per group."""
        out = []
        grader = cast(Grader, self.grader)  # checked callable in _check
        for passes in groups:
            if len(passes) < self._fewest:
                continue
            rows = np.array(passes, dtype=np.int64)
            scores = grader([batch.rows[i] for i in rows])
            try:
                arr = np.asarray(scores, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                arr = np.zeros(0)
            task = batch.rows[rows[0]].get("task_id")
            if arr.size != rows.size or not np.isfinite(arr).all():
                raise BatchError(f"row {rows[0]}: the grader returned {scores!r} for the {rows.size} passes of "
                                 f"task {task!r}; it must return one finite score per passing row, in order.")
            if self.scores == "factor" and ((arr < 0) | (arr > 1)).any():
                raise BatchError(f"row {rows[0]}: the grader returned {scores!r} for task {task!r}, but "
                                 "scores='factor' takes each score as a quality factor in [0, 1]; rescale the "
                                 "grader's scores, or use scores='rank' to grade by their order")
            out.append((rows, arr if self.scores == "factor" else rank_factors(arr, self.spread)))
        return out

    def _surrogate(self, batch: Batch, update: Update, advantage_B: np.ndarray, include_B: np.ndarray) -> Update:
        inner = self.method
        # the wrapped method's own length weight (GRPO's loss_type) when it exposes one, else 1/(B T_i)
        weights = getattr(inner, "_weights", None)
        weight_B = weights(batch, include_B) if callable(weights) else sequence_weights(batch, np.ones(batch.size,
                                                                                                    dtype=bool))
        surrogate = clipped_surrogate(batch, advantage_B, weight_B, include_B, band_of(inner))
        update.coefficients = batch.split(surrogate.coefficients_N)
        update.advantages = batch.split(np.where(batch.action_mask_N, batch.spread(advantage_B), 0.0))
        return update


# --------------------------------------------------------------------- ReinforceAda
@dataclass(frozen=True)
class SamplingPlan:
    """What to sample next: rollouts per prompt still active, and the prompts that stopped and why."""

    resample: dict[Hashable, int]
    done: tuple[Hashable, ...]
    exhausted: tuple[Hashable, ...]

    @property
    def finished(self) -> bool:
        return not self.resample

    def __str__(self) -> str:
        lines = [f"reinforce_ada plan: resample {plural(len(self.resample), 'prompt')} "
                 f"({sum(self.resample.values())} rollouts); {len(self.done)} done; {len(self.exhausted)} out of budget"]
        if self.exhausted:
            shown = ", ".join(repr(t) for t in self.exhausted[:8])
            lines.append(f"  out of budget without exit: {shown}; their groups may be unanimous (c = 0): raise "
                         "max_rounds or round_size, or accept the loss")
        return "\n".join(lines)


@dataclass(frozen=True)
class ReinforceAda(Method):
    """Adaptive sampling until a prompt's rows can teach, then a grouped update on a balanced group with
    a baseline from every row sampled (Xiong et al. 2025, arXiv:2510.04996). Formulas: module docstring."""

    name = "reinforce_ada"

    exit: str = knob()
    group_size: int = knob()
    round_size: int = knob()
    max_rounds: int = knob()
    pass_reward: float = knob()
    divide_by_std: bool = knob()
    clip: float = knob()
    clip_high: float | None = knob()
    dual_clip: float | None = knob()

    run_settings = {"max_lag": None}

    def _run_spec(self) -> dict[str, Any]:
        return {"rollouts_per_prompt": self.round_size, "plan": self.plan}

    # ----------------------------------------------------------------- sampling side
    def has_exited(self, passes: int, fails: int) -> bool:
        """The authors' exit rule for one prompt, given its pass and fail counts so far."""
        if self.exit == "pos":
            return passes >= 1
        need_passes = self.group_size // 2
        return passes >= need_passes and fails >= self.group_size - need_passes

    def plan(self, rows: Iterable[Mapping[str, Any]], tasks: Iterable[Hashable] = ()) -> SamplingPlan:
        """Which prompts to sample again, and how many rollouts, given every row collected so far.

        ``tasks`` lists prompts that may have no rows yet (they get a first round).
        """
        counts: dict[Hashable, list[int]] = {as_label("task", "task_id", task): [0, 0] for task in tasks}
        for i, row in enumerate(rows):
            if "task_id" not in row or "reward" not in row:
                raise BatchError(f"row {i}: ReinforceAda.plan needs 'task_id' and 'reward' on every row; got keys "
                                 f"{sorted(row)}.")
            passed = float(row["reward"]) >= self.pass_reward
            counts.setdefault(as_label(f"row {i}", "task_id", row["task_id"]), [0, 0])[0 if passed else 1] += 1
        resample, done, exhausted = {}, [], []
        for task, (passes, fails) in counts.items():
            rounds = math.ceil((passes + fails) / self.round_size)
            if self.has_exited(passes, fails):
                done.append(task)
            elif rounds >= self.max_rounds:
                exhausted.append(task)
            else:
                resample[task] = self.round_size
        return SamplingPlan(resample, tuple(done), tuple(exhausted))

    def keep(self, batch: Batch | Iterable[Mapping[str, Any]]) -> np.ndarray:
        """Bool per row: the group_size rows kept per prompt (the authors' downsample_cache), in batch order.

        n // 2 passes, fails up to n, then more passes, then more fails; the first ones of each kind."""
        batch = as_batch(batch)
        keep_B = np.zeros(batch.size, dtype=bool)
        n = self.group_size
        for rows in groups_of(batch, self.name).values():
            passes = [i for i in rows if batch.rewards_B[i] >= self.pass_reward]
            fails = [i for i in rows if batch.rewards_B[i] < self.pass_reward]
            take_pass = min(len(passes), max(n // 2, n - len(fails)))
            take_fail = min(len(fails), n - take_pass)
            keep_B[passes[:take_pass] + fails[:take_fail]] = True
        return keep_B

    # ----------------------------------------------------------------- update side
    def advantages(self, batch: Batch | Iterable[Mapping[str, Any]]) -> np.ndarray:
        """A per row against its prompt's pool (every row of the prompt): R - mean, over std if divide_by_std."""
        batch = as_batch(batch)
        advantage_B = np.zeros(batch.size)
        for rows in groups_of(batch, self.name).values():
            rewards = batch.rewards_B[rows]
            if len(rows) < 2 or np.ptp(rewards) == 0:
                continue  # one row, or a unanimous pool: A = 0
            centred = rewards - rewards.mean()
            advantage_B[rows] = centred / (max(rewards.std(ddof=1), STD_FLOOR) + STD_FLOOR) if self.divide_by_std \
                else centred
        return advantage_B

    def _update(self, batch: Batch) -> Update:
        keep_B = self.keep(batch)
        advantage_B = np.where(keep_B, self.advantages(batch), 0.0)
        coefficients_N = clipped_surrogate(batch, advantage_B, sequence_weights(batch, keep_B), keep_B,
                                           band_of(self)).coefficients_N
        mask = batch.action_mask_N
        stats = {"batch_mean_reward": float(batch.rewards_B.mean()), "admitted_share": float(keep_B.mean()),
                 "mean_ratio": mean_ratio(batch, keep_B)}
        return Update(self.name, batch.split(coefficients_N), batch.split(np.where(mask, batch.spread(advantage_B),
                                                                                   0.0)),
                      keep_B, stats, self._notes(batch, keep_B))

    def _notes(self, batch: Batch, keep_B: np.ndarray) -> list[str]:
        notes = []
        left = np.flatnonzero(~keep_B)
        if left.size:
            notes.append(f"{plural(left.size, 'trajectory', 'trajectories')} {trajectory_list(left)} not kept in their "
                         f"prompt's group of {self.group_size}, c = 0 (they still set the baseline); raise group_size "
                         "to train on more of them")
        groups = groups_of(batch, self.name)
        single = [task for task, rows in groups.items() if len(rows) == 1]
        if single:
            notes.append(f"{plural(len(single), 'prompt')} ({', '.join(repr(t) for t in single[:8])}) "
                         f"{'has' if len(single) == 1 else 'have'} a single rollout, so A = 0 there; "
                         f"{ONE_ROLLOUT_FIX}")
        flat = [task for task, rows in groups.items() if len(rows) > 1 and np.ptp(batch.rewards_B[rows]) == 0]
        if flat:
            notes.append(f"{plural(len(flat), 'prompt')} ({', '.join(repr(t) for t in flat[:8])}) ended unanimous, "
                         "advantage 0: sampling stopped before they mixed passes and fails; follow plan(rows) until "
                         "it is finished, or raise max_rounds or round_size")
        return notes
