"""Loading graded rows from JSONL or Parquet, streaming, into plain dicts or compact columns.

Two shapes come out of a file:

* ``load_rows(path)`` / ``iter_rows(path)``: the rows as dicts, for training and for small files.
* ``load_graded(path)``: a ``GradedRows``, the per-row fields every check needs (``task_id``,
  ``reward``, ``truncated``, ``model``, and on request ``seed``, a length and the line number) as
  numpy columns. A million rows cost about 20 bytes each, however long their token lists are:
  a line is parsed, its few fields are copied out, and the line is dropped.

A bad line is refused with ``BatchError`` naming the file, the line (1-based, as an editor counts
them), the field, what is wrong and how to fix it; ``load_rows`` and ``load_graded`` read the whole
file first and list every bad line in file order (the first ``MAX_LISTED``, then how many more).
Blank lines are skipped (they are not rows); nothing else is dropped. A row given as a dict in a
list is named ``row i``, its index in that list.

Labels are strings: a ``task_id``, ``model`` or ``seed`` that is an integer is read as its decimal
string, so task 1 and task "1" are one task (``whileai.rows.batch.as_label``).

A pass is ``reward >= threshold``. Without a threshold, rewards must all be 0 or 1 (a pass is then
1); any other reward needs one said out loud (``pass_threshold``).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from whileai.errors import BatchError, ConfigError
from whileai.rows.batch import as_label, unknown_field_notes, unknown_fields

PathLike = str | os.PathLike[str]
# Fields a graded-rows command reads; everything else on a line is parsed and dropped.
GRADED_FIELDS: tuple[str, ...] = ("task_id", "reward", "truncated", "model")
# Where a row's length is read from, in order, for length-matched DPO pairs.
LENGTH_FIELDS: tuple[str, ...] = ("tokens", "logprobs", "completion", "response", "text")
# The most bad lines one error lists (in file order) before saying how many more there are.
MAX_LISTED = 20
# A row passes when reward >= THRESHOLD, the default wherever every reward is 0 or 1.
THRESHOLD = 1.0


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 task', '2 tasks'."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


# --------------------------------------------------------------------------- reading
def iter_rows(path: PathLike, fields: Sequence[str] | None = None,
              require: Sequence[str] = ("reward",)) -> Iterator[dict[str, Any]]:
    """Yield the rows of a JSONL (or ``.parquet``) file one at a time.

    ``fields`` keeps only those keys of each row (the rest is dropped right after parsing).
    ``require`` names fields every row must have; ``reward``, ``task_id``, ``truncated`` and
    ``model`` are type-checked wherever present (labels come out as strings). It streams, so it
    stops at the first bad line; ``load_rows`` reads the whole file and lists every bad line.
    """
    for where, row in _records(path, fields):
        _check_row(where, row, require)
        yield row


def load_rows(path: PathLike, fields: Sequence[str] | None = None,
              require: Sequence[str] = ("reward",)) -> list[dict[str, Any]]:
    """All rows of a JSONL or Parquet file as a list of dicts (see ``iter_rows``).

    Every bad line is reported, in file order, in one ``BatchError``.
    """
    problems = Problems(str(path))
    out = []
    for where, row in _records(path, fields, problems):
        try:
            _check_row(where, row, require)
        except BatchError as err:
            problems.add(err)
            continue
        out.append(row)
    problems.raise_if_any()
    return out


class Problems:
    """Bad rows collected in order, raised at the end as one ``BatchError`` listing them on one line
    (errors print as one line on the command line): "FILE: 3 bad rows, in order (...): line 2: ... |
    line 5: ... | line 9: ...", the first ``MAX_LISTED`` and then how many more."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.messages: list[str] = []
        self.count = 0

    def add(self, err: BatchError) -> None:
        self.count += 1
        if len(self.messages) < MAX_LISTED:
            self.messages.append(str(err))

    def raise_if_any(self) -> None:
        if self.count == 1:
            raise BatchError(self.messages[0])
        if self.count:
            prefix = f"{self.source}, "
            listed = [m[len(prefix):] if m.startswith(prefix) else m for m in self.messages]
            more = [f"and {self.count - MAX_LISTED} more"] if self.count > MAX_LISTED else []
            raise BatchError(f"{self.source}: {self.count} bad rows, in order (fix each and load again): "
                             + " | ".join(listed + more))


