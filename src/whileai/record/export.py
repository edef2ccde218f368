"""``wai record export``: the recorded traces as the library's rows, exactly what ``wai train --rows`` reads.

A trace's row: ``prompt_tokens`` (its first prompt), ``tokens`` (every later token: the replies, and the
tokens between them), ``behavior_logprobs`` (the sampler's, on reply tokens; 0.0 on the tokens between
replies, which the environment wrote with certainty, as ``whileai.envs.episode`` does), ``action_mask``
(false between replies; left out when there are none), ``reward``, ``task_id`` (the trace id: one try per
ask), ``model``, ``truncated``, and two fields the trainer does not read: ``sampling`` and ``weights_version``.

``scored_after`` is the same, read as a stream (``GET /v1/export?after=CURSOR``, which ``wai train --rows-from``
polls): the traces first scored after a cursor, in the order they were scored, each row with its
``scored_seq``.

Left out, and counted: traces with no reward yet. Refused, each with its reason: traces whose exchanges
lack token ids or log-probabilities, or whose log-probabilities do not line up with the tokens; traces whose
upstream returned raw log-probabilities (before temperature / top-k / top-p) for sampling that was not plain,
since no ratio formed from them would be right (reported per model).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whileai.record.store import RecordStore

MAX_REASONS = 20


@dataclass
class ExportReport:
    written: int = 0
    unscored: int = 0
    refused: dict[str, str] = field(default_factory=dict)  # trace id -> reason
    raw_by_model: Counter[str] = field(default_factory=Counter)
    path: str = ""

    def __str__(self) -> str:
        lines = [f"wrote {self.written} trace(s) to {self.path}; left out {self.unscored} unscored trace(s) "
                 f"(score them with POST /v1/rewards), refused {len(self.refused)}"]
        for model, count in sorted(self.raw_by_model.items()):
            lines.append(f"  model {model}: {count} trace(s) with raw log-probabilities (before temperature / "
                         "top-k / top-p) at non-plain sampling: no faithful ratio. Fix: start vLLM with "
                         "--logprobs-mode processed_logprobs (or tell `wai record --upstream-logprobs` what it returns)")
        for trace_id, reason in list(self.refused.items())[:MAX_REASONS]:
            lines.append(f"  refused {trace_id}: {reason}")
        if len(self.refused) > MAX_REASONS:
            lines.append(f"  ... and {len(self.refused) - MAX_REASONS} more refused")
        return "\n".join(lines)


NEUTRAL = {"min_p": 0, "frequency_penalty": 0, "presence_penalty": 0, "repetition_penalty": 1, "logit_bias": {}}


def plain(sampling: dict[str, Any]) -> bool:
    """Sampling whose raw log-probabilities are the sampled ones: temperature 1, top-p 1 and no top-k, all
    stated, and no other knob (min-p, a penalty, a logit bias) away from its neutral value."""
    others = {k: v for k, v in sampling.items() if k not in ("temperature", "top_p", "top_k")}
    return (sampling.get("temperature") == 1 and sampling.get("top_p") == 1 and sampling.get("top_k") in (0, -1)
            and all(k in NEUTRAL and v == NEUTRAL[k] for k, v in others.items()))


def trace_row(trace: dict[str, Any]) -> dict[str, Any] | str:
    """The library's row for a scored trace, or the reason it cannot be one."""
    chain = trace["exchanges"]
    for ex in chain:
        if ex["problem"]:
            return f"exchange {ex['id']}: {ex['problem']}"
        if ex["logprobs_mode"] != "processed_logprobs" and not plain(ex["sampling"]):
            return f"raw: exchange {ex['id']} logged {ex['logprobs_mode']} at sampling {ex['sampling']}"
    samplings = {json.dumps(ex["sampling"], sort_keys=True) for ex in chain}
    if len(samplings) > 1:
        return (f"its turns were sampled with different settings ({sorted(samplings)}); the trainer scores a trace "
                "under one distribution")
    prompt = chain[0]["prompt_ids"]
    tokens: list[int] = []
    behavior: list[float] = []
    mask: list[bool] = []
    for ex in chain:
        seen = prompt + tokens
        if ex["prompt_ids"][:len(seen)] != seen:
            return f"exchange {ex['id']}: its prompt does not begin with the conversation so far"
        between = ex["prompt_ids"][len(seen):]
        tokens += between + ex["completion_ids"]
        behavior += [0.0] * len(between) + [float(v) for v in ex["logprobs"]]
        mask += [False] * len(between) + [True] * len(ex["completion_ids"])
    row: dict[str, Any] = {"task_id": trace["id"], "prompt_tokens": prompt, "tokens": tokens,
                           "behavior_logprobs": behavior, "reward": float(trace["reward"]),
                           "model": chain[-1]["model"], "truncated": chain[-1]["finish_reason"] == "length",
                           "sampling": chain[0]["sampling"], "weights_version": chain[-1]["weights_version"]}
    if not all(mask):
        row["action_mask"] = mask
    return row


def export(data_dir: Path, out: Path, since: float | None = None, model: str | None = None) -> ExportReport:
    """Write the scored, trainable traces of ``data_dir`` to ``out`` (JSONL, replaced atomically)."""
    store = RecordStore(data_dir)
    report = ExportReport(path=str(out))
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with open(tmp, "w") as handle:
            for summary in store.traces(since, model):
                if summary["reward"] is None:
                    report.unscored += 1
                    continue
                row = trace_row(store.trace(summary["id"]))
                if isinstance(row, str):
                    report.refused[summary["id"]] = row
                    if row.startswith("raw:"):
                        report.raw_by_model[str(summary["model"])] += 1
                    continue
                handle.write(json.dumps(row) + "\n")
                report.written += 1
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
        store.close()
    return report


def scored_after(store: RecordStore, cursor: int, limit: int) -> dict[str, Any]:
    """The rows of up to ``limit`` traces first scored after ``cursor`` (a ``scored_seq``), each with its
    ``scored_seq``; ``cursor``: the last one read (refused traces count: they are passed, with their reason);
    ``unscored``: traces that wait for a score."""
    rows, refused, last = [], [], cursor
    for summary in store.scored_after(cursor, limit):
        last = int(summary["scored_seq"])
        row = trace_row(store.trace(summary["id"]))
        if isinstance(row, str):
            refused.append({"trace_id": summary["id"], "scored_seq": last, "reason": row})
        else:
            rows.append({**row, "scored_seq": last})
    return {"rows": rows, "refused": refused, "cursor": last, "unscored": store.unscored()}
