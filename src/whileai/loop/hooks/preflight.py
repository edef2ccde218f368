"""The preflight: from the first rollouts (or the first logged traces), is there any signal to learn from?
And after a run with no held-out gain: what do its metrics say went wrong?

``preflight(rows, spec, ...)`` reads one probe of rows, before the RL budget is spent, and returns a
``Preflight``: the signal numbers (share of tasks with any pass, share of groups whose rewards differ for a
group method, mean reward and its spread for a one-rollout method, the share of logged traces admitted at
step 0, the cap against the reference answers) and ``fatal``: each reason the update would be empty, with
the fixes. The loop prints ``str(report)``, writes ``report.to_dict()`` to summary.json's ``preflight``, and
stops on ``report.fatal`` unless ``--force`` (``stop_message``).

``no_gain_reason(records, ...)`` reads a finished run's metrics records (metrics.jsonl) and says in one line
what went wrong when held-out pass@1 did not rise.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from whileai.errors import ConfigError
from whileai.loop.hooks.context import Context
from whileai.loop.plan import rules
from whileai.loop.sources import trace_run
from whileai.loop.types import Hook, Loop, LoopState

if TYPE_CHECKING:
    from whileai.methods.run_spec import RunSpec
    from whileai.trainers import Trainer

PASS = 1.0
"""a pass is reward >= 1.0 (the taskset contract)"""
TIE = 1e-9
"""rewards closer than this count as equal (a group whose rewards all lie within it is unanimous)"""
RARE_PASS = 0.02
"""a run whose rollouts passed less often than this, on average over its steps, learned from too rare a signal"""
FEW_ADMITTED = 0.05
"""a log whose traces the method admits less often than this at step 0 comes from another model: the run stops"""
STALE_SHARE = 0.9
"""a log whose traces the method admits less often than this at step 0 is partly stale (a note names the share)"""
OVERFIT_GAP = 0.1
"""a first RL batch passing more than this above held-out (after a warm start) is a memorised warm start"""
LONG_CAP_FACTOR = 8
"""a cap more than this many times the longest reference answer (+ EOS) earns the 'lower the cap' fix"""


@dataclass(frozen=True)
class Fatal:
    """One reason the run would learn nothing, and what to change."""

    reason: str
    fixes: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.reason}; fix: " + "; or ".join(self.fixes)


@dataclass(frozen=True)
class Preflight:
    """What a probe of rows says about the run's signal. None: not measured (no rows, no traces, no answers)."""

    rollouts: int
    """rows in the probe"""
    tasks: int
    """distinct task ids among them"""
    task_pass_share: float | None
    """share of the probe's tasks with at least one passing rollout"""
    pass_rate: float | None
    """share of the probe's rollouts that pass"""
    mean_reward: float | None
    """mean reward over the probe"""
    reward_spread: float | None
    """population standard deviation of the reward over the probe (a one-rollout method's signal)"""
    split_group_share: float | None
    """group methods: share of the probe's groups (one task's rollouts) whose rewards differ"""
    admitted_share: float | None
    """logged traces (--rows): share the method admitted at step 0"""
    cap: int | None
    """the sampling cap, tokens"""
    longest_answer: int | None
    """the longest reference answer, tokens (without EOS)"""
    answers_within_cap: float | None
    """share of reference answers (+ EOS) that fit under the cap"""
    fatal: tuple[Fatal, ...] = ()
    """each reason the update would be empty; none: the run can learn"""
    notes: tuple[str, ...] = field(default=())
    """weaker warnings (a cap that cuts some answers, a low pass rate)"""

    @property
    def ok(self) -> bool:
        return not self.fatal

    def __str__(self) -> str:
        numbers = [f"{self.rollouts} rollouts over {self.tasks} tasks"] if self.rollouts else []
        for name, value in (("tasks with a pass", self.task_pass_share), ("pass rate", self.pass_rate),
                            ("groups split", self.split_group_share), ("admitted at step 0", self.admitted_share),
                            ("answers within the cap", self.answers_within_cap)):
            if value is not None:
                numbers.append(f"{name} {value:.2f}")
        if self.mean_reward is not None:
            numbers.append(f"reward {self.mean_reward:.3f} +- {self.reward_spread:.3f}")
        if self.cap is not None:
            numbers.append(f"cap {self.cap}" + (f" vs longest answer {self.longest_answer}"
                                                if self.longest_answer is not None else ""))
        lines = ["preflight: " + ("ok" if self.ok else "NO SIGNAL") + ": " + ", ".join(numbers)]
        lines += [f"  fatal: {f}" for f in self.fatal] + [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain values for summary.json (``fatal`` as a list of {reason, fixes})."""
        out = asdict(self)
        out["fatal"] = [{"reason": f.reason, "fixes": list(f.fixes)} for f in self.fatal]
        out["notes"] = list(self.notes)
        out["ok"] = self.ok
        return out

    def stop_message(self) -> str:
        """The error a run stops with when ``fatal`` is not empty (the loop raises it unless --force)."""
        return (f"{self}\nthe run would learn nothing, so it stops before the RL budget is spent: apply a fix "
                "above, or pass --force to train anyway")


def preflight(rows: Sequence[Mapping[str, Any]], spec: RunSpec, *, admitted_share: float | None = None,
              drift: float | None = None, cap: int | None = None, answer_lengths: Sequence[int] = (),
              cap_ends_answer: bool = False, warm_start_steps: int | None = None,
              random_init: bool = False, held_out: float | None = None) -> Preflight:
    """The report for one probe.

    ``rows``: the first rollouts (each with ``reward`` and ``task_id``), or the first logged traces; ``spec``:
    the method's ``RunSpec`` (``rollouts_per_prompt``, ``min_rollouts_per_prompt``, ``source``);
    ``admitted_share`` / ``drift``: the method's admitted share and the mean drift on logged traces at step 0
    (--rows runs; None otherwise); ``cap``: the sampling cap; ``answer_lengths``: the train split's reference
    answers in tokens (``rules.answer_tokens``); ``cap_ends_answer``: the taskset sets the cap as its answers'
    length (``RunPlan.cap_is_answer_length``: an answer as long as the cap needs no EOS); ``warm_start_steps`` and ``random_init``: the plan's, for the
    fixes (a warm start is offered to a random-init model that has none)."""
    learns_from_rewards = getattr(spec, "source", "rollouts") == "rollouts"
    rewards = [float(r["reward"]) for r in rows if r.get("reward") is not None] if learns_from_rewards else []
    groups = _groups(rows) if rewards else {}
    group_method = getattr(spec, "min_rollouts_per_prompt", 1) > 1
    fits = [n + (0 if cap_ends_answer else 1) <= cap for n in answer_lengths] if cap is not None else []
    report = dict(
        rollouts=len(rewards), tasks=len(groups),
        task_pass_share=_share(any(x >= PASS for x in g) for g in groups.values()) if groups else None,
        pass_rate=_share(x >= PASS for x in rewards) if rewards else None,
        mean_reward=statistics.fmean(rewards) if rewards else None,
        reward_spread=statistics.pstdev(rewards) if rewards else None,
        split_group_share=(_share(_split(g) for g in groups.values() if len(g) > 1)
                           if group_method and any(len(g) > 1 for g in groups.values()) else None),
        admitted_share=admitted_share, cap=cap,
        longest_answer=max(answer_lengths) if answer_lengths else None,
        answers_within_cap=_share(fits) if fits else None)
    fixes = _Fixes(spec, cap, answer_lengths, warm_start_steps, random_init, len(rewards))
    fatal, notes = _judge(report, groups, group_method, drift, fixes)
    overfit = memorised(report["pass_rate"], len(rewards), held_out) if warm_start_steps else None
    if overfit is not None:
        notes.append(overfit)
    return Preflight(**report, fatal=tuple(fatal), notes=tuple(notes))  # type: ignore[arg-type]


def memorised(train_pass: float | None, rollouts: int, held_out: float | None) -> str | None:
    """The note when the first RL batch (training tasks) passes clearly more often than held-out tasks did just
    before it: the warm start learned its training answers by heart (a gap above ``OVERFIT_GAP`` and above twice
    its binomial standard error)."""
    if train_pass is None or held_out is None or rollouts == 0:
        return None
    gap = train_pass - held_out
    spread = math.sqrt(max(train_pass * (1 - train_pass), 1e-9) / rollouts + held_out * (1 - held_out) / 64)
    if gap <= OVERFIT_GAP or gap <= 2 * spread:
        return None
    return (f"the warm start overfit: the first batch of training tasks passes {train_pass:.2f}, held-out tasks "
            f"{held_out:.2f} (a gap of {gap:.2f}): it learned the training answers by heart more than the task, and "
            "RL rewards the training tasks it already passes; fewer warm-start steps, or more training tasks")


@dataclass(frozen=True)
class _Fixes:
    """What the fixes may suggest, from the plan."""

    spec: RunSpec
    cap: int | None
    answer_lengths: Sequence[int]
    warm_start_steps: int | None
    random_init: bool
    rollouts: int

    def for_no_pass(self) -> tuple[str, ...]:
        out = []
        if self.random_init and not self.warm_start_steps and self.answer_lengths:
            out.append("a supervised warm start on the reference answers (--warm-start-steps N; the rule's "
                       "default for a random-init model)")
        elif self.random_init and self.warm_start_steps and self.answer_lengths:
            out.append(f"a longer warm start (--warm-start-steps N; this run had {self.warm_start_steps})")
        if self.cap is not None and self.answer_lengths and self.cap > LONG_CAP_FACTOR * (max(self.answer_lengths) + 1):
            out.append(f"a lower cap (--max-tokens {max(self.answer_lengths) + 2}: the longest answer is "
                       f"{max(self.answer_lengths)} tokens, the cap {self.cap})")
        out.append(f"more rollouts per step (--rollouts-per-step; {self.rollouts} without a pass bound the pass "
                   f"rate below {min(1.0, 3 / max(1, self.rollouts)):.2f} at 95%)")
        out.append("easier tasks, or a stronger starting model (--model)")
        return tuple(out)


def _judge(report: Mapping[str, Any], groups: Mapping[object, list[float]], group_method: bool, drift: float | None,
           fixes: _Fixes) -> tuple[list[Fatal], list[str]]:
    fatal, notes = [], []
    if report["admitted_share"] is not None and report["admitted_share"] <= 0:
        at = f" (drift {drift:.3g})" if drift is not None else ""
        fatal.append(Fatal(f"the method dropped every logged trace at step 0{at}: the model scores the logged "
                           "tokens far from the log's own log-probabilities",
                           ("--model the model the logs came from (the one that served them)",
                            "logs sampled from this model")))
    elif report["admitted_share"] is not None and report["admitted_share"] < FEW_ADMITTED:
        at = f" (drift {drift:.3g})" if drift is not None else ""
        fatal.append(Fatal(f"the method admits only {report['admitted_share']:.0%} of the logged traces at step "
                           f"0{at}: nearly every one scores far from its logged log-probabilities, so the logs come "
                           "from another model", ("--model the model the logs came from (the one that served them)",
                                                  "logs sampled from this model")))
    elif report["admitted_share"] is not None and report["admitted_share"] < STALE_SHARE:
        at = f" (mean drift {drift:.3g})" if drift is not None else ""
        notes.append(f"the method admits only {report['admitted_share']:.0%} of the logged traces at step 0{at}: the "
                     "rest score far from their logged log-probabilities, as traces from other weights do (an older "
                     "checkpoint of this model, or another model); it trains on the admitted share only: --model the "
                     "weights that served them, or fresher logs")
    if report["rollouts"] and report["pass_rate"] == 1.0 and fixes.warm_start_steps:
        notes.append(f"every one of the {report['rollouts']} probe rollouts passes after the warm start: RL has no "
                     "reward difference to learn from on these tasks, so its gradients are 0 and only Adam's momentum "
                     "from the warm start moves the weights, a little (the run goes on to measure and export it; "
                     "harder tasks give RL something to do)")
    elif report["rollouts"]:
        fatal += _reward_fatal(report, groups, group_method, fixes)
        if report["pass_rate"] is not None and 0 < report["pass_rate"] < 0.05:
            notes.append(f"only {report['pass_rate']:.1%} of the probe's rollouts pass: the signal is thin")
    within = report["answers_within_cap"]
    if within is not None and within == 0:
        fatal.append(Fatal(f"no reference answer fits under the cap of {report['cap']} tokens (longest "
                           f"{report['longest_answer']}, + EOS), so no completion can be one",
                           (f"--max-tokens {report['longest_answer'] + 2} or more",)))
    elif within is not None and within < 1:
        notes.append(f"{1 - within:.0%} of the reference answers do not fit under the cap of {report['cap']} "
                     f"tokens (longest {report['longest_answer']}, + EOS)")
    return fatal, notes


def _reward_fatal(report: Mapping[str, Any], groups: Mapping[object, list[float]], group_method: bool,
                  fixes: _Fixes) -> list[Fatal]:
    n, spread, mean = report["rollouts"], report["reward_spread"], report["mean_reward"]
    if spread is not None and spread <= TIE:
        if mean >= PASS:
            return [Fatal(f"every one of the {n} probe rows passes (reward {mean:g}): nothing is left to "
                          "learn on these tasks", ("harder tasks", "a held-out split to check the model on"))]
        what = "no rollout passed" if report["pass_rate"] == 0 else "every rollout earned the same reward"
        return [Fatal(f"{what}: all {n} probe rows over {report['tasks']} tasks earned reward {mean:g}, so "
                      "every advantage is 0 and every update is empty", fixes.for_no_pass())]
    if group_method:
        sizes = [len(g) for g in groups.values()]
        need = getattr(fixes.spec, "min_rollouts_per_prompt", 2)
        if max(sizes) < need:
            return [Fatal(f"the method needs {need} rollouts per prompt to compare, but the probe has at most "
                          f"{max(sizes)} per task", (f"--set rollouts_per_prompt={need} or more",
                                                     "a one-rollout method (wai methods)"))]
        if report["split_group_share"] == 0:
            return [Fatal(f"every one of the {len(groups)} groups is unanimous (each task's rollouts earned the "
                          "same reward), so every group advantage is 0",
                          (f"more rollouts per prompt (--set rollouts_per_prompt="
                           f"{2 * getattr(fixes.spec, 'rollouts_per_prompt', 2)})",) + fixes.for_no_pass())]
    return []


def _groups(rows: Sequence[Mapping[str, Any]]) -> dict[object, list[float]]:
    out: dict[object, list[float]] = defaultdict(list)
    for k, row in enumerate(rows):
        if row.get("reward") is not None:
            out[row.get("task_id", k)].append(float(row["reward"]))
    return dict(out)


def _split(rewards: Sequence[float]) -> bool:
    return max(rewards) - min(rewards) > TIE


def _share(flags: Iterable[object]) -> float:
    flags = list(flags)
    return sum(bool(f) for f in flags) / len(flags) if flags else 0.0


# ------------------------------------------------------------------------------------- after the run
LOW_START = 0.2
"""held-out pass@1 after a warm start below this: the warm start did not teach the task (the end-of-run sentence says
so rather than asking for more held-out tasks)"""
ALL_PASSED = 0.98
"""a run whose rollouts passed at least this often over its steps had nothing left to learn on its training tasks"""


def no_gain_reason(records: Sequence[Mapping[str, Any]], compare: Mapping[str, Any] | None = None,
                   cap: int | None = None, warm_start_steps: int = 0) -> str | None:
    """One line saying what the measured quantities show when held-out pass@1 did not rise by a resolved margin,
    or None when it did (``compare``: summary.json's ``compare``, its ``before``, ``after``, ``delta``, ``ci95`` and
    ``excludes_zero``; None: judge the records alone). Every claim is a measured quantity: rewards and pass rates
    of the training rollouts, the admitted share and drift, the gradient, reply lengths against ``cap``, the
    held-out numbers, and ``warm_start_steps`` (the warm start the run had, for the fix it offers).

    ``records``: the run's metrics records (metrics.jsonl), each with ``reward``, ``pass_rate``,
    ``admitted_share``, ``grad_norm``, ``drift``, ``reply_tokens`` and ``learning_rate`` where the loop wrote
    them."""
    if compare is not None and compare.get("excludes_zero") and float(compare.get("delta", 0)) > 0:
        return None
    steps = [r for r in records if "step" in r]
    if not steps:
        return "no training step was recorded: the run stopped before its first update"
    for check in (_never_passed, _all_passed, _all_dropped, _empty_updates, _hit_cap, _rarely_passed):
        reason = check(steps, cap, warm_start_steps)
        if reason is not None:
            return reason
    if compare is not None and warm_start_steps and float(compare.get("before", 1.0)) < LOW_START:
        return (f"the warm start of {warm_start_steps} steps left held-out pass@1 at {compare['before']:.3f}: the model "
                "barely learned the task from its reference answers, so RL had few passes to learn from (held-out "
                f"{compare['before']:.3f} -> {compare['after']:.3f}); check that the answers follow from the prompts, "
                "give more training tasks, or a longer warm start")
    if compare is not None and float(compare.get("delta", 0)) > 0:
        low, high = compare.get("ci95", (0.0, 0.0))
        return (f"held-out pass@1 rose {compare['delta']:+.3f} ({compare['before']:.3f} -> {compare['after']:.3f}) but "
                f"its 95% interval [{low:+.3f}, {high:+.3f}] includes 0: a gain this size is not resolved over "
                f"{compare.get('tasks', '?')} tasks (more held-out tasks, --eval-tasks, or seeds)")
    reason = _reward_trend(steps, compare)
    if reason is not None:
        return reason
    return "the metrics show no single cause: training reward moved but held-out pass@1 did not (more steps, " \
           "more held-out tasks, or a different learning rate)"


def _values(steps: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in steps if r.get(key) is not None]


def _never_passed(steps: Sequence[Mapping[str, Any]], cap: int | None, warm: int) -> str | None:
    rewards, passes = _values(steps, "reward"), _values(steps, "pass_rate")
    if rewards and max(rewards) - min(rewards) <= TIE and (not passes or max(passes) == 0):
        fix = (f"a longer warm start than its {warm} steps" if warm else "a warm start") + \
            ", a lower cap, or easier tasks"
        return (f"reward was {rewards[0]:g} on every one of {len(rewards)} steps: no rollout ever passed, so "
                f"every update was empty ({fix})")
    return None


def _all_passed(steps: Sequence[Mapping[str, Any]], cap: int | None, warm: int) -> str | None:
    passes = _values(steps, "pass_rate")
    if passes and statistics.fmean(passes) >= ALL_PASSED:
        after = f" after a warm start of {warm} steps" if warm else ""
        return (f"rollouts passed {statistics.fmean(passes):.1%} of the time over {len(passes)} steps{after}: nothing "
                "was left for RL to learn on the training tasks, since equal rewards give no advantage (harder "
                "training tasks; the updates carried no reward signal, so the held-out change is the warm start's "
                "momentum and sampling noise, not RL)")
    return None


def _all_dropped(steps: Sequence[Mapping[str, Any]], cap: int | None, warm: int) -> str | None:
    admitted = _values(steps, "admitted_share")
    if admitted and max(admitted) <= 0:
        drift = _values(steps, "drift")
        at = f" (drift {statistics.fmean(drift):.3g})" if drift else ""
        return (f"the method admitted no trace on any of {len(admitted)} steps{at}: the logs come from another "
                "model (--model the one that wrote them)")
    return None


def _empty_updates(steps: Sequence[Mapping[str, Any]], cap: int | None, warm: int) -> str | None:
    norms = _values(steps, "grad_norm")
    if norms and max(norms) == 0:
        return (f"the gradient was 0 on every one of {len(norms)} steps: every batch's rewards were equal (every "
                "group unanimous), so no update moved the model (more rollouts per prompt, or easier tasks)")
    return None


def _hit_cap(steps: Sequence[Mapping[str, Any]], cap: int | None, warm: int) -> str | None:
    lengths = _values(steps, "reply_tokens")
    if cap is not None and lengths and min(lengths) >= 0.95 * cap:
        return (f"replies averaged {statistics.fmean(lengths):.0f} tokens against a cap of {cap} on every step: "
                "the model never stopped on its own (a warm start that ends answers with EOS, or a lower cap)")
    return None


def _rarely_passed(steps: Sequence[Mapping[str, Any]], cap: int | None, warm: int) -> str | None:
    passes = _values(steps, "pass_rate")
    if passes and statistics.fmean(passes) < RARE_PASS:
        return (f"rollouts passed {statistics.fmean(passes):.1%} of the time over {len(passes)} steps: too rare a "
                "signal to learn from (a longer warm start, easier tasks, or more rollouts per step)")
    return None


def _reward_trend(steps: Sequence[Mapping[str, Any]], compare: Mapping[str, Any] | None) -> str | None:
    """Training reward first fifth against last, told only where held-out agrees (did not rise)."""
    rewards = _values(steps, "reward")
    if len(rewards) < 5:
        return None
    fifth = max(1, len(rewards) // 5)
    first, last = statistics.fmean(rewards[:fifth]), statistics.fmean(rewards[-fifth:])
    rates = _values(steps, "learning_rate")
    rate = f" at learning rate {rates[0]:g}" if rates else ""
    held = (f" and held-out pass@1 went {compare['before']:.3f} -> {compare['after']:.3f}"
            if compare is not None and "before" in compare else "")
    if last < first - 0.05:
        return (f"training reward fell from {first:.3f} to {last:.3f} (first to last fifth){rate}{held}: the "
                "updates undid what the model knew (a lower --learning-rate)")
    if abs(last - first) <= 0.02:
        return (f"training reward stayed at {first:.3f} -> {last:.3f} (first to last fifth){rate}{held}: the "
                "updates did not move the policy (more steps, or a higher --learning-rate)")
    return None


@dataclass
class PreflightHook(Hook):
    """Before the first update: is there any signal in the first batch (the first rollouts, or the file's first
    traces)? Printed, kept for summary.json; a run that would learn nothing stops here, before the RL budget is
    spent, with the reasons and the fixes, unless ``--force`` (whileai.loop.hooks.preflight). It reads the batch the
    first step trains on, so it samples and grades nothing of its own."""

    ctx: Context

    def before_update(self, loop: Loop) -> None:
        if loop.state.step > 0 or loop.state.preflight is not None or self.ctx.method.run_spec().source != "rollouts":
            return
        report = preflight(self.signal_rows(loop), self.ctx.method.run_spec(),
                           **self.measured(loop.trainer, loop.state, loop.batch))
        loop.state.preflight = report.to_dict()
        if not report.ok and not self.ctx.config.force:
            raise ConfigError(report.stop_message())  # the report once, in the error (not also above it)
        self.ctx.log.write(str(report))

    def signal_rows(self, loop: Loop) -> list[dict[str, Any]]:
        """The rows the signal is read from: the first batch of rollouts; from a log, every trace it trains on
        (the whole file is at hand, and its first batch is only a sample of it)."""
        source = self.ctx.rows
        if source is None:
            return list(loop.batch)
        return [{"reward": float(source.reward_T[i]), "task_id": source.task_ids[source.task_T[i]]}
                for i in np.flatnonzero(~source.heldout_T & np.isfinite(source.reward_T))]

    def measured(self, trainer: Trainer, state: LoopState, loop_batch: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """What the preflight reads besides the rows: the admitted share and drift of held-out traces at step 0
        (a run from a file; from a recorder, of ``loop_batch``, the first batch), the cap and the reference answers' lengths, the warm start."""
        plan = self.ctx.plan
        out: dict[str, Any] = {}
        heldout = trace_run.heldout_summary(self.ctx.run_dir) if self.ctx.rows is not None else {}
        measured = heldout.get("heldout_traces", {})
        before = measured.get("before") or measured.get("step0") or {}
        if self.ctx.config.rows_from is not None and loop_batch:  # traces from a recorder: the first batch's
            before = trace_run.measure_rows(trainer, self.ctx.method, [dict(r) for r in loop_batch],
                                            plan.sampling(), state.method_state)
        if before:
            out.update(admitted_share=before.get("admitted_share"), drift=before.get("drift"))
        if self.ctx.taskset is not None and self.ctx.rows is None:
            encode = trainer.tokenizer.encode
            out["answer_lengths"] = rules.answer_tokens((t.answer for t in self.ctx.taskset.split("train")),
                                                        lambda text: encode(text, add_special_tokens=False))
        if self.ctx.rows is None and state.evals and state.evals[0]["step"] == 0:  # held-out pass@1 after the warm start
            out["held_out"] = state.evals[0]["pass_at_1"]
        sampled = self.ctx.config.rows_from is None  # recorded traffic was capped by its server, not by this plan
        return {**out, "cap": plan.max_tokens if sampled else None, "cap_ends_answer": plan.cap_is_answer_length,
                "warm_start_steps": plan.warm_start_steps, "random_init": plan.model.startswith("builtin:")}
