"""Tasksets from data: JSONL files and Hugging Face `datasets` (local paths and data files, or the hub).

One row becomes one Task: `prompt_field` (text, or chat messages), `answer_field`, `id_field` (optional;
default the 1-based line or row number), every other field into `Task.info`. Every bad row is reported
at once, with its line (or split and row) number.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from whileai.envs.core import SPLITS, Task, Taskset, _key
from whileai.envs.graders import check_answer, grader
from whileai.errors import BatchError, ConfigError

MAX_REPORTED = 20
"""bad rows listed in one error (the count of the rest follows)"""
HUB_PROBE_S = 3.0
"""seconds to wait for the Hugging Face hub before saying it is unreachable"""


@dataclass(frozen=True)
class RowOptions:
    """How rows become tasks (the options of the JSONL and `hf:` forms)."""

    grader: Any = "exact"
    """a built-in grader name (exact, chars, numeric, regex, math), "module:function", or a callable"""
    prompt_field: str = "prompt"
    """field holding the prompt: a string, or chat messages [{"role": ..., "content": ...}]"""
    answer_field: str = "answer"
    """field holding what the grader compares against (may be absent only with a user grader)"""
    id_field: str = "task_id"
    """field holding a unique task id (a string or an integer); absent: the 1-based line / row number"""
    test_share: float = 0.1
    """share of distinct prompts held out as the test split when the data does not say (by a hash of the
    prompt, so equal prompts land in the same split and the split never changes between runs)"""
    max_tokens: int | None = None
    """generation cap for this taskset (None: the method's)"""


@dataclass(frozen=True)
class FileOptions:
    """The JSONL form's options beyond RowOptions."""

    split_field: str = "split"
    """field saying "train" or "test" on every line; on none: test_share is held out"""


@dataclass(frozen=True)
class HubOptions:
    """The `hf:` form's options beyond RowOptions."""

    train_split: str = "train"
    """the dataset split trained on"""
    test_split: str | None = "test"
    """the dataset split held out; None: hold out test_share of train_split"""
    subset: str | None = None
    """the dataset's configuration name (`load_dataset(path, name=subset)`)"""
    data_files: Any = None
    """data files for a builder name (hf:json, hf:csv, hf:parquet) or a hub dataset"""


def _parse_options(form: str, given: Mapping[str, Any], *classes: type) -> list[Any]:
    """Split `given` among the option dataclasses, reporting unknown names and bad values at once."""
    names = {f.name: cls for cls in classes for f in fields(cls)}
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ConfigError(f"{form}: unknown option(s) {unknown}; valid options are {sorted(names)}")
    built = [cls(**{k: v for k, v in given.items() if names[k] is cls}) for cls in classes]
    rows = next(b for b in built if isinstance(b, RowOptions))
    bad = [f"{k}={v!r} must be a non-empty string" for k, v in given.items()
           if k.endswith("_field") and (not isinstance(v, str) or not v)]
    if isinstance(rows.test_share, bool) or not isinstance(rows.test_share, float | int) \
            or not 0 < rows.test_share < 1:
        bad.append(f"test_share={rows.test_share!r} must be a number strictly between 0 and 1")
    if rows.max_tokens is not None and (not isinstance(rows.max_tokens, int) or rows.max_tokens < 1):
        bad.append(f"max_tokens={rows.max_tokens!r} must be a positive integer or None")
    if bad:
        raise ConfigError(f"{form}: " + "; ".join(bad) + " (fix the options)")
    return built


# ------------------------------------------------------------------------------------- row -> task
def _check_prompt(prompt: Any) -> str | None:
    if isinstance(prompt, str):
        return None if prompt else "prompt is empty"
    if isinstance(prompt, list) and prompt and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt):
        return None
    return (f"prompt {str(prompt)[:60]!r} must be a non-empty string or a non-empty list of "
            f'{{"role": str, "content": str}} messages')


class _BadJson(str):
    """A line that does not parse as JSON (the parser's message)."""