def _records(path: PathLike, fields: Sequence[str] | None,
             problems: Problems | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) for every row of the file; ``where`` is "FILE, line N" or "FILE, row N".

    A line that is not a JSON object goes to ``problems`` when given (and is skipped), else raises.
    """
    path = Path(path)
    if path.suffix in (".parquet", ".pq"):
        yield from _parquet_records(path, fields)
        return
    keep = None if fields is None else tuple(fields)
    with open_jsonl(path) as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {lineno}"
            try:
                row = _parse_line(where, line)
            except BatchError as err:
                if problems is None:
                    raise
                problems.add(err)
                continue
            yield where, (row if keep is None else {k: row[k] for k in keep if k in row})


@contextmanager
def open_jsonl(path: PathLike) -> Iterator[IO[str]]:
    """Open a JSONL file as UTF-8 text; bytes that are not UTF-8 fail with the line they are on."""
    with open(path, encoding="utf-8") as handle:
        try:
            yield handle
        except UnicodeDecodeError as err:
            raise BatchError(f"{path}, line {_first_bad_line(path)}: not UTF-8 text ({err.reason}). "
                             "Fix: write the file as UTF-8 JSON (json.dumps "
                             "escapes anything else), or re-encode it.") from None


def _first_bad_line(path: PathLike) -> int:
    """The number of the first line that is not valid UTF-8 (read again in binary, only on the error path)."""
    with open(path, "rb") as raw:
        for lineno, line in enumerate(raw, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return lineno
    return 0


def _parse_line(where: str, line: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise BatchError(f"{where}: not valid JSON ({err.msg} at column {err.colno}). Fix: write one JSON "
                         "object per line, e.g. {\"task_id\": \"t1\", \"reward\": 1.0}.") from None
    if not isinstance(row, dict):
        raise BatchError(f"{where}: a {type(row).__name__} where a JSON object was expected. Fix: write one "
                         "object per line, e.g. {\"task_id\": \"t1\", \"reward\": 1.0}.")
    return row


def _open_parquet(path: Path) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise BatchError(f"{path}: reading Parquet needs pyarrow, which is not installed. Fix: "
                         "pip install 'whileai[parquet]', or convert the file to JSONL.") from None
    try:
        return pq.ParquetFile(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError, ArrowIOError an OSError
        if isinstance(err, (FileNotFoundError, IsADirectoryError)):
            raise
        raise BatchError(f"{path}: not a readable Parquet file ({err}). Fix: write it with "
                         "pyarrow.parquet.write_table, or give the rows as JSONL.") from None


def _parquet_names(path: Path) -> list[str]:
    """The columns of a Parquet file (its schema: no row is read)."""
    return list(_open_parquet(path).schema_arrow.names)


def _parquet_records(path: Path, fields: Sequence[str] | None) -> Iterator[tuple[str, dict[str, Any]]]:
    parquet = _open_parquet(path)
    names = parquet.schema_arrow.names
    columns = names if fields is None else [name for name in fields if name in names]
    index = 0
    for record_batch in parquet.iter_batches(columns=columns, batch_size=65_536):
        for row in record_batch.to_pylist():
            index += 1
            yield f"{path}, row {index}", {k: v for k, v in row.items() if v is not None}


# --------------------------------------------------------------------------- per-field checks
def _check_row(where: str, row: Mapping[str, Any], require: Sequence[str]) -> None:
    for name in require:
        if name not in row:
            raise BatchError(_missing(where, name))
    if "reward" in row:
        check_reward(where, row["reward"])
    if "task_id" in row:
        check_label(where, "task_id", row["task_id"])
    if "model" in row:
        check_label(where, "model", row["model"])
    if "truncated" in row:
        check_truncated(where, row["truncated"])


def _missing(where: str, name: str) -> str:
    fixes = {
        "task_id": "give every row the id of the prompt it answers (rows of one prompt share it), so "
                   "pass rates can be grouped per task",
        "reward": "grade the row first, or drop it if it was never scored",
        "model": "record which model wrote each row",
        "seed": "record the training seed behind each row, or pass seeds=",
    }
    return f"{where}: field {name!r} is missing. Fix: {fixes.get(name, f'add {name!r} to every row')}."


def check_reward(where: str, reward: Any) -> float:
    """The reward as a float, or ``BatchError`` saying why it is not one."""
    if type(reward) not in (int, float) and not isinstance(reward, (np.integer, np.floating)):
        raise BatchError(f"{where}: field 'reward' is {reward!r} ({type(reward).__name__}); it must be a number. "
                         "Fix: write the grader's score as a JSON number (1.0 for a pass, 0.0 for a fail).")
    value = float(reward)
    if not math.isfinite(value):
        raise BatchError(f"{where}: field 'reward' is {reward!r}; it must be finite. Fix the grader, or drop "
                         "the row if it was never scored.")
    return value


def check_label(where: str, name: str, value: Any) -> str:
    """A task id, model name or seed as a string (an integer as its decimal string); else refused."""
    return as_label(where, name, value)


def check_threshold(threshold: Any) -> float:
    """The pass threshold as a float; a NaN or infinite one would make every row fail (or pass) silently."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)) \
            or not math.isfinite(threshold):
        raise ConfigError(f"threshold={threshold!r} must be a finite number: a row passes when reward >= "
                          f"threshold (left out: {THRESHOLD:g}, when every reward is 0 or 1).")
    return float(threshold)


