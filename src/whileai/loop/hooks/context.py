"""One run's surroundings (``Context``: its directory, config, plan, taskset, trainer, log and Ctrl-C flag),
shared by the hooks; the checkpoint it writes and reads back (``read_state``); ``Interrupted``, the stop after a
Ctrl-C.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whileai.errors import ConfigError, WhileaiError
from whileai.loop.hooks.held_out import held_out
from whileai.loop.hooks.metrics import Metrics, Progress, write_json
from whileai.loop.plan.config import PYTHON_TASKSET, TrainConfig
from whileai.loop.plan.run_plan import RunPlan
from whileai.loop.types import LoopState, prompts

if TYPE_CHECKING:
    from whileai.envs.core import Taskset
    from whileai.loop.hooks.teacher import RunTeacher
    from whileai.loop.sources.traces import RowsFile
    from whileai.methods.base import Method
    from whileai.trainers import Trainer


def resume_command(run_dir: Path, python_taskset: bool = False) -> str:
    """How to resume ``run_dir``: the CLI's command, or (a taskset passed as a Python object, which the run's
    config.toml cannot hold) the call that hands the same taskset back."""
    if python_taskset:
        return f"wai.train(resume={str(run_dir)!r}, taskset=<the same taskset object>)"
    return f"wai train --resume {run_dir}"


class Interrupted(WhileaiError):
    """The run was stopped by Ctrl-C after writing a checkpoint."""

    def __init__(self, run_dir: Path, step: int, during: str | None = None, python_taskset: bool = False) -> None:
        where = f"during {during}" if during else f"after step {step}"
        super().__init__(f"interrupted {where}; checkpoint written. Resume with: "
                         f"{resume_command(run_dir, python_taskset)}")
        self.run_dir, self.step = run_dir, step


@dataclass
class Context:
    """One run's surroundings, shared by its hooks."""

    run_dir: Path
    config: TrainConfig
    plan: RunPlan
    method: Method
    taskset: Taskset | None
    rows: RowsFile | None
    trainer: Trainer
    log: Progress
    metrics: Metrics
    stop: Mapping[str, bool]
    resuming: bool

    @property
    def python_taskset(self) -> bool:
        """The run's taskset was a Python object: its resume hands the same object back (``resume_command``)."""
        return self.config.taskset == PYTHON_TASKSET

    def can_eval(self) -> bool:
        return self.taskset is not None and self.plan.eval_tasks > 0

    def evaluate(self) -> dict[str, Any]:
        trainer = self.trainer
        assert self.taskset is not None  # can_eval
        tasks = self.taskset.split("test")[: self.plan.eval_tasks]
        return held_out(trainer, self.taskset, tasks, prompts(trainer.tokenizer, tasks), self.plan.eval_samples,
                        self.plan.sampling(), self.plan.seed, cap_is_answer_length=self.plan.cap_is_answer_length)

    def checkpoint(self, state: LoopState, teacher: RunTeacher | None = None) -> None:
        """Loop state first (named by the trainer step it belongs to), then the trainer's atomic snapshot."""
        folder = self.run_dir / "checkpoint"
        folder.mkdir(exist_ok=True)
        step = int(self.trainer.step)
        state.engine_step = step
        write_json(folder / f"loop-{step:08d}.json", state.__dict__)
        if teacher is not None:
            teacher.save(folder / f"teacher-{step:08d}.pt")
        self.trainer.save(folder)
        for pattern, keep in (("loop-*.json", f"loop-{step:08d}.json"), ("teacher-*.pt", f"teacher-{step:08d}.pt")):
            for old in folder.glob(pattern):
                if old.name != keep:
                    old.unlink()

    def stop_if_asked(self, state: LoopState, teacher: RunTeacher | None = None) -> None:
        if self.stop["stop"]:
            state.warm_start_done = True
            self.checkpoint(state, teacher)
            raise Interrupted(self.run_dir, state.step, python_taskset=self.python_taskset)


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
