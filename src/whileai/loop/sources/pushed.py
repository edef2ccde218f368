"""A row pushed to a trainer as it is (a judge's rows): its prompt and completion as token ids; ``Pushed``, the
source that reads each step's rows from a file.

A pushed row gives them as token ids (``prompt_tokens`` + ``tokens``) or as text (``prompt``: a string or
chat messages, ``completion``: a string). Rows read from a file for ``wai train --rows`` go through
``whileai.loop.sources.traces`` instead (streamed, every line checked, whole groups per batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from whileai.envs import Task, render_prompt
from whileai.errors import BatchError
from whileai.loop.types import LagQueue, Tokenizer

if TYPE_CHECKING:  # the plan is resolved above the sources; they read it
    from whileai.loop.plan.run_plan import RunPlan
    from whileai.loop.sources.traces import RowsFile


def tokenised(row: Mapping[str, Any], index: int, tokenizer: Tokenizer) -> dict[str, Any]:
    """The row with ``prompt_tokens`` and ``tokens``, from ids or from text. A row with no ``reward`` is a
    demonstration: it reads as reward 1.0 (SFT ignores rewards; DPO and RM refuse pairs without a fail)."""
    out = dict(row)
    out.setdefault("reward", 1.0)
    if "prompt_tokens" in row and "tokens" in row:
        return out
    if "prompt" in row and "completion" in row:
        out["prompt_tokens"] = render_prompt(tokenizer, Task(str(row.get("task_id", index)), row["prompt"]))
        completion = tokenizer.encode(str(row["completion"]), add_special_tokens=False)
        if tokenizer.eos_token_id is not None:
            completion = completion + [tokenizer.eos_token_id]
        out["tokens"] = completion
        return out
    raise BatchError(f"row {index}: a pushed row needs 'prompt_tokens' and 'tokens' (ids), or 'prompt' and "
                     f"'completion' (text); it has {sorted(row)}")


@dataclass
class Pushed:
    """Each step's rows read from a file (``whileai.loop.sources.traces.RowsFile``), whole groups together where the
    method takes them, in a seeded order; always scored (the file's log-probabilities are not the policy's)."""

    rows: RowsFile
    grouped: bool
    plan: RunPlan
    lines: list[int] = field(default_factory=list)

    def next(self, step: int, queue: LagQueue) -> list[dict[str, Any]]:
        batch, self.lines = self.rows.batch(step, self.plan.rollouts_per_step, self.plan.seed, self.grouped)
        return batch

    def rescore(self, batch: Sequence[dict[str, Any]], step: int) -> bool:
        return True