def pass_threshold(rewards: np.ndarray, threshold: float | None, source: str = "rows") -> float:
    """The threshold a pass is measured against: ``threshold`` when given, else 1.0 if every reward is
    0 or 1. Any other reward without a threshold is refused: reading a 0-10 grade or partial credit
    as pass/fail at 1.0 would be a guess, and every rate, band and route downstream would rest on it."""
    if threshold is not None:
        return check_threshold(threshold)
    other = (rewards != 0.0) & (rewards != 1.0)
    if not other.any():
        return THRESHOLD
    first = int(np.argmax(other))
    raise ConfigError(
        f"{source}: the rewards are not all 0 or 1 ({int(other.sum())} of {len(rewards)} rows score something "
        f"else, from {rewards.min():g} to {rewards.max():g}; the first is {rewards[first]:g}), so which rows "
        "pass is not known. Fix: say what a pass is, threshold= in Python or --threshold on the command line "
        "(a row passes when reward >= threshold), e.g. the full mark for a 0-10 grader.")


def check_truncated(where: str, value: Any) -> bool:
    if type(value) is not bool and not isinstance(value, np.bool_):
        raise BatchError(f"{where}: field 'truncated' is {value!r} ({type(value).__name__}); it must be true "
                         "or false. Fix: write true when the reply hit the token cap, false otherwise "
                         "(or leave the field out).")
    return bool(value)


def row_length(where: str, row: Mapping[str, Any]) -> int:
    """A row's length for DPO length matching: tokens, else logprobs, else characters of the text."""
    for name in LENGTH_FIELDS:
        value = row.get(name)
        if isinstance(value, (str, list, tuple)):
            return len(value)
    raise BatchError(f"{where}: no length to match pairs on. Fix: give the row 'tokens' or 'logprobs' (one "
                     "entry per generated token) or the reply text as 'completion'.")


# --------------------------------------------------------------------------- columns
class _Codes:
    """Labels (task ids, model names, seeds) coded as small integers in first-seen order."""

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}
        self.codes = array("i")  # int32: room for two billion distinct labels

    def add(self, label: Any) -> None:
        self.codes.append(self.index.setdefault(label, len(self.index)))

    def labels(self) -> tuple[Any, ...]:
        return tuple(self.index)


