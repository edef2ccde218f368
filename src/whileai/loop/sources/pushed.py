"""A row pushed to a trainer as it is (a judge's rows): its prompt and completion as token ids.

A pushed row gives them as token ids (``prompt_tokens`` + ``tokens``) or as text (``prompt``: a string or
chat messages, ``completion``: a string). Rows read from a file for ``wai train --rows`` go through
``whileai.loop.sources.traces`` instead (streamed, every line checked, whole groups per batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from whileai.envs import Task, render_prompt
from whileai.errors import BatchError


def tokenised(row: Mapping[str, Any], index: int, tokenizer: Any) -> dict[str, Any]:
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
