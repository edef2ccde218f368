"""The hook of a run from a rows file (``wai train --rows``): what the file holds and its held-out traces before
the first step; which lines each step's method dropped, and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from whileai.loop.hooks.context import Context
from whileai.loop.sources import trace_run
from whileai.loop.sources.traces import contamination
from whileai.loop.types import Hook, Loop

if TYPE_CHECKING:
    from whileai.loop.sources.pushed import Pushed
    from whileai.loop.step import StepResult


@dataclass
class TraceHook(Hook):
    """A run from a rows file: what the file holds and the held-out traces before; which lines each step's
    method dropped, and its notes saying why."""

    ctx: Context
    batches: Pushed

    def before(self, loop: Loop) -> None:
        rows = self.ctx.rows
        assert rows is not None  # the hook of a run on a rows file
        if not self.ctx.resuming and self.ctx.can_eval() and self.ctx.taskset is not None and (warning := contamination(
                rows, self.ctx.taskset.split("test")[: self.ctx.plan.eval_tasks])) is not None:
            self.ctx.log.write(warning)
        trace_run.start(rows, self.ctx.method, self.ctx.config, self.ctx.run_dir, loop.trainer,
                        self.ctx.plan.sampling(), loop.state.method_state, self.ctx.log.write)

    def after_step(self, loop: Loop, record: dict[str, Any], result: StepResult) -> None:
        record.update(trace_run.step_record(result.update, self.batches.lines))
        if record["step"] % 10 == 0 and trace_run.dropped_note(record):
            self.ctx.log.write(str(trace_run.dropped_note(record)))