@dataclass(frozen=True, eq=False)
class GradedRows:
    """Graded rows as columns: one entry per row (``_R``), labels coded as integers.

    ``task_R[i]`` indexes ``task_ids``; ``model_R[i]`` indexes ``models`` (-1 where the row has no
    ``model``); ``seed_R`` likewise for ``seeds`` (integer arrays, int32 when read from a file). Labels
    are strings. ``length_R`` and ``line_R`` are filled only when asked for (DPO pairs, ``wai select
    --out``, ``compare``). ``source`` names the file or "rows"; ``path`` is the file (None for rows
    given as dicts, which ``rows`` then holds). ``keys`` is every key seen on any row.
    """

    task_R: np.ndarray
    task_ids: tuple[Any, ...]
    reward_R: np.ndarray
    truncated_R: np.ndarray
    model_R: np.ndarray
    models: tuple[Any, ...]
    seed_R: np.ndarray
    seeds: tuple[Any, ...]
    length_R: np.ndarray | None = None
    line_R: np.ndarray | None = None
    source: str = "rows"
    path: str | None = None
    keys: frozenset[str] = frozenset()
    rows: tuple[Mapping[str, Any], ...] | None = field(default=None, repr=False)

    @property
    def n_rows(self) -> int:
        return len(self.reward_R)

    @property
    def unknown_fields(self) -> tuple[str, ...]:
        """Keys on the rows that nothing in whileai reads (``whileai.rows.batch.KNOWN_FIELDS``)."""
        return unknown_fields(self.keys)

    @property
    def field_notes(self) -> tuple[str, ...]:
        """Notes on the unknown keys, each near miss of a known key by name (e.g. 'behaviour_logprobs')."""
        return unknown_field_notes(self.unknown_fields)

    def where(self, i: int) -> str:
        """Row ``i`` as an error names it: "FILE, line N" (1-based, as the file counts lines), "FILE, row N"
        for Parquet (1-based), or "row i" (the index in the list of dicts given)."""
        if self.path is None:
            return f"row {i}"
        unit = "row" if Path(self.path).suffix in (".parquet", ".pq") else "line"
        number = int(self.line_R[i]) if self.line_R is not None else i + 1
        return f"{self.path}, {unit} {number}"

    def passes(self, threshold: float | None = None) -> list[dict[str, Any]]:
        """The passing rows (reward >= threshold) as whole dicts, in order: what SFT trains on.

        Truncated passes are included (``truncated_passes`` counts them; fix the reward first).
        Read again from the file, or taken from the dicts these columns were built from.
        """
        return self._rows_where(self.reward_R >= pass_threshold(self.reward_R, threshold, self.source))

    def fails(self, threshold: float | None = None) -> list[dict[str, Any]]:
        """The failing rows (reward < threshold) as whole dicts, in order."""
        return self._rows_where(self.reward_R < pass_threshold(self.reward_R, threshold, self.source))

    def _rows_where(self, mask_R: np.ndarray) -> list[dict[str, Any]]:
        if self.rows is not None:
            return [dict(self.rows[i]) for i in np.flatnonzero(mask_R)]
        if self.path is None:
            raise ConfigError("these graded rows were built from arrays (GradedRows.from_arrays), so there are no "
                              "rows to return. Fix: load them with wai.load_graded(path), or pass the row dicts.")
        return [row for row, wanted in zip((r for _, r in _records(self.path, None)), mask_R) if wanted]

    @property
    def n_tasks(self) -> int:
        return len(self.task_ids)

    @classmethod
    def from_arrays(cls, task_ids: Sequence[Any] | np.ndarray, rewards: Sequence[float] | np.ndarray,
                    truncated: Sequence[bool] | np.ndarray | None = None,
                    models: Sequence[Any] | None = None) -> GradedRows:
        """Columns straight from arrays (simulations, benchmarks): one task id and reward per row."""
        rewards_arr = np.asarray(rewards, dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(rewards_arr))
        if bad.size:
            raise BatchError(f"row {bad[0]}: field 'reward' is {rewards_arr[bad[0]]}; it must be finite.")
        labels, task_R = _unique_labels("task_id", task_ids)
        n = len(rewards_arr)
        if len(task_R) != n:
            raise BatchError(f"{len(task_R)} task ids for {n} rewards; give one task id per row.")
        trunc = np.zeros(n, bool) if truncated is None else np.asarray(truncated, dtype=bool)
        model_labels: tuple[str, ...] = ()
        if models is None:
            model_R = np.full(n, -1, np.int64)
        else:
            model_labels, model_R = _unique_labels("model", models)
        return cls(task_R.astype(np.int64), labels, rewards_arr, trunc, model_R.astype(np.int64),
                   model_labels, np.full(n, -1, np.int64), ())


