"""The batch contract: rows (plain dicts) validated into packed ragged numpy arrays.

A row is one trajectory (DESIGN.md, "A row"). Per-token fields are concatenated into flat
arrays; ``offsets[i]:offsets[i + 1]`` is trajectory ``i``'s slice. Shape suffixes used below:
``_B`` one entry per trajectory, ``_N`` one entry per token of the whole batch, ``_NK`` per token
and per top-k slot.

Validation refuses a bad row with ``BatchError`` naming the row, the field, what is wrong and
how to fix it. Nothing is dropped silently and the input rows are never mutated.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from whileai.errors import BatchError

# Per-token float fields a row may carry, each as long as ``logprobs``.
FLOAT_TOKEN_FIELDS: tuple[str, ...] = ("behavior_logprobs", "values", "ref_logprobs", "teacher_logprobs")
# Per-token top-k fields: one list of K entries per token (distillation over a teacher's top-k): the
# teacher's top-k token ids, the teacher's log-probabilities of them, and the trained model's
# log-probabilities of the same K tokens. A batch carries all of a row's top-k fields on every row or none.
TOPK_FIELDS: tuple[str, ...] = ("teacher_topk_tokens", "teacher_topk_logprobs", "topk_logprobs")
# Fields that are log-probabilities and so must be <= 0.
LOGPROB_FIELDS: frozenset[str] = frozenset({"logprobs", "behavior_logprobs", "ref_logprobs", "teacher_logprobs",
                                            "teacher_topk_logprobs", "topk_logprobs"})
# Cap on log(rho): keeps every ratio finite in float64 and float32.
MAX_LOG_RATIO = 80.0
# Per-row label fields, kept as object arrays of strings (an integer label is read as its decimal
# string, so task 1 and task "1" are one task; see ``as_label``).
ROW_FIELDS: tuple[str, ...] = ("task_id", "agent", "model")
# Every key some part of whileai reads from a row. A key outside it is kept (``Batch.rows``) but read
# by nothing, so it gets a note naming the closest known key: a misspelt ``behaviour_logprobs`` would
# otherwise be ignored in silence. The one list: add a key here when new code starts reading it.
KNOWN_FIELDS: tuple[str, ...] = (
    "reward", "logprobs", "action_mask", "truncated", *FLOAT_TOKEN_FIELDS, *TOPK_FIELDS, *ROW_FIELDS,
    "seed",  # the training seed behind the row (compare)
    "pair", "chosen",  # explicit DPO pairs (select(mode="dpo") writes them, DPO reads them)
    "score",  # RM: the scalar head's output
    # the row's prompt and reply, as tokens or text (length matching, a training loop's bookkeeping)
    "tokens", "prompt_tokens", "prompt", "messages", "completion", "response", "text",
    "sampler_step",  # the policy step that sampled the row (whileai.loop's bookkeeping)
    "reference", "demonstration", "hint", "feedback",  # OPSD's privileged context, one key per choice
)
# How close (difflib's ratio) an unknown key must be to a known one to be named as a likely misspelling.
NEAR_MISS = 0.85


@dataclass(frozen=True, eq=False)
class Batch:
    """Validated, packed trajectories. Build one with ``Batch.from_rows(rows)``."""

    rewards_B: np.ndarray
    offsets: np.ndarray
    logprobs_N: np.ndarray
    action_mask_N: np.ndarray
    truncated_B: np.ndarray
    # float per-token fields present in every row (behavior_logprobs, values, ...), each (N,)
    token_fields: dict[str, np.ndarray] = field(default_factory=dict)
    # top-k per-token fields, each (N, K)
    topk_fields: dict[str, np.ndarray] = field(default_factory=dict)
    # per-row fields (task_id, agent, model), each an object array (B,), None where a row lacks it
    row_fields: dict[str, np.ndarray] = field(default_factory=dict)
    # the rows as given, for methods that read other keys (scores, pairs); never mutated
    rows: tuple[Mapping[str, Any], ...] = ()

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> Batch:
        rows = tuple(rows)
        if not rows:
            raise BatchError("the batch is empty: pass at least one row (a dict with 'reward' and 'logprobs')")
        rewards, lengths = [], []
        for i, row in enumerate(rows):
            rewards.append(_check_row(i, row))
            lengths.append(len(row["logprobs"]))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        logprobs = _concat(rows, "logprobs")
        mask = np.concatenate([np.asarray(r.get("action_mask", [True] * len(r["logprobs"])), dtype=bool) for r in rows])
        token_fields = {name: _concat(rows, name) for name in FLOAT_TOKEN_FIELDS if all(name in r for r in rows)}
        if "behavior_logprobs" not in token_fields and any("behavior_logprobs" in r for r in rows):
            # a row without the sampler's log-probabilities is on-policy: rho = 1 on its tokens
            token_fields["behavior_logprobs"] = np.concatenate(
                [np.asarray(r.get("behavior_logprobs", r["logprobs"]), dtype=np.float64) for r in rows])
        for name in (*FLOAT_TOKEN_FIELDS[1:], *TOPK_FIELDS):
            _refuse_partial(rows, name)
        topk = {name: _concat_topk(rows, name) for name in TOPK_FIELDS if name in rows[0]}
        row_fields = {name: np.array([None if r.get(name) is None else as_label(f"row {i}", name, r[name])
                                      for i, r in enumerate(rows)], dtype=object)
                      for name in ROW_FIELDS if any(name in r for r in rows)}
        truncated = np.array([bool(r.get("truncated", False)) for r in rows], dtype=bool)
        return cls(np.asarray(rewards, dtype=np.float64), offsets, logprobs, mask, truncated,
                   token_fields, topk, row_fields, rows)

    # ----------------------------------------------------------------- shape helpers
    @property
    def size(self) -> int:
        """B, the number of trajectories."""
        return len(self.rewards_B)

    # Derived arrays are computed once per Batch (``cached_property`` stores them on the instance) and
    # marked read-only, so a method cannot change what the next method reads. ``dataclasses.replace``
    # builds a new Batch with an empty cache.
    @cached_property
    def lengths_B(self) -> np.ndarray:
        """Tokens per trajectory (action and environment tokens alike)."""
        return _frozen(np.diff(self.offsets))

    @cached_property
    def row_index_N(self) -> np.ndarray:
        """For every token, the index of the trajectory it belongs to."""
        return _frozen(np.repeat(np.arange(self.size), self.lengths_B))

    @cached_property
    def action_tokens_B(self) -> np.ndarray:
        """T_i: action tokens per trajectory."""
        # summing the float mask is ~5x faster than summing bools cast to int; counts are exact in float64
        return _frozen(np.add.reduceat(self.action_weight_N, self.offsets[:-1]).astype(np.int64))

    @cached_property
    def action_weight_N(self) -> np.ndarray:
        """The action mask as floats (1.0 on action tokens, 0.0 elsewhere), for in-place products."""
        return _frozen(self.action_mask_N.astype(np.float64))

    @cached_property
    def action_count(self) -> int:
        """N: action tokens in the batch."""
        return int(self.action_tokens_B.sum())

    @property
    def behavior_logprobs_N(self) -> np.ndarray:
        """The sampler's log-probabilities; the trained model's where a row has none (rho = 1)."""
        return self.token_fields.get("behavior_logprobs", self.logprobs_N)

    @cached_property
    def log_ratio_N(self) -> np.ndarray:
        """log rho = logprobs - behavior_logprobs per token (0 where a row has no behavior_logprobs)."""
        if "behavior_logprobs" not in self.token_fields:
            return _frozen(np.zeros(len(self.logprobs_N)))
        return _frozen(np.subtract(self.logprobs_N, self.behavior_logprobs_N))

    @cached_property
    def ratio_N(self) -> np.ndarray:
        """rho = exp(logprobs - behavior_logprobs) per token, kept finite.

        The log-ratio is capped at ``MAX_LOG_RATIO`` (rho <= ~5.5e34) so a token the sampler gave a
        vanishing probability cannot turn a coefficient into inf; every method's gate, band or clip
        acts on such a token long before the cap matters.
        """
        ratio = np.minimum(self.log_ratio_N, MAX_LOG_RATIO)
        return _frozen(np.exp(ratio, out=ratio))

    @cached_property
    def unknown_fields(self) -> tuple[str, ...]:
        """Keys some row carries that nothing in whileai reads (not in ``KNOWN_FIELDS``), sorted."""
        return unknown_fields(set().union(*self.rows))

    @property
    def field_notes(self) -> tuple[str, ...]:
        """One note per unknown key that looks like a misspelt known one, then one for the rest."""
        return unknown_field_notes(self.unknown_fields)

    def has(self, name: str) -> bool:
        return name in self.token_fields or name in self.topk_fields or name in self.row_fields

    def require(self, name: str, method: str, why: str) -> np.ndarray:
        """Return a per-token field or raise ``BatchError`` saying which method needs it and why."""
        if name in self.token_fields:
            return self.token_fields[name]
        if name in self.topk_fields:
            return self.topk_fields[name]
        missing = [i for i, r in enumerate(self.rows) if name not in r]
        raise BatchError(
            f"row {missing[0]}: field {name!r} is missing ({_lacking(len(missing), self.size)}); "
            f"{method} needs it: {why}. Add {name!r} to every row, as long as its 'logprobs'."
        )

    def row_field(self, name: str, method: str, why: str) -> np.ndarray:
        """Return a per-row field (task_id, agent, model) or raise naming the first row without it."""
        values = self.row_fields.get(name)
        missing = [i for i in range(self.size) if values is None or values[i] is None]
        if missing:
            raise BatchError(
                f"row {missing[0]}: field {name!r} is missing ({_lacking(len(missing), self.size)}); "
                f"{method} needs it: {why}. Add {name!r} to every row."
            )
        assert values is not None
        return values

    def per_row_sum(self, values_N: np.ndarray) -> np.ndarray:
        """Sum a per-token array within each trajectory (every trajectory has >= 1 token)."""
        return np.add.reduceat(values_N, self.offsets[:-1])

    def any_per_row(self, flags_N: np.ndarray) -> np.ndarray:
        """Per trajectory: is any of its tokens' flags true?"""
        return np.logical_or.reduceat(flags_N, self.offsets[:-1])

    def spread(self, values_B: np.ndarray) -> np.ndarray:
        """Repeat a per-trajectory value over that trajectory's tokens."""
        return np.repeat(values_B, self.lengths_B)

    def split(self, values_N: np.ndarray) -> list[np.ndarray]:
        """Cut a flat per-token array into one array (a view) per trajectory."""
        bounds = self.offsets.tolist()
        return [values_N[start:stop] for start, stop in zip(bounds[:-1], bounds[1:])]

    def action_mean(self, values_N: np.ndarray, rows_B: np.ndarray | None = None) -> float:
        """Mean of a per-token array over the action tokens (of the rows ``rows_B`` selects, when given)."""
        if rows_B is None or rows_B.all():
            return float(np.dot(values_N, self.action_weight_N) / self.action_count)
        count = int(self.action_tokens_B[rows_B].sum())
        if not count:
            return 0.0
        return float(self.per_row_sum(values_N * self.action_weight_N)[rows_B].sum() / count)