def row_to_task(row: Any, default_id: str, opts: RowOptions) -> tuple[Task | None, list[str]]:
    """The task one row makes, or None and every reason it makes none."""
    if isinstance(row, _BadJson):
        return None, [f"not valid JSON ({row})"]
    if not isinstance(row, Mapping):
        return None, [f"a row must be a JSON object, got {type(row).__name__}"]
    problems = []
    if opts.prompt_field not in row:
        problems.append(f"field {opts.prompt_field!r} is missing (fields: {sorted(row)}; set prompt_field)")
    elif (why := _check_prompt(row[opts.prompt_field])) is not None:
        problems.append(why)
    answer = row.get(opts.answer_field)
    if opts.answer_field not in row and check_answer(opts.grader, None) is not None:
        problems.append(f"field {opts.answer_field!r} is missing (fields: {sorted(row)}; set answer_field)")
    elif (why := check_answer(opts.grader, answer)) is not None:
        problems.append(f"{why} for grader {opts.grader!r}")
    task_id = row.get(opts.id_field, default_id)
    if isinstance(task_id, bool) or not isinstance(task_id, str | int) or task_id == "":
        problems.append(f"{opts.id_field} {task_id!r} must be a non-empty string or an integer")
    if problems:
        return None, problems
    taken = {opts.prompt_field, opts.answer_field, opts.id_field}
    prompt = row[opts.prompt_field]
    prompt = prompt if isinstance(prompt, str) else [dict(m) for m in prompt]
    info = {k: v for k, v in row.items() if k not in taken}
    return Task(str(task_id), prompt, answer, info), []


def rows_to_tasks(rows: Iterable[tuple[str, str, Any]], opts: RowOptions, source: str) -> list[Task]:
    """Tasks from (where, default_id, row) triples; every bad row (and repeated id) in one BatchError."""
    tasks: list[Task] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    for where, default_id, row in rows:
        task, why = row_to_task(row, default_id, opts)
        if task is not None and task.task_id in seen:
            why = [f"task_id {task.task_id!r} repeats {seen[task.task_id]}; task ids must be unique"]
        if why:
            problems.extend(f"{where}: {w}" for w in why)
        elif task is not None:
            seen[task.task_id] = where
            tasks.append(task)
    if problems:
        more = f" ... and {len(problems) - MAX_REPORTED} more" if len(problems) > MAX_REPORTED else ""
        raise BatchError(f"{source}: {len(problems)} problem(s):\n  " + "\n  ".join(problems[:MAX_REPORTED])
                         + more + "\nfix these rows (or map the fields with prompt_field / answer_field / id_field)")
    if not tasks:
        raise BatchError(f"{source}: holds no rows; give it at least two tasks")
    return tasks


def hold_out(tasks: list[Task], share: float, source: str) -> tuple[list[Task], list[Task]]:
    """(train, test): the distinct prompts ordered by their SHA-256, the first round(share x count) held out
    (at least one, and at least one left for training)."""
    keys = sorted({_key(t.prompt) for t in tasks}, key=lambda k: hashlib.sha256(k.encode()).hexdigest())
    if len(keys) < 2:
        raise BatchError(f"{source}: has {len(keys)} distinct prompt(s); a train and a test split need >= 2")
    test_keys = set(keys[:min(len(keys) - 1, max(1, round(share * len(keys))))])
    return ([t for t in tasks if _key(t.prompt) not in test_keys], [t for t in tasks if _key(t.prompt) in test_keys])