def _unique_labels(name: str, values: Sequence[Any] | np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
    """(labels as strings, each value's index into them); integers become their decimal strings."""
    arr = values if isinstance(values, np.ndarray) and values.dtype.kind in "iuU" else np.array(
        [as_label(f"row {i}", name, v) for i, v in enumerate(values)], dtype=str)
    labels, index = np.unique(arr, return_inverse=True)
    return tuple(str(v) for v in labels.tolist()), np.ravel(index)


class _ColumnBuilder:
    """Collects the graded fields row by row into compact arrays; bad rows go to ``problems``."""

    def __init__(self, source: str, need_length: bool, keep_lines: bool, need_seed: bool,
                 path: str | None = None) -> None:
        self.source, self.path = source, path
        self.tasks, self.models, self.seeds = _Codes(), _Codes(), _Codes()
        self.rewards = array("d")
        self.truncated = array("b")
        self.lengths: array[int] | None = array("q") if need_length else None
        self.lines: array[int] | None = array("q") if keep_lines else None
        self.need_seed = need_seed
        self.keys: set[str] = set()
        self.problems = Problems(source)

    def add(self, where: str, row: Mapping[str, Any], lineno: int = 0) -> None:
        """Check every graded field of ``row`` first, then append them all (or record why not)."""
        try:
            values = self._checked(where, row)
        except BatchError as err:
            self.problems.add(err)
            return
        task, reward, truncated, model, seed, length = values
        self.keys.update(row)
        self.tasks.add(task)
        self.rewards.append(reward)
        self.truncated.append(truncated)
        if model is None:
            self.models.codes.append(-1)
        else:
            self.models.add(model)
        if self.need_seed:
            if seed is None:
                self.seeds.codes.append(-1)
            else:
                self.seeds.add(seed)
        if self.lengths is not None:
            self.lengths.append(length)
        if self.lines is not None:
            self.lines.append(lineno)

    def _checked(self, where: str, row: Mapping[str, Any]) -> tuple[str, float, bool, Any, Any, int]:
        for name in ("task_id", "reward"):
            if name not in row:
                raise BatchError(_missing(where, name))
        task = check_label(where, "task_id", row["task_id"])
        reward = check_reward(where, row["reward"])
        truncated = row.get("truncated", False)
        truncated = truncated if truncated is False else check_truncated(where, truncated)
        model = None if row.get("model") is None else check_label(where, "model", row["model"])
        seed = None if not self.need_seed or row.get("seed") is None else check_label(where, "seed", row["seed"])
        length = row_length(where, row) if self.lengths is not None else 0
        return task, reward, truncated, model, seed, length

    def build(self, rows: tuple[Mapping[str, Any], ...] | None = None) -> GradedRows:
        """The columns; raises one ``BatchError`` listing every bad row if there was any."""
        self.problems.raise_if_any()

        # the arrays share memory with the typed arrays they were collected in: no copy
        def ints(values: array[int]) -> np.ndarray:
            dtype = np.int32 if values.typecode == "i" else np.int64
            return np.frombuffer(values, dtype=dtype) if len(values) else np.zeros(0, dtype)

        n = len(self.rewards)
        seed_R = ints(self.seeds.codes) if self.need_seed else np.full(n, -1, np.int64)
        return GradedRows(
            ints(self.tasks.codes), self.tasks.labels(),
            np.frombuffer(self.rewards, np.float64) if n else np.zeros(0), np.frombuffer(self.truncated, np.bool_)
            if n else np.zeros(0, bool), ints(self.models.codes), self.models.labels(), seed_R, self.seeds.labels(),
            None if self.lengths is None else ints(self.lengths), None if self.lines is None else ints(self.lines),
            self.source, self.path, frozenset(self.keys), rows)


def load_graded(path: PathLike, *, lengths: bool = False, lines: bool = False,
                seeds: bool = False) -> GradedRows:
    """Stream a JSONL/Parquet file into ``GradedRows``, keeping only the graded fields.

    ``task_id`` and ``reward`` are required on every row; ``truncated`` (default false) and
    ``model`` are optional. ``lengths=True`` also keeps each row's length (DPO pairs), ``lines=True``
    its line number (to copy kept lines out, to name a row by its line), ``seeds=True`` its ``seed``
    label (``compare``). Every bad line is listed, in file order, in one ``BatchError``.
    """
    builder = _ColumnBuilder(str(path), lengths, lines, seeds, str(path))
    if Path(path).suffix in (".parquet", ".pq"):
        fields = (*GRADED_FIELDS, "seed", *(LENGTH_FIELDS if lengths else ()))
        for number, (where, row) in enumerate(_parquet_records(Path(path), fields), start=1):
            builder.add(where, row, number)
        builder.keys.update(_parquet_names(Path(path)))
    else:
        with open_jsonl(path) as handle:
            if lengths:
                for lineno, line in enumerate(handle, start=1):
                    if line.strip():
                        _slow_line(builder, path, lineno, line)
            else:
                _fast_jsonl(handle, path, builder)
    if not builder.rewards and not builder.problems.count:
        raise BatchError(f"{path}: no rows. Fix: one graded row per line, e.g. "
                         "{\"task_id\": \"t1\", \"reward\": 1.0}.")
    return builder.build()


def _slow_line(builder: _ColumnBuilder, path: PathLike, lineno: int, line: str) -> None:
    """Parse and add one line through the checks that say what is wrong (recorded, not raised)."""
    where = f"{path}, line {lineno}"
    try:
        row = _parse_line(where, line)
    except BatchError as err:
        builder.problems.add(err)
        return
    builder.add(where, row, lineno)


def _fast_jsonl(handle: IO[str], path: PathLike, builder: _ColumnBuilder) -> None:
    """The common case of ``load_graded``, inlined: rows whose fields are all well formed go straight
    into the columns; any line that is not goes through ``_slow_line``, which names what is wrong."""
    decode = json.JSONDecoder().decode
    tasks, models, seeds = builder.tasks.index, builder.models.index, builder.seeds.index
    task_codes, model_codes, seed_codes = builder.tasks.codes, builder.models.codes, builder.seeds.codes
    rewards, truncs, lines, need_seed = builder.rewards, builder.truncated, builder.lines, builder.need_seed
    keys = builder.keys
    for lineno, line in enumerate(handle, start=1):
        try:
            row = decode(line)
            task, reward = row["task_id"], row["reward"]
            truncated, model, seed = row.get("truncated", False), row.get("model"), row.get("seed")
            kind = type(reward)
            if (kind is not float and kind is not int) or reward - reward != 0.0:  # NaN and inf fail here
                raise ValueError
            if truncated is not False and truncated is not True:
                raise ValueError
            if type(task) is not str:  # labels are strings: an integer becomes its decimal string
                task = _int_label(task)
            if model is not None and type(model) is not str:
                model = _int_label(model)
            if seed is not None and type(seed) is not str:
                seed = _int_label(seed)
        except Exception:  # noqa: BLE001 - the slow path below says exactly what was wrong
            if line.strip():
                _slow_line(builder, path, lineno, line)
            continue
        keys.update(row)
        task_codes.append(tasks.setdefault(task, len(tasks)))  # a label's code: its first-seen index
        rewards.append(reward)
        truncs.append(truncated)
        model_codes.append(-1 if model is None else models.setdefault(model, len(models)))
        if need_seed:
            seed_codes.append(-1 if seed is None else seeds.setdefault(seed, len(seeds)))
        if lines is not None:
            lines.append(lineno)


def _int_label(value: Any) -> str:
    if type(value) is not int:
        raise ValueError
    return str(value)


def as_graded(rows: GradedRows | PathLike | Iterable[Mapping[str, Any]], *, lengths: bool = False,
              seeds: bool = False, lines: bool = False) -> GradedRows:
    """``GradedRows`` from columns as they are, a file path, or an iterable of row dicts.

    Every bad row is listed, in order, in one ``BatchError``; dict rows are kept (``passes()``).
    """
    if isinstance(rows, GradedRows):
        return rows
    if isinstance(rows, (str, os.PathLike)):
        return load_graded(rows, lengths=lengths, seeds=seeds, lines=lines)
    dicts = tuple(rows)
    builder = _ColumnBuilder("rows", lengths, lines, seeds)
    for i, row in enumerate(dicts):
        if not isinstance(row, Mapping):
            builder.problems.add(BatchError(f"row {i}: a {type(row).__name__} where a dict was expected; give "
                                            "each row as a dict with 'task_id' and 'reward'."))
            continue
        builder.add(f"row {i}", row, i)
    if not dicts:
        raise BatchError("no rows: give at least one graded row (a dict with 'task_id' and 'reward').")
    return builder.build(dicts)


# --------------------------------------------------------------------------- writing
def check_output_path(target: Path) -> None:
    """Refuse, before any work, an output path that is a folder or whose folder does not exist."""
    if target.is_dir():
        raise ConfigError(f"{target} is a folder; an output must be a file path. Fix: name a file inside it, "
                          f"e.g. {target / 'out.jsonl'}.")
    if not target.parent.is_dir():
        raise ConfigError(f"{target}: the folder {target.parent} does not exist. Fix: create it first "
                          "(mkdir -p), or write somewhere that exists.")


@contextmanager
def atomic_write(path: PathLike) -> Iterator[IO[str]]:
    """Open ``path`` for writing so that it appears whole or not at all.

    Writes go to a temporary file beside ``path``, which replaces ``path`` only after the block
    finishes without an exception; on an error the temporary file is removed and any old ``path``
    is left exactly as it was.
    """
    target = Path(path)
    check_output_path(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_selected(path: PathLike, line_numbers: Sequence[int], out: IO[str],
                   extra: Mapping[int, Mapping[str, Any]] | None = None) -> int:
    """Write the rows at ``line_numbers`` (JSONL lines, or Parquet row numbers) of ``path`` to ``out``.

    A JSONL line with nothing to add is copied byte for byte; a row with ``extra`` fields (DPO's
    ``pair``/``chosen``), or any Parquet row, is written as a JSON line. Returns how many were written.
    """
    wanted = set(int(n) for n in line_numbers)
    extra = extra or {}
    written = 0
    if Path(path).suffix in (".parquet", ".pq"):
        for number, (_, row) in enumerate(_parquet_records(Path(path), None), start=1):
            if number in wanted:
                out.write(json.dumps({**row, **extra.get(number, {})}) + "\n")
                written += 1
        return written
    with open_jsonl(path) as handle:
        for lineno, line in enumerate(handle, start=1):
            if lineno not in wanted:
                continue
            if lineno in extra:
                line = json.dumps({**json.loads(line), **extra[lineno]}) + "\n"
            out.write(line if line.endswith("\n") else line + "\n")
            written += 1
    return written
