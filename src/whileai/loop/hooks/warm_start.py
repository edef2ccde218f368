"""The hooks around ``whileai.loop.core.run_loop``: what a run does besides its steps.

    WarmStart -> HeldOut -> TeacherHook -> TraceHook -> Record -> Checkpoints

Each is a small object over the run's ``Context`` (its directory, config, plan, taskset, backend, log and
Ctrl-C flag). ``before(loop)`` runs once before the first step (a resume skips what its checkpoint says is
done); ``after_step(loop, record, result)`` after each. The checkpoint hook is last: it saves and, after a
Ctrl-C, stops the run with ``Interrupted``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from whileai.envs.episode import reference_episode
from whileai.errors import ConfigError, WhileaiError
from whileai.loop.core import Loop, LoopState, prompts
from whileai.loop.hooks import teacher as teacher_io
from whileai.loop.hooks.held_out import held_out
from whileai.loop.hooks.metrics import Metrics, Progress, write_json
from whileai.loop.hooks.preflight import preflight
from whileai.loop.plan import rules
from whileai.loop.plan.config import TrainConfig
from whileai.loop.plan.run_plan import RunPlan
from whileai.loop.sources import trace_run
from whileai.loop.sources.rollouts import step_tasks
from whileai.loop.sources.traces import contamination

REFERENCE_FILE = "reference.pt"  # in RUN_DIR/checkpoint: the reference policy taken after the warm start
WARM_START_DRAW = 10_000_000  # warm-start step k draws its tasks as step WARM_START_DRAW + k (apart from RL's)


class Interrupted(WhileaiError):
    """The run was stopped by Ctrl-C after writing a checkpoint."""

    def __init__(self, run_dir: Path, step: int) -> None:
        super().__init__(f"interrupted after step {step}; checkpoint written. Resume with: wai train --resume {run_dir}")
        self.run_dir, self.step = run_dir, step


@dataclass
class Context:
    """One run's surroundings, shared by its hooks."""

    run_dir: Path
    config: TrainConfig
    plan: RunPlan
    method: Any
    taskset: Any
    rows: Any
    backend: Any
    log: Progress
    metrics: Metrics
    stop: Mapping[str, bool]
    resuming: bool

    def can_eval(self) -> bool:
        return self.taskset is not None and self.plan.eval_tasks > 0

    def evaluate(self) -> dict[str, Any]:
        trainer = self.backend.trainer
        tasks = self.taskset.split("test")[: self.plan.eval_tasks]
        return held_out(trainer, self.taskset, tasks, prompts(trainer.tokenizer, tasks), self.plan.eval_samples,
                        self.plan.sampling(), self.plan.seed)

    def checkpoint(self, state: LoopState, teacher: Any = None) -> None:
        """Loop state first (named by the trainer step it belongs to), then the trainer's atomic snapshot."""
        folder = self.run_dir / "checkpoint"
        folder.mkdir(exist_ok=True)
        step = int(self.backend.trainer.step)
        state.engine_step = step
        write_json(folder / f"loop-{step:08d}.json", state.__dict__)
        if teacher is not None:
            teacher.save(folder / f"teacher-{step:08d}.pt")
        self.backend.save(folder)
        for pattern, keep in (("loop-*.json", f"loop-{step:08d}.json"), ("teacher-*.pt", f"teacher-{step:08d}.pt")):
            for old in folder.glob(pattern):
                if old.name != keep:
                    old.unlink()

    def stop_if_asked(self, state: LoopState, teacher: Any = None) -> None:
        if self.stop["stop"]:
            state.warm_start_done = True
            self.checkpoint(state, teacher)
            raise Interrupted(self.run_dir, state.step)


def warm_start(trainer: Any, taskset: Any, plan: RunPlan) -> list[float]:
    """``plan.warm_start_steps`` supervised steps on reference episodes (fewer when the plan's rule stops it
    once its pass estimate is reached, ``rules.warm_start_reached``); each step's loss per answer token."""
    from whileai.engine.datums import make_datum

    losses: list[float] = []
    answer_tokens: list[float] = []
    tasks_all = taskset.split("train")
    for k in range(plan.warm_start_steps):
        tasks = step_tasks(tasks_all, min(plan.warm_start_batch, len(tasks_all)), plan.seed, WARM_START_DRAW + k)
        data = [(prompt, *reference_episode(taskset, task, trainer.tokenizer))
                for task, prompt in zip(tasks, prompts(trainer.tokenizer, tasks))]
        count = sum(sum(mask) for _, _, mask in data)
        datums = [make_datum(p, a, weights=[float(m) / count for m in mask]) for p, a, mask in data]
        out = trainer.forward_backward(datums, "cross_entropy")
        trainer.optim_step({"learning_rate": plan.warm_start_learning_rate})
        losses.append(float(out.metrics["loss:sum"]))
        answer_tokens.append(count / len(data))
        if plan.warm_start_until_pass and rules.warm_start_reached(losses, answer_tokens):
            break
    return losses


