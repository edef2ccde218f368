"""The end of a run: the last held-out evaluation, the final weights, summary.json, evals, curves, the report."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from whileai.loop.hooks.context import Context
from whileai.loop.hooks.held_out import before_after, eval_line
from whileai.loop.hooks.metrics import plot, write_json
from whileai.loop.hooks.preflight import no_gain_reason
from whileai.loop.hooks.warm_start import WARM_START_END
from whileai.loop.plan import rules
from whileai.loop.sources import trace_run
from whileai.loop.types import LoopState
from whileai.methods import Method


def finish(ctx: Context, state: LoopState, seconds: float, first_step: int = 0) -> tuple[dict[str, Any], Path | None]:
    """Write summary.json, evals.json, heldout*.jsonl, curves.png and RUN_DIR/final; return the summary and
    the final weights' folder (None without --export). ``first_step``: where a resumed run's session began."""
    method, plan, spec = ctx.method, ctx.plan, ctx.method.run_spec()
    summary: dict[str, Any] = {"run_spec": spec.describe(), "steps": state.step, "seconds": round(seconds, 2),
                               "run_dir": str(ctx.run_dir), "where": ctx.trainer.where}
    if first_step:  # a resume: the seconds are this session's, so are its steps
        summary["resumed_at_step"] = first_step
    summary["resolved"] = resolved(ctx)
    summary["method"] = as_run(method, summary["resolved"])
    summary["plan"] = {"values": plan.values(), "sources": dict(plan.sources)}
    if plan.notes:  # what the checks before the warm start said (whileai.loop.plan.inputs)
        summary["notes"] = list(plan.notes)
    records = ctx.metrics.read()
    summary.update(fifths(records, spec.source == "rows", ctx.rows is not None))
    if ctx.can_eval():
        state.evals.append({"step": state.step, **ctx.evaluate()})
        ctx.metrics.scalar("eval/pass_at_1", state.evals[-1]["pass_at_1"], state.step)
        before, after = state.evals[0], state.evals[-1]
        summary["eval_before"] = {k: v for k, v in before.items() if k != "rows"}
        summary["eval_after"] = {k: v for k, v in after.items() if k != "rows"}
        summary["compare"] = before_after(before, after)
        reason = no_gain_reason(records, summary["compare"], cap=plan.max_tokens,
                                warm_start_steps=state.warm_start_steps_done)
        if reason is not None:
            summary["no_gain_reason"] = reason
        kept = keep_warm_start(ctx, state, summary["compare"])
        if kept is not None:
            summary["kept_warm_start"] = kept
            ctx.log.write(f"{kept['reason']}; the final weights are the warm start's end, measured again: "
                          f"{eval_line(kept['held_out'])}")
    if state.preflight is not None:
        summary["preflight"] = state.preflight
    if state.warm_start_steps_done:
        summary["warm_start_steps_run"] = state.warm_start_steps_done
    if ctx.rows is not None:  # a traces run without an eval taskset: its held-out traces, never a pass rate
        summary.update(trace_run.finish(ctx.rows, method, ctx.config, ctx.run_dir, ctx.trainer,
                                        plan.sampling(), state.method_state))
    weights = None
    if ctx.config.export:
        weights = Path(ctx.trainer.export(str(ctx.run_dir / "final"), merged=not ctx.config.lora_rank))
        summary["weights"] = str(weights)
    evals = [{k: v for k, v in e.items() if k != "rows"} for e in state.evals]
    summary["plot"] = str(plot(records, evals, ctx.run_dir / "curves.png",
                               f"{method.name} on {ctx.config.taskset or ctx.config.rows}"))
    summary["report"] = report(summary)
    write_json(ctx.run_dir / "summary.json", summary)
    write_json(ctx.run_dir / "evals.json", evals)
    if state.evals:  # the last held-out evaluation as graded rows: `wai compare` pairs two runs on it
        for name, which in (("heldout.jsonl", -1), ("heldout-before.jsonl", 0)):  # and the first: before/after
            (ctx.run_dir / name).write_text("".join(json.dumps(r) + "\n" for r in state.evals[which]["rows"]))
    return summary, weights


def keep_warm_start(ctx: Context, state: LoopState, compare: Mapping[str, Any]) -> dict[str, Any] | None:
    """When RL undid the warm start (``rules.keep_warm_start``): the weights set back to the warm start's end
    (RUN_DIR/checkpoint/warm_start_end), measured again on the held-out tasks, and why; None otherwise. The
    checkpoint keeps RL's weights (a resume continues RL); the exported weights are these."""
    folder = ctx.run_dir / "checkpoint" / WARM_START_END
    reason = rules.keep_warm_start(compare) if state.warm_start_steps_done and folder.is_dir() else None
    if reason is None:
        return None
    ctx.trainer.load(folder)
    measured = ctx.evaluate()
    return {"reason": reason, "rl_after": compare["after"], "weights": str(folder),
            "held_out": {k: v for k, v in measured.items() if k != "rows"}}


