"""Methods that shape a grouped update: GroupwiseGrading (GRS / GAR) and ReinforceAda.

**GroupwiseGrading** (MiMo-V2.6 2026, section 4.3, as the pick-a-method guide describes it). Binary
reward makes every pass of a group equal; a grader tells them apart. Per ``task_id`` group with at
least two passes (``reward >= pass_reward``), ``grader(passing_rows)`` returns one score per pass.

- ``mode="reward"`` (GRS): a pass that ``h`` other passes of its group outscore gets
  ``R' = R - spread * h / (n_p - 1)``: the best keeps ``R``, a sole worst gets ``R - spread``, ties
  share a reward. The wrapped grouped method (default GRPO) then runs on ``R'``, so a group where every
  rollout passes is no longer unanimous.
- ``mode="advantage"`` (GAR): the wrapped method's advantage ``A`` (from its own update on the raw
  rewards) gets ``+ spread * (u - 1/2)``, ``u`` the pass's average rank scaled to [0, 1] (0 worst), a
  zero-mean term over the passes; ``c`` is then GRPO's surrogate with the wrapped method's ``clip`` and
  length weight (``loss_type``, via its ``_weights``) on the shaped advantage.

**ReinforceAda** (Xiong et al. 2025, arXiv:2510.04996). Keep sampling a prompt until its rows can
teach: ``exit="balance"`` stops a prompt once it has ``group_size/2`` passes and ``group_size/2``
fails, ``exit="pos"`` once it has one pass; ``max_rounds`` rounds of ``round_size`` rollouts cap the
budget. ``plan(rows)`` is that sampling side as a pure function of the rows so far; ``update(rows)``
keeps ``group_size`` rows per prompt (passes and fails balanced), takes the baseline from *every* row
collected for the prompt (the paper's global statistics: ``A = (R - mean) / (std + 1e-6)``, sample
std) and applies GRPO's surrogate with ``w_i = 1/(B_kept T_i)``. Rows not kept get ``c = 0`` and a note.
Differs from the paper: its rounds run inside the sampler; here the loop calls ``plan`` between rounds.
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
from whileai.methods.grouped import ONE_ROLLOUT_FIX, clipped_surrogate
from whileai.methods.supervised import mean_ratio
from whileai.rows.batch import Batch, as_batch

Grader = Callable[[list[Mapping[str, Any]]], Sequence[float]]


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


def average_ranks(scores: np.ndarray) -> np.ndarray:
    """0-based ranks, ascending, ties sharing the average of their positions."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(len(scores), dtype=np.float64)
    for value in np.unique(scores):
        tied = scores == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def outscored_by(scores: np.ndarray) -> np.ndarray:
    """For each entry, how many others score strictly higher."""
    return (scores[None, :] > scores[:, None]).sum(axis=1).astype(np.float64)


