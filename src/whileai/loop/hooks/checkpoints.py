"""The checkpoint hook: a checkpoint every ``save_every`` steps, at the end, and after a Ctrl-C (which then stops
the run with ``Interrupted``). It runs last; ``Context.checkpoint`` writes what it holds. A training server
(--url) that stops answering stops the run with ``ServerStopped``, naming the last checkpoint a resume starts
from (its weights live on that server, so nothing newer can be saved once it is gone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from whileai.errors import ServerStopped
from whileai.loop.hooks.context import Context, Interrupted
from whileai.loop.types import Hook, Loop

if TYPE_CHECKING:
    from whileai.loop.step import StepResult


@dataclass
class Checkpoints(Hook):
    """A checkpoint every ``save_every`` steps, at the end, and after a Ctrl-C (which then stops the run)."""

    ctx: Context
    saved: int | None = None
    """the step of the latest checkpoint (a resumed run's: the one it started from)"""

    def before(self, loop: Loop) -> None:
        self.saved = loop.state.step if self.ctx.resuming else None

    def after_step(self, loop: Loop, record: dict[str, Any], result: StepResult) -> None:
        step, steps, stop = record["step"], self.ctx.plan.steps, self.ctx.stop["stop"]
        if step % self.ctx.plan.save_every == 0 or step == steps or stop:
            self.ctx.checkpoint(loop.state, loop.teacher)
            self.saved = step
        if stop and step < steps:
            raise Interrupted(self.ctx.run_dir, step, python_taskset=self.ctx.python_taskset)

    def failed(self, loop: Loop, error: BaseException) -> None:
        url = self.ctx.trainer.url
        if url is None or getattr(error, "status", None) != 0:  # 0: nothing answered (either API's client)
            return
        step = loop.state.step
        if self.saved is None:
            saved = ("No checkpoint was written yet (--save-every sets how often), so there is nothing to resume: "
                     "start the run again once the server is back.")
        else:
            saved = (f"The latest checkpoint is step {self.saved} (its state is saved on that server; --save-every "
                     f"sets how often): a resume starts there and trains steps {self.saved + 1}-{step + 1} again.")
        raise ServerStopped("training server", url, self.ctx.run_dir, step, error, saved) from None
