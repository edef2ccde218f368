"""Rows and traces from a file, streamed: one validating pass, then each step's batch read by seeking.

    source = scan(path, vocab, trace=True)     # every bad line listed at once (the first 20, then a count)
    rows, lines = source.batch(step, size=32, seed=0, grouped=False)

The pass keeps about 50 bytes a trace (where its line starts, its task, reward, model, a hash of its prompt
and a few flags), never the token lists, so a file of any length trains in the memory of one batch
(benchmarks/traces_memory.py).
A ``trace`` scan (an RL method) also demands a reward and the sampler's log-probabilities on every trace;
without them there is no advantage and no ratio. The formats are in ``whileai.loop.sources.trace_formats``.
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from whileai.errors import BatchError, ConfigError
from whileai.loop.sources.trace_formats import (
    FORMATS,
    PER_TOKEN,
    READ,
    TEXT_ROUTE,
    NoTokenIds,
    Vocab,
    detect,
    read_line,
)
from whileai.rows.io import MAX_LISTED, GradedRows, Problems, plural

if TYPE_CHECKING:
    from whileai.envs.core import Task
    from whileai.loop.plan.config import TrainConfig
    from whileai.methods.base import Method

HELDOUT_SHARE = 0.05  # traces held out (whole tasks, never trained on) when there is no --eval-taskset
HELDOUT_MAX = 256  # at most this many: each evaluation scores them all under the policy
TRACE_FIELDS = ("prompt_tokens", "tokens", "behavior_logprobs", "action_mask", "reward", "task_id", "truncated",
                "model", "pair", "chosen", "sampling", *PER_TOKEN)  # what a trace hands the loop
SHOWN_LINES = 3  # lines named per sampling setting in the run's log


def load_vocab(model: str) -> Vocab:
    """The tokenizer and vocabulary size of ``model`` without loading its weights (a built-in, or a directory)."""
    if model.startswith("builtin:"):
        from whileai.engine.models import BUILTINS, byte_tokenizer

        tokenizer = byte_tokenizer()
        size = BUILTINS.get(model.split(":", 1)[1], {})  # an unknown name is the engine's to refuse
        return Vocab(tokenizer, len(tokenizer), size.get("max_position_embeddings", 2**31))
    import os

    from transformers import AutoConfig, AutoTokenizer

    fix = ("Fix: give a local model directory (config.json and the tokenizer files), a model in the local Hugging "
           "Face cache, or a built-in model (builtin:tiny, builtin:mini, builtin:small).")
    if not os.path.isdir(model) and (model.startswith((".", "/", "~")) or model.count("/") > 1):
        raise ConfigError(f"model = {model!r}: no such directory, so its tokenizer cannot read the rows. {fix}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
        config = AutoConfig.from_pretrained(model, local_files_only=True)
    except (OSError, ValueError) as err:
        where = "the directory" if os.path.isdir(model) else "the local cache (it is not a directory)"
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"model = {model!r}: could not load its tokenizer from {where} to read the rows "
                          f"({first}). {fix}") from None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return Vocab(tokenizer, int(getattr(text, "vocab_size", None) or len(tokenizer)),
                 int(getattr(text, "max_position_embeddings", None) or 2**31))


@dataclass
class _Columns:
    """What the pass keeps per trace, as compact typed arrays."""

    offset: array = field(default_factory=lambda: array("q"))
    line: array = field(default_factory=lambda: array("i"))
    choice: array = field(default_factory=lambda: array("h"))
    task: array = field(default_factory=lambda: array("i"))
    pair: array = field(default_factory=lambda: array("i"))
    reward: array = field(default_factory=lambda: array("d"))
    truncated: array = field(default_factory=lambda: array("b"))
    model: array = field(default_factory=lambda: array("i"))
    behavior: array = field(default_factory=lambda: array("b"))
    prompt: array = field(default_factory=lambda: array("q"))  # a hash of the prompt's token ids
    labels: dict[str, dict[str, int]] = field(default_factory=lambda: {"task": {}, "pair": {}, "model": {}})

    def code(self, kind: str, label: str | None) -> int:
        if label is None:
            return -1
        codes = self.labels[kind]
        return codes.setdefault(label, len(codes))

    def add(self, offset: int, line: int, k: int, trace: Mapping[str, Any]) -> None:
        self.offset.append(offset)
        self.line.append(line)
        self.choice.append(k)
        self.task.append(self.code("task", trace.get("task_id", f"<line {line}>")))
        self.pair.append(self.code("pair", trace.get("pair")))
        self.reward.append(float(trace.get("reward", float("nan"))))
        self.truncated.append(bool(trace.get("truncated", False)))
        self.model.append(self.code("model", trace.get("model")))
        self.behavior.append("behavior_logprobs" in trace)
        self.prompt.append(prompt_key(trace["prompt_tokens"]))


class RowsFile:
    """A validated rows / traces file: per-trace columns (``_T``) and batches read back by seeking."""

    def __init__(self, path: Path, label: str, fmt: str, vocab: Vocab, columns: _Columns, notes: list[str]) -> None:
        self.path, self.label, self.fmt, self.vocab, self.notes = path, label, fmt, vocab, notes
        # the sampling settings traces state (sorted (name, value) pairs; () = none) -> traces, first lines
        self.samplings: dict[tuple[tuple[str, Any], ...], tuple[int, list[int]]] = {}
        self.sampled = True  # traces keep their sampling settings (a trace scan: an RL method scores under them)
        self.offset_T = np.frombuffer(columns.offset, dtype=np.int64)
        self.line_T = np.frombuffer(columns.line, dtype=np.int32)
        self.choice_T = np.frombuffer(columns.choice, dtype=np.int16)
        self.task_T = np.frombuffer(columns.task, dtype=np.int32)
        self.pair_T = np.frombuffer(columns.pair, dtype=np.int32)
        self.reward_T = np.frombuffer(columns.reward, dtype=np.float64)
        self.truncated_T = np.frombuffer(columns.truncated, dtype=np.int8).astype(bool)
        self.model_T = np.frombuffer(columns.model, dtype=np.int32)
        self.behavior_T = np.frombuffer(columns.behavior, dtype=np.int8).astype(bool)
        self.prompt_T = np.frombuffer(columns.prompt, dtype=np.int64)
        self.task_ids = tuple(columns.labels["task"])
        self.models = tuple(columns.labels["model"])
        self.heldout_T = np.zeros(len(self.offset_T), bool)
        self.stamp = _stamp(path)
        self._counts: dict[tuple[int, int, int, bool], int] = {}
        self._last: tuple[Any, list[np.ndarray]] = (None, [])

    @property
    def n(self) -> int:
        return len(self.offset_T)

    def where(self, i: int) -> str:
        return where(self.path, self.label, int(self.line_T[i]))

    def describe(self) -> str:
        """One line for the run's log: the file, what it holds, the format it was read as."""
        lines = len(np.unique(self.line_T))
        per_line = f" on {plural(lines, 'line')}" if lines != self.n else ""
        return (f"rows: {self.label}: {plural(self.n, 'trace')}{per_line}, {plural(len(self.task_ids), 'task')}; "
                f"format: {FORMATS[self.fmt]}")

    # ------------------------------------------------------------------ checks that depend on the method
    def require(self, trace: bool) -> None:
        """Refuse, listing the lines, traces an RL method cannot learn from: no reward, no behavior log-probs."""
        if not trace:
            return
        problems = Problems(self.label)
        for i in np.flatnonzero(np.isnan(self.reward_T) | ~self.behavior_T):
            problems.add(BatchError(lacking(self.where(int(i)), self.fmt, bool(np.isnan(self.reward_T[i])))))
        problems.raise_if_any()

    # ------------------------------------------------------------------ reading
    def read(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The traces at ``indices`` (in that order), parsed again from their lines."""
        if _stamp(self.path) != self.stamp:
            raise BatchError(f"{self.label}: the file changed after it was checked (size or time differs); a run "
                             "reads it again every step. Fix: leave the file alone while training, or start again.")
        found: dict[int, dict[str, Any]] = {}
        with open(self.path, "rb") as handle:
            for i in sorted(set(int(i) for i in indices), key=lambda i: int(self.offset_T[i])):
                handle.seek(int(self.offset_T[i]))
                row = json.loads(handle.readline())
                trace = read_line(self.fmt, self.where(i), row, self.vocab, self.sampled)[int(self.choice_T[i])]
                trace.setdefault("task_id", self.task_ids[self.task_T[i]])
                trace.setdefault("reward", 1.0)  # a row without a score is a demonstration (SFT)
                found[i] = {k: trace[k] for k in TRACE_FIELDS if k in trace}
        return [found[int(i)] for i in indices]

    def graded(self) -> GradedRows:
        """Task, reward, truncation and model per trace, for ``route`` (a missing reward reads as 1.0)."""
        n = self.n
        return GradedRows(self.task_T.astype(np.int64), self.task_ids, np.nan_to_num(self.reward_T, nan=1.0),
                          self.truncated_T, self.model_T.astype(np.int64), self.models, np.full(n, -1, np.int64), (),
                          source=self.label)

    # ------------------------------------------------------------------ held out, batches
    def hold_out(self, seed: int) -> str:
        """Set aside whole tasks (about ``HELDOUT_SHARE`` of the traces, at most ``HELDOUT_MAX``), never trained
        on; return a sentence saying what was held out."""
        want = min(HELDOUT_MAX, int(np.ceil(HELDOUT_SHARE * self.n)))
        counts = np.bincount(self.task_T, minlength=len(self.task_ids))
        if len(self.task_ids) < 2:
            return "no traces held out: the file has one task, and holding it out would leave nothing to train on"
        held: list[int] = []
        total = 0
        for task in np.random.default_rng([seed, 7]).permutation(len(self.task_ids)):
            if total >= want or len(held) == len(self.task_ids) - 1:
                break
            held.append(int(task))
            total += int(counts[task])
        self.heldout_T = np.isin(self.task_T, held)
        self._counts, self._last = {}, (None, [])
        return (f"held out {plural(total, 'trace')} of {plural(len(held), 'task')} ({total / self.n:.1%}), never "
                "trained on: their surrogate and drift are measured before and after")

    def heldout(self) -> np.ndarray:
        return np.flatnonzero(self.heldout_T)

    def batch(self, step: int, size: int, seed: int, grouped: bool) -> tuple[list[dict[str, Any]], list[int]]:
        """Step ``step``'s traces and their line numbers: about ``size`` traces, whole groups together when
        ``grouped`` (a task's traces; a DPO pair), walking the file in a seeded order reshuffled each pass.
        A fixed function of (seed, step), so a resumed run reads the same batches."""
        if not np.any(~self.heldout_T):
            raise BatchError(f"{self.label}: no rows to train on")
        epoch, index = 0, step
        while index >= self._count(epoch, size, seed, grouped):
            index -= self._count(epoch, size, seed, grouped)
            epoch += 1
        picked = self._epoch(epoch, size, seed, grouped)[index]
        return self.read(picked.tolist()), [int(self.line_T[i]) for i in picked]

    def _count(self, epoch: int, size: int, seed: int, grouped: bool) -> int:
        """Batches in pass ``epoch`` (kept for every pass seen: one integer each)."""
        key = (epoch, size, seed, grouped)
        if key not in self._counts:
            self._counts[key] = len(self._epoch(epoch, size, seed, grouped))
        return self._counts[key]

    def _epoch(self, epoch: int, size: int, seed: int, grouped: bool) -> list[np.ndarray]:
        """The batches of pass ``epoch``; only the latest pass's are kept."""
        key = (epoch, size, seed, grouped)
        if self._last[0] != key:
            self._last = (key, _cut(self._units(grouped), size, np.random.default_rng([seed, epoch])))
        return self._last[1]

    def _units(self, grouped: bool) -> tuple[np.ndarray, np.ndarray]:
        """The training traces sorted by unit (a group, or each trace alone) and where each unit starts."""
        train = np.flatnonzero(~self.heldout_T)
        if not grouped:
            return train, np.arange(len(train) + 1)
        keys = np.where(self.pair_T >= 0, self.pair_T, self.pair_T.max(initial=-1) + 1 + self.task_T)[train]
        order = np.argsort(keys, kind="stable")
        starts = np.flatnonzero(np.r_[True, keys[order][1:] != keys[order][:-1], True])
        return train[order], starts


def _cut(units: tuple[np.ndarray, np.ndarray], size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One pass: units in a random order, cut into batches of at least ``size`` traces (the last may be short)."""
    members, starts = units
    batches, current, count = [], [], 0
    for u in rng.permutation(len(starts) - 1):
        current.append(members[starts[u]:starts[u + 1]])
        count += int(starts[u + 1] - starts[u])
        if count >= size:
            batches.append(np.concatenate(current))
            current, count = [], 0
    if current:
        batches.append(np.concatenate(current))
    return batches


def _stamp(path: Path) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def where(path: Path, label: str, line: int) -> str:
    """A line as errors name it: "FILE, line N", or "rows[i]" for rows passed in Python (saved one a line)."""
    return f"rows[{line - 1}]" if label == "rows" else f"{path}, line {line}"


def lacking(where_: str, fmt: str, no_reward: bool) -> str:
    """Why a trace cannot train an RL method, and the fix for its format."""
    if no_reward:
        return (f"{where_}: field 'reward' is missing. Fix: join the late score to the trace (a number), or leave "
                "the trace out of the file until it is scored.")
    how = {"whileai": "write the sampler's log-probabilities as 'behavior_logprobs' (a 'logprobs' field is read "
                      "as the trained model's, which the loop scores itself)",
           "openai": "request logprobs from the server (chat: logprobs=true; completions: logprobs=1)",
           "text": "log one log-probability per completion token as 'behavior_logprobs'"}[fmt]
    return (f"{where_}: no behavior log-probabilities (the sampler's log-probability of each token), so there is no "
            f"ratio to correct the trace's staleness with. Fix: {how}; if the serving stack did not log them, turn "
            "that on and train on the traces logged after.")


# ----------------------------------------------------------------------------- the pass
def scan(path: Path, vocab: Vocab, trace: bool, label: str | None = None) -> RowsFile:
    """Read and check every line once, keeping only per-trace columns; list every bad line in one BatchError."""
    label = label or str(path)
    problems = Problems(label)
    columns = _Columns()
    fmt: str | None = None
    first = 0
    unread: dict[str, int] = {}
    samplings: dict[tuple[tuple[str, Any], ...], tuple[int, list[int]]] = {}  # settings -> traces, first lines
    textual: list[int] = []  # lines whose completion is logged as text, not token ids: said once
    for offset, line, row in _lines(path, label, problems):
        at = where(path, label, line)
        try:
            kind = detect(row)
            if kind is None:
                raise BatchError(f"{at}: not a trace: it has none of 'tokens', 'completion' or 'response' (fields: "
                                 f"{sorted(row)[:8]}). Fix: write the line in one of the three formats (docs/traces.md).")
            if fmt is not None and kind != fmt:
                raise BatchError(f"{at}: a {kind} line in a file read as {fmt} (from line {first}). Fix: one format "
                                 "per file; split the file.")
            fmt, first = kind, first or line
            traces = read_line(kind, at, row, vocab, sampled=trace)
        except NoTokenIds as err:
            if not textual:
                first_text = str(err)
            textual.append(line)
            continue
        except BatchError as err:
            problems.add(err)
            continue
        for key in set(row).difference(READ[kind]):
            unread[key] = unread.get(key, 0) + 1
        for k, one in enumerate(traces):
            if trace and ("reward" not in one or "behavior_logprobs" not in one):
                problems.add(BatchError(lacking(at, kind, "reward" not in one)))
            columns.add(offset, line, k, one)
            stated = tuple(sorted(one.get("sampling", {}).items()))
            count, lines = samplings.get(stated, (0, []))
            if len(lines) < SHOWN_LINES and line not in lines:
                lines.append(line)
            samplings[stated] = (count + 1, lines)
    if textual:
        problems.add(BatchError(_no_token_ids(label, textual, first_text)))
    if fmt is None and not problems.count:
        problems.add(BatchError(f"{label}: holds no rows. Fix: give a JSONL file with one trace a line."))
    problems.raise_if_any()
    assert fmt is not None  # the lines above raised otherwise
    source = RowsFile(path, label, fmt, vocab, columns, _notes(columns, unread))
    if (outliers := reward_outliers(source)) is not None:
        source.notes.append(outliers)
    source.samplings, source.sampled = samplings, trace
    return source


def _no_token_ids(label: str, lines: list[int], first: str) -> str:
    """One error for every line of a server's log that has its completion as text instead of token ids."""
    if len(lines) == 1:
        return first
    shown = ", ".join(map(str, lines[:SHOWN_LINES])) + (", ..." if len(lines) > SHOWN_LINES else "")
    return (f"{label}: {len(lines)} lines (line {shown}) have no token ids for the completion (its tokens logged "
            f"as text, or not logged), and text does not map back to ids reliably. {TEXT_ROUTE}")


def _lines(path: Path, label: str, problems: Problems) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(byte offset, line number, parsed object) for each non-blank line; bad JSON goes to ``problems``."""
    offset = 0
    with open(path, "rb") as handle:
        for line, raw in enumerate(handle, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            at = where(path, label, line)
            try:
                row = json.loads(raw)
            except UnicodeDecodeError:
                problems.add(BatchError(f"{at}: not UTF-8 text. Fix: write the file as UTF-8 JSON."))
                continue
            except json.JSONDecodeError as err:
                problems.add(BatchError(f"{at}: not valid JSON ({err.msg} at column {err.colno}). Fix: one JSON "
                                        "object per line."))
                continue
            if not isinstance(row, dict):
                problems.add(BatchError(f"{at}: a {type(row).__name__} where a JSON object was expected. Fix: one "
                                        "object per line."))
                continue
            yield start, line, row


def _notes(columns: _Columns, unread: Mapping[str, int]) -> list[str]:
    notes = []
    defaulted = sum(1 for label in columns.labels["task"] if label.startswith("<line "))
    if defaulted:
        notes.append(f"{plural(defaulted, 'line')} without a task_id: each is its own task (one try per ask)")
    if unread:
        shown = ", ".join(f"{k!r} ({n})" for k, n in sorted(unread.items())[:MAX_LISTED])
        notes.append(f"fields this reader does not use, left as they are: {shown}")
    return notes


def prompt_key(prompt_tokens: Sequence[int]) -> int:
    """A fixed 64-bit hash of a prompt's token ids (integers hash the same in every process)."""
    return hash(tuple(prompt_tokens))


def contamination(source: RowsFile, heldout: Sequence[Task]) -> str | None:
    """A warning naming the held-out tasks (``Task``s of the evaluation taskset) that the log also trains on,
    by task id or by prompt (tokenized by the one rule, ``render_prompt``), or None when there are none."""
    from whileai.envs import render_prompt

    trained = ~source.heldout_T
    ids = {source.task_ids[t] for t in np.unique(source.task_T[trained])}
    prompts = set(source.prompt_T[trained].tolist())
    hit = [t for t in heldout if t.task_id in ids or prompt_key(render_prompt(source.vocab.tokenizer, t)) in prompts]
    if not hit:
        return None
    names = ", ".join(repr(t.task_id) for t in hit[:5]) + (", ..." if len(hit) > 5 else "")
    return (f"warning: contamination: {len(hit)} of {plural(len(heldout), 'held-out task')} also appear in the "
            f"training log {source.label} (by task_id or prompt): {names}. Their held-out pass@1 measures recall, "
            "not learning. Fix: evaluate on tasks the log never saw (another split or --eval-taskset), or leave "
            "their lines out of the log")


def reward_outliers(source: RowsFile) -> str | None:
    """A sentence naming the traces (by line) whose reward lies outside the range the rest of the log spans,
    or None. The rest's range is the 1st to 99th percentile (the most extreme reward on each side left out); a
    reward is outside it when it is further from it than it is wide (a 7 among 0 and 1; a 0-10 grade has none)."""
    rewards = source.reward_T[np.isfinite(source.reward_T)]
    if rewards.size < 2:
        return None
    low, high = float(np.quantile(rewards, 0.01, method="higher")), float(np.quantile(rewards, 0.99, method="lower"))
    span = high - low if high > low else max(abs(high), 1.0)
    far = np.flatnonzero(np.isfinite(source.reward_T) & ((source.reward_T < low - span) | (source.reward_T > high + span)))
    if not far.size:
        return None
    shown = ", ".join(f"{source.where(int(i))} (reward {source.reward_T[i]:g})" for i in far[:SHOWN_LINES])
    more = f" and {far.size - SHOWN_LINES} more" if far.size > SHOWN_LINES else ""
    return (f"{plural(int(far.size), 'trace')} with a reward outside the range the rest of the log spans ({low:g} "
            f"to {high:g}): {shown}{more}. A grader's slip or another scale? Fix the score, or leave the line out: "
            "one such reward moves every advantage of its batch")


def check_reward_range(source: RowsFile, reward_range: tuple[float, float]) -> None:
    """Refuse, naming the lines, rewards outside a bounded critic's ``reward_range``: its head cannot reach them."""
    low, high = reward_range
    problems = Problems(source.label)
    for i in np.flatnonzero((source.reward_T < low) | (source.reward_T > high)):
        problems.add(BatchError(f"{source.where(int(i))}: field 'reward' is {source.reward_T[i]:g}, outside the "
                                f"method's reward_range ({low:g}, {high:g}), which its bounded critic cannot predict. "
                                "Fix: correct the score, rescale the log's rewards into the range, or set the "
                                "method's reward_range to the scale the grader uses."))
    problems.raise_if_any()


def open_rows(config: TrainConfig, run_dir: Path, python_rows: bool, method: Method | None) -> RowsFile:
    """The run's rows file, scanned: ``config.rows`` (or the run's copy of rows given in Python)."""
    path = run_dir / "rows.jsonl" if python_rows else Path(str(config.rows))
    trace = method is not None and method.run_spec().source == "rollouts"
    source = scan(path, load_vocab(config.model), trace, label="rows" if python_rows else None)
    critic = method.run_spec().critic if method is not None else None
    if critic is not None and critic.reward_range is not None:
        check_reward_range(source, critic.reward_range)
    if trace and method is not None:
        _check_groups(source, method)
    return source


def _check_groups(source: RowsFile, method: Method) -> None:
    """A method whose baseline is a task's group learns nothing when no task has enough traces: refuse it."""
    least = method.run_spec().min_rollouts_per_prompt
    if least < 2 or source.n == 0:
        return
    sizes = np.bincount(source.task_T)
    if sizes.max() < least:
        raise ConfigError(f"method {method.name!r} takes its baseline over a task's group of traces, and in "
                          f"{source.path} no task_id has {least} or more traces ({source.n} traces, {len(sizes)} "
                          "tasks): every advantage would be 0. Use a one-try method (flash_reinforce, rae, sao, "
                          "bpco; or --method auto), or give several traces per task_id")
