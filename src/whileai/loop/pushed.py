"""Rows pushed to a trainer as they are (SFT, DPO, RM): tokenised, grouped, and cut into step batches.

A pushed row gives its prompt and completion as token ids (``prompt_tokens`` + ``tokens``) or as text
(``prompt``: a string or chat messages, ``completion``: a string). Batches hold whole groups (the rows of
one ``pair``, else of one ``task_id``) so a preference pair is never split across steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from whileai.errors import BatchError


def tokenised(row: Mapping[str, Any], index: int, tokenizer: Any) -> dict[str, Any]:
    """The row with ``prompt_tokens`` and ``tokens``, from ids or from text. A row with no ``reward`` is a
    demonstration: it reads as reward 1.0 (SFT ignores rewards; DPO and RM refuse pairs without a fail)."""
    out = dict(row)
    out.setdefault("reward", 1.0)
    if "prompt_tokens" in row and "tokens" in row:
        return out
    if "prompt" in row and "completion" in row:
        from whileai.envs import Task, render_prompt

        out["prompt_tokens"] = render_prompt(tokenizer, Task(str(row.get("task_id", index)), row["prompt"]))
        completion = tokenizer.encode(str(row["completion"]), add_special_tokens=False)
        if tokenizer.eos_token_id is not None:
            completion = completion + [tokenizer.eos_token_id]
        out["tokens"] = completion
        return out
    raise BatchError(f"row {index}: a pushed row needs 'prompt_tokens' and 'tokens' (ids), or 'prompt' and "
                     f"'completion' (text); it has {sorted(row)}")


def _groups(rows: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    keys: dict[Any, list[int]] = {}
    for i, row in enumerate(rows):
        key = ("pair", str(row["pair"])) if "pair" in row else ("task", str(row.get("task_id", f"row-{i}")))
        keys.setdefault(key, []).append(i)
    return list(keys.values())


def batch_of(rows: Sequence[Mapping[str, Any]], tokenizer: Any, size: int, seed: int, step: int) -> list[dict[str, Any]]:
    """Step ``step``'s batch: about ``size`` rows in whole groups, walking the groups in a seeded order
    that is reshuffled every pass through the data (a fixed function of seed and step: resumable)."""
    if not rows:
        raise BatchError("no rows to train on: the rows file is empty")
    groups = _groups(rows)
    per_pass: list[list[int]] = []  # the batches of one pass, then repeated with a new order
    batches: list[list[int]] = []
    epoch = 0
    while len(batches) <= step:
        order = np.random.default_rng([seed, epoch]).permutation(len(groups))
        per_pass, current = [], []
        for g in order:
            current += groups[g]
            if len(current) >= size:
                per_pass.append(current)
                current = []
        if current:
            per_pass.append(current)
        batches += per_pass
        epoch += 1
    return [tokenised(rows[i], i, tokenizer) for i in batches[step]]
