"""The warm start: supervised steps on reference episodes before RL (``warm_start``), and its hook
(``WarmStart``), which shows it (a bar, or a line every ``PRINT_EVERY`` steps under --no-progress), writes each
step to RUN_DIR/warm_start.jsonl and TensorBoard, stops within one step on Ctrl-C with a checkpoint (a resume
continues it), then re-takes the reference policy from the weights RL starts from and writes a checkpoint (an
error later in the run leaves it resumable after the warm start).

The hooks around ``whileai.loop.core.run_loop`` run in this order (``whileai.loop.run``):

    WarmStart -> HeldOut -> [the source's feed] -> PreflightHook -> TeacherHook -> Record -> [the source's
    pushing] -> Checkpoints

Each is a ``whileai.loop.types.Hook`` over the run's ``Context`` (``whileai.loop.hooks.context``).
``before(loop)`` runs once before the first step (a resume skips what its checkpoint says is done);
``after_step(loop, record, result)`` after each. The checkpoint hook is last: it saves and, after a Ctrl-C,
stops the run with ``Interrupted``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whileai.envs.episode import reference_episode
from whileai.errors import ConfigError
from whileai.loop.hooks.context import Context, Interrupted
from whileai.loop.plan import rules
from whileai.loop.plan.run_plan import RULE, RunPlan
from whileai.loop.sources.rollouts import step_tasks
from whileai.loop.types import Hook, Loop, engine_of, prompts

if TYPE_CHECKING:
    from whileai.envs.core import Taskset
    from whileai.trainers import Trainer

REFERENCE_FILE = "reference.pt"  # in RUN_DIR/checkpoint: the reference policy taken after the warm start
LOG_FILE = "warm_start.jsonl"  # in RUN_DIR: one line per warm-start step (loss, answer tokens, pass estimate)
WARM_START_DRAW = 10_000_000  # warm-start step k draws its tasks as step WARM_START_DRAW + k (apart from RL's)
WARM_START_END = "warm_start_end"  # in RUN_DIR/checkpoint: the weights RL starts from (a run whose RL undoes them ends there)
PRINT_EVERY = 25  # under --no-progress: a line every this many warm-start steps (and every check)
ESTIMATE_WINDOW = 20  # steps the shown pass estimate averages over


@dataclass
class WarmStartResult:
    """What a warm start did: its steps' records."""

    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def losses(self) -> list[float]:
        return [float(r["loss"]) for r in self.records]


def pass_estimate(records: Sequence[dict[str, Any]]) -> float:
    """exp(-mean loss per answer token x mean answer tokens) over the last ``ESTIMATE_WINDOW`` steps: the
    geometric-mean probability of writing a whole reference answer of the training batches (a lower bound on
    their sampled pass rate, by Jensen)."""
    window = records[-ESTIMATE_WINDOW:]
    if not window:
        return 0.0
    loss = math.fsum(float(r["loss"]) for r in window) / len(window)
    tokens = math.fsum(float(r["answer_tokens"]) for r in window) / len(window)
    return math.exp(-loss * tokens)


def warm_start(trainer: Trainer, taskset: Taskset | None, plan: RunPlan, done: WarmStartResult | None = None,
               each: Callable[[dict[str, Any], WarmStartResult], bool] | None = None) -> WarmStartResult:
    """``plan.warm_start_steps`` supervised steps on reference episodes, from where ``done`` left off (a resume).
    ``each(record, result)`` after every step: True stops the warm start there (Ctrl-C)."""
    from whileai.engine.datums import make_datum

    result = done or WarmStartResult()
    if taskset is None:  # make_plan gives a run without a taskset no warm start
        raise ConfigError("a warm start imitates a taskset's reference answers, and this run has no taskset: "
                          "set --warm-start-steps 0")
    train = taskset.split("train")
    ruled = plan.source("warm_start_learning_rate").startswith(RULE + ":")  # the rule's rate falls over a long one
    for k in range(len(result.records), plan.warm_start_steps):
        tasks = step_tasks(train, min(plan.warm_start_batch, len(train)), plan.seed, WARM_START_DRAW + k)
        data = [(prompt, *reference_episode(taskset, task, trainer.tokenizer))
                for task, prompt in zip(tasks, prompts(trainer.tokenizer, tasks))]
        count = sum(sum(mask) for _, _, mask in data)
        datums = [make_datum(p, a, weights=[float(m) / count for m in mask]) for p, a, mask in data]
        out = trainer.forward_backward(datums, "cross_entropy")
        rate = rules.warm_start_rate_at(plan.warm_start_learning_rate, k, plan.warm_start_steps, ruled)
        trainer.optim_step({"learning_rate": rate})
        record: dict[str, Any] = {"warm_start_step": k + 1, "loss": float(out.metrics["loss:sum"]),
                                  "answer_tokens": count / len(data), "learning_rate": rate}
        result.records.append(record)
        record["pass_estimate"] = pass_estimate(result.records)
        if each is not None and each(record, result):
            break
    return result