@dataclass
class WarmStart:
    """Supervised steps on reference episodes (the model's turns weighted 1/count, the environment's 0), once;
    then, under full fine-tuning, the reference policy is re-taken from the weights RL starts from."""

    ctx: Context

    def before(self, loop: Loop) -> None:
        steps = self.ctx.plan.warm_start_steps
        if steps and not loop.state.warm_start_done:
            losses = warm_start(loop.trainer, self.ctx.taskset, self.ctx.plan)
            until = (f" (the rule's pass estimate {rules.WARM_START_TARGET:g} reached; at most {steps})"
                     if self.ctx.plan.warm_start_until_pass and len(losses) < steps else "")
            self.ctx.log.write(f"warm start: {len(losses)} supervised steps on reference answers at learning rate "
                               f"{self.ctx.plan.warm_start_learning_rate:g} (loss {losses[0]:.3f} -> "
                               f"{losses[-1]:.3f}){until}")
            loop.state.warm_start_steps_done = len(losses)
            self.reference(loop.trainer)
            self.ctx.stop_if_asked(loop.state)
        elif steps and self.ctx.resuming:
            self.reference(loop.trainer)
        loop.state.warm_start_done = True

    def reference(self, trainer: Any) -> None:
        """Full fine-tuning: the reference policy (a KL term's, an 'initial' teacher's) is the policy RL starts
        from, saved once as checkpoint/reference.pt; a resume loads it. Under LoRA it is the adapter-free base."""
        reference = getattr(trainer, "reference", None)
        if reference is None or reference.shares_weights:
            return
        path = self.ctx.run_dir / "checkpoint" / REFERENCE_FILE
        if not self.ctx.resuming:
            reference.reset_to(trainer.model)
            path.parent.mkdir(exist_ok=True)
            reference.save(path)
        elif path.is_file():
            reference.load(path)
        else:
            raise ConfigError(f"--resume {self.ctx.run_dir}: the checkpoint has no {REFERENCE_FILE} (the reference "
                              "policy taken after the warm start), so the resumed run would measure its KL against "
                              "another policy; start the run again in a new --run-dir")


@dataclass
class HeldOut:
    """Held-out pass@1 before training (once) and every ``eval_every`` steps (the last one is the summary's)."""

    ctx: Context

    def before(self, loop: Loop) -> None:
        if self.ctx.can_eval() and not loop.state.evals:
            loop.state.evals.append({"step": 0, **self.ctx.evaluate()})
            self.ctx.metrics.scalar("eval/pass_at_1", loop.state.evals[-1]["pass_at_1"], 0)
            self.ctx.log.write(f"held-out pass@1 before: {eval_line(loop.state.evals[-1])}")
            self.ctx.stop_if_asked(loop.state)

    def after_step(self, loop: Loop, record: dict[str, Any], result: Any) -> None:
        step, every = record["step"], self.ctx.plan.eval_every
        if every and step % every == 0 and step < self.ctx.plan.steps and self.ctx.can_eval():
            loop.state.evals.append({"step": step, **self.ctx.evaluate()})
            record["eval/pass_at_1"] = loop.state.evals[-1]["pass_at_1"]


@dataclass
class TeacherHook:
    """The run spec's teacher, built once the weights RL starts from are in place (an EMA starts from them);
    a resume restores an EMA teacher's average from the checkpoint."""

    ctx: Context

    def before(self, loop: Loop) -> None:
        spec = self.ctx.method.run_spec().teacher
        if spec is None:
            return
        loop.teacher = teacher_io.build(spec, self.ctx.config, loop.trainer, self.ctx.taskset)
        if self.ctx.resuming and loop.state.step > 0:
            loop.teacher.load(self.ctx.run_dir / "checkpoint" / f"teacher-{int(loop.trainer.step):08d}.pt")


@dataclass
class TraceHook:
    """A run from a rows file: what the file holds and the held-out traces before; which lines each step's
    method dropped, and its notes saying why."""

    ctx: Context
    batches: Any

    def before(self, loop: Loop) -> None:
        if not self.ctx.resuming and self.ctx.can_eval() and (warning := contamination(
                self.ctx.rows, self.ctx.taskset.split("test")[: self.ctx.plan.eval_tasks])) is not None:
            self.ctx.log.write(warning)
        trace_run.start(self.ctx.rows, self.ctx.method, self.ctx.config, self.ctx.run_dir, loop.trainer,
                        self.ctx.plan.sampling().scoring(), loop.state.method_state, self.ctx.log.write)

    def after_step(self, loop: Loop, record: dict[str, Any], result: Any) -> None:
        record.update(trace_run.step_record(result.update, self.batches.lines))
        if record["step"] % 10 == 0 and trace_run.dropped_note(record):
            self.ctx.log.write(str(trace_run.dropped_note(record)))