def resolved(ctx: Context) -> dict[str, Any]:
    """The values the config left to the run's rules, as this run's plan holds them (summary's ``resolved``)."""
    plan = ctx.plan
    out: dict[str, Any] = {k: getattr(plan, k) for k in ("steps", "warm_start_steps", "warm_start_learning_rate",
                                                          "learning_rate", "lag")}
    if ctx.method.run_spec().critic is not None:
        out["critic_learning_rate"] = plan.critic_learning_rate
    if ctx.taskset is not None:
        out.update(max_tokens=plan.max_tokens, temperature=plan.temperature)
    return out


def as_run(method: Method, planned: Mapping[str, Any]) -> str:
    """``repr(method)`` with every knob the run plan also resolved (``planned``: the cap, the temperature, the
    rates) at the plan's value, in a wrapped method too: the sampler and the optimizer ran at the plan's
    values, so the summary and the plan never disagree. With nothing planned it is ``repr(method)``."""
    parts = []
    for f in dataclasses.fields(method):
        if f.repr:
            value = getattr(method, f.name)
            text = as_run(value, planned) if isinstance(value, Method) else repr(planned.get(f.name, value))
            parts.append(f"{f.name}={text}")
    return f"{type(method).__name__}({', '.join(parts)})"


def fifths(records: Sequence[Mapping[str, Any]], rows_method: bool, from_file: bool) -> dict[str, float]:
    """The first and the last fifth's means of the step metrics a reader compares."""
    if not records:
        return {}
    first, last = records[: max(1, len(records) // 5)], records[-max(1, len(records) // 5):]
    keys = ("method/mean_loss", "loss") if rows_method else ("reward", "loss", "admitted_share", "drift")
    if from_file and not rows_method:  # a log's rewards (and c's sum) say nothing of the model
        keys = ("admitted_share", "drift")
    out = {}
    for key in keys:
        if key in records[0] and not (key == "loss" and "method/mean_loss" in records[0] and rows_method):
            out[f"{key}_first_fifth"] = _mean(first, key)
            out[f"{key}_last_fifth"] = _mean(last, key)
    return out


def _mean(records: Sequence[Mapping[str, Any]], key: str) -> float:
    values = [float(r[key]) for r in records if key in r and math.isfinite(float(r[key]))]
    return sum(values) / len(values) if values else float("nan")


def report(summary: Mapping[str, Any]) -> str:
    session = (f" ({summary['steps'] - summary['resumed_at_step']} this session, resumed at step "
               f"{summary['resumed_at_step']})" if "resumed_at_step" in summary else "")
    lines = [f"{summary['method']}", f"  {summary['steps']} steps{session} in {summary['seconds']:.0f} s; run dir "
             f"{summary['run_dir']}"]
    if "reward_first_fifth" in summary:
        lines.append(f"  training reward {summary['reward_first_fifth']:.3f} (first fifth) -> "
                     f"{summary['reward_last_fifth']:.3f} (last fifth)")
    if "method/mean_loss_first_fifth" in summary:  # the method's own loss (DPO's -log sigmoid, RM's), not c's sum
        lines.append(f"  {summary['method'].split('(')[0]} loss {summary['method/mean_loss_first_fifth']:.4g} "
                     f"(first fifth) -> {summary['method/mean_loss_last_fifth']:.4g} (last fifth)")
    elif "loss_first_fifth" in summary and "reward_first_fifth" not in summary:
        lines.append(f"  loss {summary['loss_first_fifth']:.4g} (first fifth) -> {summary['loss_last_fifth']:.4g} "
                     "(last fifth)")
    if "admitted_share_last_fifth" in summary:
        lines.append(f"  admitted share (last fifth) {summary['admitted_share_last_fifth']:.2f}, drift "
                     f"{summary.get('drift_last_fifth', 0.0):.3g}")
    if "compare" in summary:
        lines.append(f"  before: {eval_line(summary['eval_before'])}")
        lines.append(f"  after:  {eval_line(summary['eval_after'])}")
        lines.append(f"  {summary['compare']['text']}")
    if "kept_warm_start" in summary:
        kept = summary["kept_warm_start"]
        lines.append(f"  {kept['reason']}; the final weights are the warm start's end (held-out pass@1 "
                     f"{kept['held_out']['pass_at_1']:.3f}, measured again), RL's stay in the checkpoint")
    lines += trace_run.report_lines(summary)
    if "weights" in summary:
        lines.append(f"  weights: {summary['weights']}")
    lines.append(f"  curves: {summary['plot']}")
    if "no_gain_reason" in summary:  # last: what the metrics show went wrong, not only the numbers
        lines.append(f"  no held-out gain: {summary['no_gain_reason']}")
    return "\n".join(lines)