def read_log(path: Path, steps_done: int) -> WarmStartResult:
    """The warm start's records up to ``steps_done`` from RUN_DIR/warm_start.jsonl (a resume continues them);
    the file is cut to them (lines past the checkpoint were never saved)."""
    result = WarmStartResult()
    if not path.is_file():
        return result
    for line in path.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if 0 < record.get("warm_start_step", 0) <= steps_done:
            result.records.append(record)
    path.write_text("".join(json.dumps(r) + "\n" for r in result.records))
    return result


@dataclass
class WarmStart(Hook):
    """Supervised steps on reference episodes (the model's turns weighted 1/count, the environment's 0), once,
    shown as they go and stoppable; then, under full fine-tuning, the reference policy is re-taken from the
    weights RL starts from."""

    ctx: Context

    def before(self, loop: Loop) -> None:
        steps = self.ctx.plan.warm_start_steps
        if steps and not loop.state.warm_start_done:
            self.run(loop)
        elif steps and self.ctx.resuming:
            self.reference(loop.trainer, take=False)
        loop.state.warm_start_done = True

    def run(self, loop: Loop) -> None:
        ctx, plan, state = self.ctx, self.ctx.plan, loop.state
        path = ctx.run_dir / LOG_FILE
        done = read_log(path, state.warm_start_steps_done) if ctx.resuming else WarmStartResult()
        if not ctx.resuming:
            path.unlink(missing_ok=True)
        ctx.log.phase("warm start", plan.warm_start_steps, len(done.records))

        def each(record: dict[str, Any], result: WarmStartResult) -> bool:
            with path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            step = record["warm_start_step"]
            for key in ("loss", "pass_estimate"):
                ctx.metrics.scalar(f"warm_start/{key}", record[key], step)
            ctx.log.warm(record, plan.warm_start_steps, every=PRINT_EVERY)
            state.warm_start_steps_done = step
            return bool(ctx.stop["stop"])

        result = warm_start(loop.trainer, ctx.taskset, plan, done, each)
        ctx.log.phase(None, plan.steps, state.step)
        if ctx.stop["stop"] and len(result.records) < plan.warm_start_steps:
            ctx.checkpoint(state)
            raise Interrupted(ctx.run_dir, state.step, during=f"the warm start, after its step "
                              f"{state.warm_start_steps_done} of {plan.warm_start_steps}",
                              python_taskset=ctx.python_taskset)
        losses = result.losses
        falling = " falling to 0" if {r["learning_rate"] for r in result.records[-1:]} != \
            {plan.warm_start_learning_rate} else ""
        ctx.log.write(f"warm start: {len(losses)} supervised steps on reference answers at learning rate "
                      f"{plan.warm_start_learning_rate:g}{falling} (loss {losses[0]:.3f} -> {losses[-1]:.3f}, pass estimate "
                      f"{pass_estimate(result.records):.2f})")
        state.warm_start_steps_done = len(losses)
        if ctx.trainer.url is None:  # the weights RL starts from, for a run whose RL undoes them (keep_warm_start)
            ctx.trainer.save(ctx.run_dir / "checkpoint" / WARM_START_END)
        self.reference(loop.trainer, take=True)
        state.warm_start_done = True
        ctx.checkpoint(state)  # a later error (a grader that breaks in the first evaluation) keeps it: --resume goes on
        ctx.stop_if_asked(state)

    def reference(self, trainer: Trainer, take: bool) -> None:
        """Full fine-tuning: the reference policy (a KL term's, an 'initial' teacher's) is the policy RL starts
        from, saved once as checkpoint/reference.pt (``take``: the warm start just ended here); a resume loads
        it. Under LoRA it is the adapter-free base."""
        reference = getattr(trainer, "reference", None)
        if reference is None or reference.shares_weights:
            return
        path = self.ctx.run_dir / "checkpoint" / REFERENCE_FILE
        if take:
            reference.reset_to(engine_of(trainer, "the reference policy").model)
            path.parent.mkdir(exist_ok=True)
            reference.save(path)
        elif path.is_file():
            reference.load(path)
        else:
            raise ConfigError(f"--resume {self.ctx.run_dir}: the checkpoint has no {REFERENCE_FILE} (the reference "
                              "policy taken after the warm start), so the resumed run would measure its KL against "
                              "another policy; start the run again in a new --run-dir")