# ------------------------------------------------------------------------------------------- JSONL
def _jsonl_rows(path: Path) -> Iterable[tuple[str, str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row: Any = json.loads(line)
            except json.JSONDecodeError as exc:
                row = _BadJson(str(exc))
            yield f"line {number}", str(number), row


def load_jsonl(path_text: str, **given: Any) -> Taskset:
    """A taskset from a JSONL file: one task per non-blank line."""
    opts, file_opts = _parse_options(path_text, given, RowOptions, FileOptions)
    grade = grader(opts.grader)  # a bad grader name fails before the file is read
    path = Path(path_text)
    if not path.is_file():
        raise ConfigError(f"taskset file {path_text!r} does not exist; give the path of a .jsonl file")
    rows = list(_jsonl_rows(path))
    tasks = rows_to_tasks(rows, opts, path_text)
    if all(row.get(file_opts.split_field) is None for _, _, row in rows):
        train, test = hold_out(tasks, opts.test_share, path_text)
    else:
        train, test = _split_by_field(rows, tasks, file_opts.split_field, path_text)
    return Taskset(path_text, train, test, grade, opts.max_tokens)


def _split_by_field(rows: list[tuple[str, str, Any]], tasks: list[Task], field_name: str,
                    source: str) -> tuple[list[Task], list[Task]]:
    """Every line names its split in `field_name` ("train" or "test"); rows and tasks are in the same order."""
    unknown = [f"{where}: {field_name}={row[field_name]!r} is not a split; it must be one of {list(SPLITS)}"
               for where, _, row in rows if row.get(field_name) not in (*SPLITS, None)]
    missing = [where for where, _, row in rows if row.get(field_name) is None]
    if unknown or missing:
        lines = unknown[:MAX_REPORTED]
        if len(unknown) > MAX_REPORTED:
            lines.append(f"... and {len(unknown) - MAX_REPORTED} more lines with an unknown split")
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            lines.append(f"{len(missing)} line{'s' if len(missing) != 1 else ''} name no {field_name} ({shown}), "
                         f"while {len(rows) - len(missing)} do")
        raise BatchError(f"{source}: every line must name its split in '{field_name}' once any line does:\n  "
                         + "\n  ".join(lines) + f"\ngive every line {field_name}='train' or 'test', or remove "
                         f"'{field_name}' from every line to hold out test_share of the tasks")
    which = [row[field_name] for _, _, row in rows]
    return ([t for t, w in zip(tasks, which) if w == "train"], [t for t, w in zip(tasks, which) if w == "test"])


# ---------------------------------------------------------------------------------- Hugging Face
def load_hf(name: str, **given: Any) -> Taskset:
    """A taskset from a Hugging Face dataset: a local file or directory, a builder with data_files, or a
    hub name (where the hub is reachable)."""
    form = f"hf:{name}"
    opts, hub = _parse_options(form, given, RowOptions, HubOptions)
    grade = grader(opts.grader)
    splits = _load_dataset_dict(name, hub, form)
    train_rows = _split_rows(splits, hub.train_split, form)
    if hub.test_split is None:
        train, test = hold_out(rows_to_tasks(train_rows, opts, form), opts.test_share, form)
    else:
        tasks = rows_to_tasks(train_rows + _split_rows(splits, hub.test_split, form), opts, form)
        train, test = tasks[:len(train_rows)], tasks[len(train_rows):]
    return Taskset(form, train, test, grade, opts.max_tokens)


def _split_rows(splits: Mapping[str, Any], split: str, form: str) -> list[tuple[str, str, Any]]:
    if split not in splits:
        raise ConfigError(f"{form}: the dataset has no split {split!r} (it has {sorted(splits)}); pass "
                          f"train_split= / test_split= with one of those, or test_split=None to hold out "
                          f"test_share of the train split")
    return [(f"split {split!r} row {i}", f"{split}-{i}", row) for i, row in enumerate(splits[split], start=1)]


def _load_dataset_dict(name: str, hub: HubOptions, form: str) -> Mapping[str, Any]:
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError(f"{form}: needs the optional extra datasets: pip install 'whileai[datasets]'") from exc
    path = Path(name)
    kwargs: dict[str, Any] = {"name": hub.subset, "data_files": hub.data_files}
    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
        loaded = _call(form, datasets.load_from_disk, str(path))  # written by Dataset(Dict).save_to_disk
        return loaded if isinstance(loaded, Mapping) else {"train": loaded}
    if path.is_file():
        builder = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv"}.get(path.suffix)
        if builder is None:
            raise ConfigError(f"{form}: cannot tell the format of {name!r}; use a .parquet, .json, .jsonl or "
                              f".csv file, or hf:parquet / hf:json / hf:csv with data_files=")
        return _call(form, datasets.load_dataset, builder, data_files=str(path))
    if not path.exists() and name not in ("json", "csv", "parquet", "text", "arrow"):
        _require_hub(form)
    return _call(form, datasets.load_dataset, str(path) if path.exists() else name, **kwargs)


def _call(form: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # datasets raises its own classes too (DatasetGenerationError, ...)
        raise ConfigError(f"{form}: datasets could not load it: {type(exc).__name__}: {exc}") from exc


def _require_hub(form: str) -> None:
    """Fail fast when the hub cannot be reached (or HF_HUB_OFFLINE is set without a cached copy)."""
    import datasets.config

    if datasets.config.HF_HUB_OFFLINE:  # HF_HUB_OFFLINE=1 as datasets read it at import
        return  # datasets reads its cache; a miss becomes a ConfigError in _call
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((endpoint.hostname or "huggingface.co", endpoint.port or 443),
                                 timeout=HUB_PROBE_S).close()
    except OSError as exc:
        raise ConfigError(f"{form}: not a local path, and the Hugging Face hub ({endpoint.geturl()}) cannot be "
                          f"reached ({exc}); pass a local path (hf:/path/to/dir_or_file), or hf:json / "
                          f"hf:parquet with data_files=, or set HF_HUB_OFFLINE=1 to use the cache") from exc