@dataclass
class PreflightHook:
    """Before the first update: is there any signal in the first batch (the first rollouts, or the file's first
    traces)? Printed, kept for summary.json; a run that would learn nothing stops here, before the RL budget is
    spent, with the reasons and the fixes, unless ``--force`` (whileai.loop.hooks.preflight). It reads the batch the
    first step trains on, so it samples and grades nothing of its own."""

    ctx: Context

    def before_update(self, loop: Loop) -> None:
        if loop.state.step > 0 or loop.state.preflight is not None or self.ctx.method.run_spec().source != "rollouts":
            return
        report = preflight(self.signal_rows(loop), self.ctx.method.run_spec(), **self.measured(loop.trainer))
        self.ctx.log.write(str(report))
        loop.state.preflight = report.to_dict()
        if not report.ok and not self.ctx.config.force:
            raise ConfigError(report.stop_message())

    def signal_rows(self, loop: Loop) -> list[dict[str, Any]]:
        """The rows the signal is read from: the first batch of rollouts; from a log, every trace it trains on
        (the whole file is at hand, and its first batch is only a sample of it)."""
        source = self.ctx.rows
        if source is None:
            return list(loop.batch)
        return [{"reward": float(source.reward_T[i]), "task_id": source.task_ids[source.task_T[i]]}
                for i in np.flatnonzero(~source.heldout_T & np.isfinite(source.reward_T))]

    def measured(self, trainer: Any) -> dict[str, Any]:
        """What the preflight reads besides the rows: the admitted share and drift of held-out traces at step 0
        (a run from a file), the cap and the reference answers' lengths, the warm start."""
        plan = self.ctx.plan
        out: dict[str, Any] = {}
        heldout = trace_run.heldout_summary(self.ctx.run_dir) if self.ctx.rows is not None else {}
        before = heldout.get("heldout_traces", {}).get("before") or {}
        if before:
            out.update(admitted_share=before.get("admitted_share"), drift=before.get("drift"))
        if self.ctx.taskset is not None and self.ctx.rows is None:
            encode = trainer.tokenizer.encode
            out["answer_lengths"] = rules.answer_tokens((t.answer for t in self.ctx.taskset.split("train")),
                                                        lambda text: encode(text, add_special_tokens=False))
        sampled = self.ctx.config.rows_from is None  # recorded traffic was capped by its server, not by this plan
        return {**out, "cap": plan.max_tokens if sampled else None, "cap_ends_answer": plan.cap_is_answer_length,
                "warm_start_steps": plan.warm_start_steps, "random_init": plan.model.startswith("builtin:")}


@dataclass
class Record:
    """metrics.jsonl, TensorBoard, the progress bar, and the method's notes every tenth step."""

    ctx: Context

    def after_step(self, loop: Loop, record: dict[str, Any], result: Any) -> None:
        self.ctx.metrics.write(record)
        self.ctx.log.update(record)
        for note in result.update.notes[:2] if record["step"] % 10 == 0 else ():
            self.ctx.log.write(f"step {record['step']} note: {note}")


@dataclass
class Checkpoints:
    """A checkpoint every ``save_every`` steps, at the end, and after a Ctrl-C (which then stops the run)."""

    ctx: Context

    def after_step(self, loop: Loop, record: dict[str, Any], result: Any) -> None:
        step, steps, stop = record["step"], self.ctx.plan.steps, self.ctx.stop["stop"]
        if step % self.ctx.plan.save_every == 0 or step == steps or stop:
            self.ctx.checkpoint(loop.state, loop.teacher)
        if stop and step < steps:
            raise Interrupted(self.ctx.run_dir, step)


def eval_line(result: Mapping[str, Any]) -> str:
    low, high = result["ci95"]
    return f"{result['pass_at_1']:.3f} [{low:.3f}, {high:.3f}] over {result['tasks']} tasks x {result['samples']}"


def read_state(run_dir: Path) -> LoopState:
    """The loop state of a run's last complete checkpoint."""
    from whileai.engine.state import snapshot_dir

    folder = snapshot_dir(run_dir / "checkpoint")
    step = json.loads((folder / "meta.json").read_text())["step"]
    path = run_dir / "checkpoint" / f"loop-{step:08d}.json"
    if not path.is_file():
        raise ConfigError(f"the checkpoint in {run_dir / 'checkpoint'} has no loop state {path.name}: it was cut off "
                          "while being written; there is nothing consistent to resume from")
    return LoopState(**json.loads(path.read_text()))
