"""Which rows teach anything: ``select`` keeps them per training mode, ``selection_report`` counts.

* ``mode="rl"`` drops every task whose rollouts all pass or all fail: a grouped method gives each
  of them an advantage of 0 (DAPO's dynamic sampling), so they cost compute and teach nothing.
* ``mode="sft"`` keeps the passes, except a pass the token cap cut off (it would teach running
  to the cap; fix the reward instead).
* ``mode="dpo"`` pairs a pass with a fail of the same task, closest lengths first, each row used
  at most once, so length alone does not tell chosen from rejected. Each kept row gains ``"pair"``
  (the pair's number) and ``"chosen"`` (true for the pass), the explicit pairing ``wai.DPO`` reads.

Every dropped row is counted in ``notes``; nothing is dropped silently.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from whileai.errors import ConfigError
from whileai.rows.checks import expected_split_share, model_mix
from whileai.rows.io import GradedRows, as_graded, load_rows, pass_threshold, plural
from whileai.rows.stats import Rows, format_table, pass_at, task_counts

MODES: tuple[str, ...] = ("rl", "sft", "dpo")


@dataclass(frozen=True, eq=False)
class Selection:
    """What ``select`` kept. ``rows`` holds the kept rows (dpo: each with ``pair`` and ``chosen``
    added, chosen first); ``kept_R`` their indices in the input; ``pairs`` the (chosen, rejected) indices."""

    mode: str
    kept_R: np.ndarray
    pairs: tuple[tuple[int, int], ...]
    n_rows: int
    n_tasks: int
    notes: tuple[str, ...]
    rows: tuple[Mapping[str, Any], ...] = ()

    def __len__(self) -> int:
        return len(self.pairs) if self.mode == "dpo" else len(self.kept_R)

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return iter(self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "kept": len(self), "n_rows": self.n_rows, "n_tasks": self.n_tasks,
                "notes": list(self.notes)}

    def __str__(self) -> str:
        what = (plural(len(self.pairs), "pair") if self.mode == "dpo"
                else f"kept {len(self.kept_R)} of {plural(self.n_rows, 'row')}")
        return "\n".join([f"select(mode={self.mode!r}): {what} ({plural(self.n_tasks, 'task')})"]
                         + [f"  {note}" for note in self.notes])


def select(rows: Rows, mode: str = "rl", threshold: float | None = None) -> Selection:
    """Keep the rows that teach ``mode`` ("rl", "sft" or "dpo"); ``notes`` says what went and why."""
    if mode not in MODES:
        raise ConfigError(f"select: mode={mode!r} is not one of {', '.join(map(repr, MODES))}.")
    if isinstance(rows, (str, os.PathLike)):
        rows = load_rows(rows, require=("task_id", "reward"))
    dicts = None if isinstance(rows, GradedRows) else tuple(rows)
    graded = as_graded(rows if dicts is None else dicts, lengths=mode == "dpo")
    kept, pairs, notes = select_indices(graded, mode, threshold)
    out: tuple[Mapping[str, Any], ...] = ()
    if dicts is not None and mode == "dpo":
        out = tuple(row for n, (c, r) in enumerate(pairs)
                    for row in ({**dicts[c], "pair": n, "chosen": True}, {**dicts[r], "pair": n, "chosen": False}))
    elif dicts is not None:
        out = tuple(dicts[i] for i in kept)
    return Selection(mode, kept, pairs, graded.n_rows, graded.n_tasks, tuple(notes), out)


def select_indices(graded: GradedRows, mode: str, threshold: float | None = None
                   ) -> tuple[np.ndarray, tuple[tuple[int, int], ...], list[str]]:
    """(kept row indices, dpo pairs, notes) for ``mode``; the column form ``wai select`` streams."""
    threshold = pass_threshold(graded.reward_R, threshold, graded.source)
    if mode in ("rl", "sft"):
        kept, notes = (_select_rl if mode == "rl" else _select_sft)(graded, threshold)
        return kept, (), notes
    if mode == "dpo":
        pairs, notes = _select_dpo(graded, threshold)
        kept = np.array(sorted(i for pair in pairs for i in pair), dtype=np.int64)
        return kept, tuple(pairs), notes
    raise ConfigError(f"select: mode={mode!r} is not one of {', '.join(map(repr, MODES))}.")


def _select_rl(graded: GradedRows, threshold: float) -> tuple[np.ndarray, list[str]]:
    samples, passes = task_counts(graded, threshold)
    all_fail, all_pass = passes == 0, passes == samples
    unanimous = all_fail | all_pass
    keep = ~unanimous[graded.task_R]
    dropped = int(np.count_nonzero(~keep))
    notes = [f"dropped {plural(dropped, 'row')} of {plural(int(unanimous.sum()), 'unanimous task')} ({int(all_fail.sum())} all "
             f"fail, {int(all_pass.sum())} all pass): a group that agrees has advantage 0 on every "
             "rollout, so it teaches a grouped method nothing"]
    singles = int(np.count_nonzero(samples == 1))
    if singles:
        notes.append(f"{plural(singles, 'task')} {'has' if singles == 1 else 'have'} a single rollout, and a group of one always agrees with itself: "
                     "sample k >= 4 per task, or use a batch-baseline method (FlashReinforce, SAO, BPCO)")
    cut = int(np.count_nonzero(graded.truncated_R & (graded.reward_R >= threshold) & keep))
    if cut:
        notes.append(f"{plural(cut, 'kept row')} {'is a truncated pass' if cut == 1 else 'are truncated passes'}: a reply cut at the token cap scored; fix the "
                     "reward before training on them")
    return np.flatnonzero(keep), notes


def _select_sft(graded: GradedRows, threshold: float) -> tuple[np.ndarray, list[str]]:
    passed = graded.reward_R >= threshold
    cut = passed & graded.truncated_R
    keep = passed & ~cut
    notes = [f"dropped {plural(int(np.count_nonzero(~passed)), 'failing row')} (reward < {threshold:g})"]
    if cut.any():
        notes.append(f"dropped {plural(int(cut.sum()), 'truncated pass', 'truncated passes')}: a reply cut at the token cap should not "
                     "score, and training on it teaches running to the cap; fix the reward")
    return np.flatnonzero(keep), notes


def _select_dpo(graded: GradedRows, threshold: float) -> tuple[list[tuple[int, int]], list[str]]:
    if graded.length_R is None:
        raise ConfigError("select(mode='dpo') needs each row's length: load the rows with lengths=True.")
    passed = (graded.reward_R >= threshold) & ~graded.truncated_R
    failed = graded.reward_R < threshold
    order = np.argsort(graded.task_R, kind="stable")
    bounds = np.flatnonzero(np.diff(graded.task_R[order])) + 1
    pairs: list[tuple[int, int]] = []
    for members in np.split(order, bounds):
        pairs += _closest_pairs(members[passed[members]], members[failed[members]], graded.length_R)
    pairs.sort()
    gaps = [abs(int(graded.length_R[c]) - int(graded.length_R[r])) for c, r in pairs]
    used = 2 * len(pairs)
    notes = [f"built {plural(len(pairs), 'pair')} (a pass and a fail of the same task, closest lengths first); "
             f"{plural(graded.n_rows - used, 'row')} left unpaired (a task's surplus passes or fails, tasks with no "
             "pass or no fail" + (", truncated passes" if (graded.truncated_R & ~failed).any() else "") + ")"]
    if pairs:
        notes.append(f"length gap per pair: median {float(np.median(gaps)):g}, max {max(gaps)}")
    return pairs, notes


def _closest_pairs(pass_idx: np.ndarray, fail_idx: np.ndarray, length_R: np.ndarray) -> list[tuple[int, int]]:
    """Greedy: the pass/fail pair with the smallest length gap first, ties by row order, no reuse."""
    if not len(pass_idx) or not len(fail_idx):
        return []
    gap = np.abs(length_R[pass_idx][:, None] - length_R[fail_idx][None, :])
    flat = np.lexsort((np.repeat(np.arange(len(pass_idx)), len(fail_idx)), gap.ravel()))
    used_p, used_f, out = set(), set(), []
    for cell in flat:
        p, f = divmod(int(cell), len(fail_idx))
        if p not in used_p and f not in used_f:
            used_p.add(p)
            used_f.add(f)
            out.append((int(pass_idx[p]), int(fail_idx[f])))
            if len(out) == min(len(pass_idx), len(fail_idx)):
                break
    return out


# --------------------------------------------------------------------------- the report
@dataclass(frozen=True)
class SelectionReport:
    """Per-band counts, split share, truncation, model mix and what each mode would keep."""

    n_rows: int
    n_tasks: int
    rollouts_min: int
    rollouts_max: int
    threshold: float
    pass_at_1: float
    ci95: tuple[float, float]  # for the task population
    ci95_fixed: tuple[float, float]  # for this fixed benchmark (rollout noise only)
    tasks_all_fail: int
    tasks_split: int
    tasks_all_pass: int
    split_share: float
    expected_split_share: dict[int, float]
    truncated_rows: int
    truncated_passes: int
    model_mix: dict[str, int]
    keeps: dict[str, dict[str, int]]
    notes: tuple[str, ...] = ()  # e.g. fields on the rows that nothing reads

    @property
    def band(self) -> str:
        if self.tasks_all_fail == self.n_tasks:
            return "floor"
        if self.tasks_all_pass == self.n_tasks:
            return "saturated"
        return "mixed"

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["ci95"], out["ci95_fixed"], out["notes"] = list(self.ci95), list(self.ci95_fixed), list(self.notes)
        out["band"] = self.band
        out["expected_split_share"] = {str(k): v for k, v in self.expected_split_share.items()}
        return out

    def __str__(self) -> str:
        k = (f"{self.rollouts_min}" if self.rollouts_min == self.rollouts_max
             else f"{self.rollouts_min}-{self.rollouts_max}")
        (lo, hi), (f_lo, f_hi) = self.ci95, self.ci95_fixed
        head = [f"{plural(self.n_rows, 'row')}, {plural(self.n_tasks, 'task')}, {k} "
                f"{'rollout' if k == '1' else 'rollouts'} per task (a pass is reward >= {self.threshold:g})",
                f"pass@1 {self.pass_at_1:.3f} [{lo:.3f}, {hi:.3f}] (95%, for the task population; [{f_lo:.3f}, "
                f"{f_hi:.3f}] for this fixed benchmark); band: {self.band}", ""]
        share = lambda n: f"{n / self.n_tasks:.1%}"  # noqa: E731
        bands = format_table([("tasks", "count", "share"), ("all fail", str(self.tasks_all_fail),
                              share(self.tasks_all_fail)), ("split", str(self.tasks_split), share(self.tasks_split)),
                              ("all pass", str(self.tasks_all_pass), share(self.tasks_all_pass))])
        more = []
        if self.expected_split_share:
            at = "   ".join(f"k={kk} {v:.1%}" for kk, v in self.expected_split_share.items())
            more = ["split share expected of fresh rollouts (plug-in from each task's rate; on the low side, a task "
                    "seen unanimous counts as never splitting):", f"  {at}   (raising k buys the difference)", ""]
        trunc = [f"truncated: {plural(self.truncated_rows, 'row')}, {self.truncated_passes} of them pass"
                 + ("  <- fix the reward first: a cut-off reply scores" if self.truncated_passes else "")]
        models = format_table([("model", "rows")] + [(m, str(n)) for m, n in self.model_mix.items()])
        keeps = format_table([("mode", "keeps")] + [(mode, ", ".join(plural(n, what[:-1]) for what, n in kept.items()))
                                                   for mode, kept in self.keeps.items()])
        notes = ["", *(f"note: {note}" for note in self.notes)] if self.notes else []
        return "\n".join(head + [bands, ""] + more + trunc + ["", models, "", keeps] + notes)


def selection_report(rows: Rows, threshold: float | None = None) -> SelectionReport:
    """Count what the rows hold: bands, split share, truncation, models, and each mode's keep."""
    graded = as_graded(rows)
    rate = pass_at(graded, threshold=threshold)
    threshold = rate.threshold
    samples, passes = rate.samples_T, rate.passes_T
    rates = rate.rates_T
    all_fail, all_pass = int(np.count_nonzero(passes == 0)), int(np.count_nonzero(passes == samples))
    split = graded.n_tasks - all_fail - all_pass
    k_min, k_max = int(samples.min()), int(samples.max())
    more = ({kk: float(expected_split_share(rates, kk).mean()) for kk in (k_min, 2 * k_min, 4 * k_min)}
            if k_min > 1 else {})
    cut = graded.truncated_R & (graded.reward_R >= threshold)
    clean_passes = np.bincount(graded.task_R, weights=(graded.reward_R >= threshold) & ~graded.truncated_R,
                               minlength=graded.n_tasks)
    split_T = (passes > 0) & (passes < samples)
    keeps = {"rl": {"rows": int(samples[split_T].sum()), "tasks": int(split_T.sum())},
             "sft": {"rows": int(np.count_nonzero((graded.reward_R >= threshold) & ~graded.truncated_R))},
             "dpo": {"pairs": int(np.minimum(clean_passes, samples - passes).sum())}}
    return SelectionReport(graded.n_rows, graded.n_tasks, k_min, k_max, threshold, rate.pass_at_1, rate.ci95,
                           rate.ci95_fixed, all_fail, split, all_pass, split / graded.n_tasks, more,
                           int(graded.truncated_R.sum()), int(cut.sum()), model_mix(graded), keeps, graded.field_notes)