def _lacking(missing: int, size: int) -> str:
    """'1 of 1 row lacks it', '2 of 5 rows lack it'."""
    return f"{missing} of {size} row{'' if size == 1 else 's'} {'lacks' if missing == 1 else 'lack'} it"


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def as_label(where: str, name: str, value: Any) -> str:
    """A label (``task_id``, ``agent``, ``model``, ``seed``) as a string: a string as is, an integer as
    its decimal string (so 1 and "1" are one task); anything else is refused, naming ``where``."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return str(int(value))
    raise BatchError(f"{where}: field {name!r} is {value!r} ({type(value).__name__}); a {name} is a string "
                     "(an integer is read as its decimal string, so 1 and \"1\" are the same). Fix: write it "
                     "as a JSON string.")


def unknown_fields(keys: Iterable[Any]) -> tuple[str, ...]:
    """The keys among ``keys`` that nothing in whileai reads, sorted."""
    return tuple(sorted(str(key) for key in set(keys).difference(KNOWN_FIELDS)))


def unknown_field_notes(names: Sequence[str]) -> tuple[str, ...]:
    """Notes on keys nothing reads: each near miss of a known key by name, the rest in one line."""
    notes, others = [], []
    for name in names:
        near = difflib.get_close_matches(name, KNOWN_FIELDS, n=1, cutoff=NEAR_MISS)
        if near:
            notes.append(f"field {name!r} is ignored: no part of whileai reads it. Did you mean {near[0]!r}? "
                         "Rename it if so.")
        else:
            others.append(name)
    if others:
        shown = ", ".join(map(repr, others[:10])) + (f" and {len(others) - 10} more" if len(others) > 10 else "")
        notes.append(f"{len(others)} field{'' if len(others) == 1 else 's'} no part of whileai reads, ignored: "
                     f"{shown}")
    return tuple(notes)


def as_batch(rows: Batch | Iterable[Mapping[str, Any]]) -> Batch:
    """A ``Batch`` as is, or rows validated into one."""
    return rows if isinstance(rows, Batch) else Batch.from_rows(rows)


# --------------------------------------------------------------------- validation
def _check_row(i: int, row: Mapping[str, Any]) -> float:
    if not isinstance(row, Mapping):
        raise BatchError(f"row {i}: expected a dict with 'reward' and 'logprobs', got {type(row).__name__}")
    reward = _check_reward(i, row)
    logprobs = _token_list(i, row, "logprobs", required=True)
    n = len(logprobs)
    if n == 0:
        raise BatchError(f"row {i}: field 'logprobs' is empty; a trajectory needs at least one generated token. "
                         "Drop the row before the update, or check the sampler returned its tokens.")
    for name in (*FLOAT_TOKEN_FIELDS, "action_mask", "tokens"):
        if name in row:
            values = _token_list(i, row, name, required=False)
            if len(values) != n:
                raise BatchError(f"row {i}: field {name!r} has {len(values)} entries but 'logprobs' has {n}; "
                                 f"every per-token field needs one entry per generated token.")
    for name in ("logprobs", *FLOAT_TOKEN_FIELDS):
        if name in row:
            _check_floats(i, name, row[name])
    if "action_mask" in row:
        _check_mask(i, row["action_mask"], n)
    if "truncated" in row and not isinstance(row["truncated"], (bool, np.bool_)):
        raise BatchError(f"row {i}: field 'truncated' is {row['truncated']!r} ({type(row['truncated']).__name__}); "
                         "it must be true or false (true when the reply hit the token cap), or left out.")
    widths = {name: _check_topk(i, name, row[name], n) for name in TOPK_FIELDS if name in row}
    if len(set(widths.values())) > 1:
        shown = ", ".join(f"{name!r} K={k}" for name, k in widths.items())
        raise BatchError(f"row {i}: the top-k fields disagree on K ({shown}); each token needs the same K teacher "
                         "slots in every top-k field, in the same order.")
    return reward


def _check_mask(i: int, values: Sequence[Any], n: int) -> None:
    """``action_mask``: booleans (or 0/1), at least one true; a string such as "false" is refused, not read as true."""
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.dtype != bool and (arr.dtype.kind not in "iuf" or not np.isin(arr, (0, 1)).all())):
        raise BatchError(f"row {i}: field 'action_mask' must be a flat list of true/false (or 0/1), one per "
                         f"token; got {list(values)[:4]!r}{' ...' if n > 4 else ''}.")
    if not arr.any():
        raise BatchError(f"row {i}: field 'action_mask' is false on all {n} tokens, so the trajectory has no "
                         "action tokens to train on; drop the row or mark the tokens the model wrote as true.")


def _check_reward(i: int, row: Mapping[str, Any]) -> float:
    if "reward" not in row:
        raise BatchError(f"row {i}: field 'reward' is missing; every trajectory needs a float reward "
                         "(grade the row first, or drop it if it was never scored).")
    reward = row["reward"]
    if isinstance(reward, bool) or not isinstance(reward, (int, float, np.integer, np.floating)):
        raise BatchError(f"row {i}: field 'reward' is {reward!r} ({type(reward).__name__}); it must be a number.")
    if not math.isfinite(float(reward)):
        raise BatchError(f"row {i}: field 'reward' is {reward!r}; it must be finite (fix the grader).")
    return float(reward)


def _token_list(i: int, row: Mapping[str, Any], name: str, required: bool) -> Sequence[Any]:
    if name not in row:
        if required:
            raise BatchError(f"row {i}: field {name!r} is missing; give one log-probability per generated "
                             "token under the model being trained.")
        return ()
    values = row[name]
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise BatchError(f"row {i}: field {name!r} must be a list with one entry per token, got "
                         f"{type(values).__name__}.")
    return values  # type: ignore[no-any-return]


def _check_floats(i: int, name: str, values: Sequence[Any]) -> None:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise BatchError(f"row {i}: field {name!r} holds something that is not a number; "
                         "give a flat list of floats.") from None
    if arr.ndim != 1:
        raise BatchError(f"row {i}: field {name!r} must be a flat list of floats, got shape {arr.shape}.")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise BatchError(f"row {i}: field {name!r} is {arr[bad[0]]} at token {bad[0]} ({bad.size} non-finite "
                         f"value{'' if bad.size == 1 else 's'}); every value must be finite. Check the engine that produced it.")
    if name in LOGPROB_FIELDS:
        above = np.flatnonzero(arr > 0)
        if above.size:
            raise BatchError(f"row {i}: field {name!r} is {arr[above[0]]} at token {above[0]}, above 0; a "
                             "log-probability is <= 0. Pass log-probabilities, not probabilities or logits.")


def _check_topk(i: int, name: str, values: Any, n: int) -> int:
    """Check one top-k field of row ``i`` (shape (n, K), finite, <= 0 for log-probabilities); return K."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise BatchError(f"row {i}: field {name!r} must be {n} lists of K numbers (same K for every token).") from None
    if arr.ndim != 2 or arr.shape[0] != n or arr.shape[1] == 0:
        raise BatchError(f"row {i}: field {name!r} has shape {arr.shape}; it must be ({n}, K) with K >= 1: one list "
                         "of K entries per generated token, for the teacher's top-K tokens.")
    bad = np.argwhere(~np.isfinite(arr))
    if bad.size:
        raise BatchError(f"row {i}: field {name!r} is {arr[tuple(bad[0])]} at token {bad[0][0]}, slot {bad[0][1]}; "
                         "every value must be finite. Check the engine that produced it.")
    if name in LOGPROB_FIELDS and (above := np.argwhere(arr > 0)).size:
        raise BatchError(f"row {i}: field {name!r} is {arr[tuple(above[0])]} at token {above[0][0]}, slot "
                         f"{above[0][1]}, above 0; a log-probability is <= 0. Pass log-probabilities, not "
                         "probabilities or logits.")
    if name == "teacher_topk_tokens" and (np.any(arr < 0) or np.any(arr != np.round(arr))):
        raise BatchError(f"row {i}: field {name!r} must hold token ids (whole numbers >= 0).")
    return int(arr.shape[1])


def _concat_topk(rows: Sequence[Mapping[str, Any]], name: str) -> np.ndarray:
    """One (N, K) array; a batch whose rows carry different K is refused, naming the first that differs."""
    parts = [np.asarray(r[name], dtype=np.float64) for r in rows]
    widths = [part.shape[1] for part in parts]
    if len(set(widths)) > 1:
        first = next(i for i, k in enumerate(widths) if k != widths[0])
        raise BatchError(f"row {first}: field {name!r} has K={widths[first]} slots per token but row 0 has "
                         f"K={widths[0]}; every row of a batch needs the same K (ask the teacher for the same top-k).")
    return np.concatenate(parts)


def _concat(rows: Sequence[Mapping[str, Any]], name: str) -> np.ndarray:
    return np.concatenate([np.asarray(r[name], dtype=np.float64) for r in rows])


def _refuse_partial(rows: Sequence[Mapping[str, Any]], name: str) -> None:
    present = [name in r for r in rows]
    if any(present) and not all(present):
        missing = present.index(False)
        raise BatchError(f"row {missing}: field {name!r} is missing but other rows carry it; give it on every "
                         "row of the batch or on none (an update cannot mix rows with and without it).")
