"""``wai.reward_model(run)``: the scalar head a reward-model run trained, as a judge and a grader."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whileai.errors import ConfigError
from whileai.loop.plan.checks import resolve_method
from whileai.loop.plan.config import build
from whileai.loop.sources.pushed import tokenised
from whileai.loop.step import critic_values

if TYPE_CHECKING:
    from whileai.envs.core import Task
    from whileai.loop.run import Run
    from whileai.trainers import Trainer


class Judge:
    """Scores rows with a trained reward head: higher is better, on the head's own (unbounded) scale.

    ``judge.scores(rows)``: one float per row (``prompt_tokens`` + ``tokens``, or ``prompt`` + ``completion``).
    ``judge(task, completion)``: the grader form (a ``whileai.envs.Task`` and the completion text), so a
    taskset can be built with ``grader=judge``. A pass is still reward >= 1.0: compare runs graded by a
    judge with ``threshold=`` set on its scale.
    """

    def __init__(self, engine: Trainer, source: str) -> None:
        self.engine, self.source = engine, source

    def scores(self, rows: Sequence[Mapping[str, Any]]) -> list[float]:
        ready = [tokenised(r, i, self.engine.tokenizer) for i, r in enumerate(rows)]
        return [float(v[-1]) for v in critic_values(self.engine, ready)]

    def __call__(self, task: Task, completion: str) -> float:
        return self.scores([{"prompt": task.prompt, "completion": completion, "task_id": task.task_id}])[0]

    def __repr__(self) -> str:
        return f"Judge({self.source!r})"


def reward_model(run: Run | str | Path) -> Judge:
    """The judge a reward-model run (``wai.train(method="rm", rows=...)``) trained: a ``Run`` or its directory."""
    from whileai.trainers.engine import EngineTrainer  # torch: loaded only when a judge is made

    folder = Path(run) if isinstance(run, (str, Path)) else run.dir
    if not (folder / "config.toml").is_file():
        raise ConfigError(f"reward_model: {str(folder)!r} is not a run directory (no config.toml); pass the Run "
                          "that wai.train returned or its directory")
    config = build(str(folder / "config.toml"))
    method, problems = resolve_method(config)
    if problems or method is None or method.run_spec().head != "score":
        raise ConfigError(f"reward_model: the run in {str(folder)!r} trained {config.method!r}, which has no scalar "
                          "head; train one with wai.train(method='rm', rows=...)")
    engine = EngineTrainer(config.model, lora_rank=config.lora_rank, seed=config.seed, device=config.device)
    engine.add_critic(1e-3)  # the rate is unused: the judge only reads the head
    engine.load_state(str(folder / "checkpoint"))
    return Judge(engine, str(folder))