# --------------------------------------------------------------------- GroupwiseGrading
@dataclass(frozen=True)
class GroupwiseGrading(Method):
    """Rank the passes of each group with a grader and shape a grouped method's reward (GRS) or
    advantage (GAR); MiMo-V2.6 2026, section 4.3. Formulas: module docstring.

    ``grader(rows) -> scores``: called once per group with two or more passes, with that group's
    passing rows, returning one finite score per row (higher is better). ``method``: the grouped method
    to wrap, an object or a name (default ``"grpo"``). Differs from the paper: the rank-to-reward and
    rank-to-advantage maps are linear in rank with one knob, ``spread``.
    """

    name = "groupwise_grading"

    grader: Grader | None = None
    mode: str = knob("groupwise_grading", "mode")
    method: Any = "grpo"
    spread: float = knob("groupwise_grading", "spread")
    pass_reward: float = knob("groupwise_grading", "pass_reward")

    def __post_init__(self) -> None:
        if isinstance(self.method, str):
            from whileai.methods.registry import method as by_name

            object.__setattr__(self, "method", by_name(self.method))
        super().__post_init__()

    def _check(self) -> list[str]:
        problems = []
        if not callable(self.grader):
            problems.append(f"GroupwiseGrading.grader={self.grader!r} is invalid: it must be a callable taking one "
                            "group's passing rows and returning one score per row (higher is better); it is Python "
                            "code, so GroupwiseGrading runs from Python, not from `wai update`")
        if not isinstance(self.method, Method) or isinstance(self.method, GroupwiseGrading):
            problems.append(f"GroupwiseGrading.method={self.method!r} is invalid: it must be a grouped method "
                            "(wai.GRPO(), wai.RLOO(), wai.MaxRL(), or its name)")
        elif self.mode == "advantage" and (beta := float(getattr(self.method, "beta", 0.0) or 0.0)) > 0:
            problems.append("GroupwiseGrading(mode='advantage') recomputes the surrogate without the KL term, so "
                            f"the wrapped method's beta must be 0 (got {beta:g}); use mode='reward'")
        return problems

    def _update(self, batch: Batch) -> Update:
        scored = self._grade(batch)
        inner: Method = self.method
        if self.mode == "reward":
            shaped_B = batch.rewards_B.copy()
            for rows, scores in scored:
                shaped_B[rows] -= self.spread * outscored_by(scores) / (len(rows) - 1)
            update = inner.update(replace(batch, rewards_B=shaped_B))
            shift = float(np.abs(shaped_B - batch.rewards_B).mean())
        else:
            update = inner.update(batch)
            bonus_B = np.zeros(batch.size)
            for rows, scores in scored:
                bonus_B[rows] = self.spread * (average_ranks(scores) / (len(rows) - 1) - 0.5)
            update = self._shape_advantages(batch, update, bonus_B)
            if scored:
                update.notes.append("mode='advantage': the grader's rank term was added after the grouped update, so "
                                    "a group called unanimous above still trains its passes by rank")
            shift = float(np.abs(bonus_B).mean())
        update.method = self.name
        update.stats["graded_groups"] = float(len(scored))
        update.stats["mean_shaping"] = shift
        if not scored:
            update.notes.append(f"no group has two or more passes (reward >= {self.pass_reward:g}), so the grader "
                                "ranked nothing and this is the plain grouped update; sample more rollouts per task")
        return update

    def _grade(self, batch: Batch) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        grader = cast(Grader, self.grader)  # checked callable in _check
        for task, rows in groups_of(batch, self.name).items():
            passes = np.array([i for i in rows if batch.rewards_B[i] >= self.pass_reward], dtype=np.int64)
            if passes.size < 2:
                continue
            scores = grader([batch.rows[i] for i in passes])
            try:
                arr = np.asarray(scores, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                arr = np.zeros(0)
            if arr.size != passes.size or not np.isfinite(arr).all():
                raise BatchError(f"row {passes[0]}: the grader returned {scores!r} for the {passes.size} passes of "
                                 f"task {task!r}; it must return one finite score per passing row, in order.")
            out.append((passes, arr))
        return out

    def _shape_advantages(self, batch: Batch, update: Update, bonus_B: np.ndarray) -> Update:
        inner = self.method
        mask = batch.action_mask_N
        first_action = np.array([int(np.flatnonzero(m)[0]) for m in batch.split(mask)])
        advantage_B = np.array([a[k] for a, k in zip(update.advantages, first_action)]) + bonus_B
        include_B = ~(batch.truncated_B & (getattr(inner, "truncated", "mask") == "mask"))
        advantage_B = np.where(include_B, advantage_B, 0.0)
        # the wrapped method's own length weight (GRPO's loss_type) when it exposes one, else 1/(B T_i)
        weights = getattr(inner, "_weights", None)
        weight_B = weights(batch) if callable(weights) else sequence_weights(batch, np.ones(batch.size, dtype=bool))
        surrogate = clipped_surrogate(batch, advantage_B, weight_B, include_B, float(getattr(inner, "clip", 0.2)))
        update.coefficients = batch.split(surrogate.coefficients_N)
        update.advantages = batch.split(np.where(mask, batch.spread(advantage_B), 0.0))
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
    """Adaptive sampling until a prompt's rows mix passes and fails, then a grouped update with
    global-statistics baselines (Xiong et al. 2025, arXiv:2510.04996). Formulas: module docstring."""

    name = "reinforce_ada"

    exit: str = knob("reinforce_ada", "exit")
    group_size: int = knob("reinforce_ada", "group_size")
    round_size: int = knob("reinforce_ada", "round_size")
    max_rounds: int = knob("reinforce_ada", "max_rounds")
    pass_reward: float = knob("reinforce_ada", "pass_reward")
    clip: float = knob("reinforce_ada", "clip")

    # ----------------------------------------------------------------- sampling side
    def has_exited(self, passes: int, fails: int) -> bool:
        """The paper's exit rule for one prompt, given its pass and fail counts so far."""
        if self.exit == "pos":
            return passes >= 1
        half = self.group_size // 2
        return passes >= half and fails >= half

    def plan(self, rows: Iterable[Mapping[str, Any]], tasks: Iterable[Hashable] = ()) -> SamplingPlan:
        """Which prompts to sample again, and how many rollouts, given every row collected so far.

        ``tasks`` lists prompts that may have no rows yet (they get a first round).
        """
        counts: dict[Hashable, list[int]] = {task: [0, 0] for task in tasks}
        for i, row in enumerate(rows):
            if "task_id" not in row or "reward" not in row:
                raise BatchError(f"row {i}: ReinforceAda.plan needs 'task_id' and 'reward' on every row; got keys "
                                 f"{sorted(row)}.")
            passed = float(row["reward"]) >= self.pass_reward
            counts.setdefault(row["task_id"], [0, 0])[0 if passed else 1] += 1
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
        """Bool per row: the group_size rows kept per prompt, passes and fails balanced, in batch order."""
        batch = as_batch(batch)
        keep_B = np.zeros(batch.size, dtype=bool)
        for rows in groups_of(batch, self.name).values():
            passes = [i for i in rows if batch.rewards_B[i] >= self.pass_reward]
            fails = [i for i in rows if batch.rewards_B[i] < self.pass_reward]
            take_pass = min(len(passes), max(self.group_size // 2, self.group_size - len(fails)))
            take_fail = min(len(fails), self.group_size - take_pass)
            keep_B[passes[:take_pass] + fails[:take_fail]] = True
        return keep_B

    # ----------------------------------------------------------------- update side
    def _update(self, batch: Batch) -> Update:
        keep_B = self.keep(batch)
        advantage_B = np.zeros(batch.size)
        for rows in groups_of(batch, self.name).values():
            rewards = batch.rewards_B[rows]
            std = rewards.std(ddof=1) if len(rows) > 1 else 0.0
            advantage_B[rows] = (rewards - rewards.mean()) / (std + 1e-6) if np.ptp(rewards) > 0 else 0.0
        advantage_B = np.where(keep_B, advantage_B, 0.0)
        coefficients_N = clipped_surrogate(batch, advantage_B, sequence_weights(batch, keep_B), keep_B,
                                           self.clip).coefficients_N
        mask = batch.action_mask_N
        stats = {"batch_mean_reward": float(batch.rewards_B.mean()), "admitted_share": float(keep_B.mean()),
                 "mean_ratio": mean_ratio(batch, keep_B)}
        return Update(self.name, batch.split(coefficients_N), batch.split(np.where(mask, batch.spread(advantage_B),
                                                                                   0.0)),
                      keep_B, stats, self._notes(batch, keep_B, advantage_B))

    def _notes(self, batch: Batch, keep_B: np.ndarray, advantage_B: np.ndarray) -> list[str]:
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

