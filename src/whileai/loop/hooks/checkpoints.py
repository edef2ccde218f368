"""The checkpoint hook: a checkpoint every ``save_every`` steps, at the end, and after a Ctrl-C (which then stops
the run with ``Interrupted``). It runs last; ``Context.checkpoint`` writes what it holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from whileai.loop.hooks.context import Context, Interrupted
from whileai.loop.types import Hook, Loop

if TYPE_CHECKING:
    from whileai.loop.step import StepResult


@dataclass
class Checkpoints(Hook):
    """A checkpoint every ``save_every`` steps, at the end, and after a Ctrl-C (which then stops the run)."""

    ctx: Context

    def after_step(self, loop: Loop, record: dict[str, Any], result: StepResult) -> None:
        step, steps, stop = record["step"], self.ctx.plan.steps, self.ctx.stop["stop"]
        if step % self.ctx.plan.save_every == 0 or step == steps or stop:
            self.ctx.checkpoint(loop.state, loop.teacher)
        if stop and step < steps:
            raise Interrupted(self.ctx.run_dir, step)
