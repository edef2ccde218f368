"""The datum format, its validation, and helpers that build datums.

A datum is ``{"model_input": [token ids], "loss_fn_inputs": {...}}``. Every per-position array in
``loss_fn_inputs`` has one entry per ``model_input`` position, and position ``i`` predicts token
``i + 1`` of the full sequence: for a sequence ``full``, ``model_input = full[:-1]`` and
``target_tokens = full[1:]``. ``target_tokens`` is ``(N,)`` or ``(N, K)`` (K targets per position).

Arrays may be lists, numpy arrays, torch tensors, or Tinker ``TensorData`` dicts
(``{"data": [...], "shape": [...]}``); ``model_input`` may also be a Tinker ``ModelInput`` dict
(``{"chunks": [{"tokens": [...]}, ...]}``). Anything wrong raises ``BatchError`` (a ``ValueError``)
naming the datum, the field and the position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from whileai.engine.losses import LossSpec, scored
from whileai.errors import BatchError
from whileai.prompts import text_ids

# loss_fn_inputs that hold one number per position (never per top-k slot)
PER_POSITION_ONLY = frozenset({"values", "returns", "clip_low_threshold", "clip_high_threshold"})


@dataclass
class Prepared:
    """One validated datum: int64 ids, int64 targets ``(N,)``/``(N, K)``, float64 inputs, scored mask."""

    index: int
    input_ids: np.ndarray
    targets: np.ndarray
    inputs: dict[str, np.ndarray]
    scored: np.ndarray

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])


def as_array(value: Any, where: str) -> np.ndarray:
    """A list / numpy array / torch tensor / TensorData dict as a numpy array."""
    if isinstance(value, Mapping) and "data" in value:
        data = np.asarray(value["data"])
        return data.reshape(value["shape"]) if value.get("shape") is not None else data
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except ValueError as err:  # ragged nested lists
        raise BatchError(f"{where} is not a rectangular array ({err}); give one entry (or K) per position") from None


def model_input_tokens(model_input: Any, where: str) -> np.ndarray:
    """Token ids of a ``model_input`` (a list of ints or a ModelInput dict with chunks)."""
    if isinstance(model_input, Mapping) and "chunks" in model_input:
        tokens: list[int] = []
        for j, chunk in enumerate(model_input["chunks"]):
            if "tokens" not in chunk:
                raise BatchError(f"{where}.chunks[{j}] has no 'tokens': only text (token) chunks are supported")
            tokens += list(chunk["tokens"])
        model_input = tokens
    ids = as_array(model_input, where)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise BatchError(f"{where} must be a flat list of integer token ids, got shape {ids.shape} of {ids.dtype}")
    return ids.astype(np.int64)


def check_tokens(ids: np.ndarray, vocab_size: int, where: str) -> None:
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        pos = np.unravel_index(bad[0], ids.shape)
        raise BatchError(f"{where}: token {int(ids[pos])} at position {pos[0] if len(pos) == 1 else tuple(map(int, pos))} "
                         f"is outside the vocabulary [0, {vocab_size}); use ids from this model's tokenizer")


def _check_finite(name: str, array: np.ndarray, where: str) -> None:
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        pos = np.unravel_index(bad[0], array.shape)
        raise BatchError(f"{where}: loss_fn_inputs[{name!r}] is {array[pos]} at position {int(pos[0])}; "
                         "every entry must be a finite number")


def _float_input(name: str, value: Any, targets: np.ndarray, where: str) -> np.ndarray:
    array = as_array(value, f"{where} loss_fn_inputs[{name!r}]")
    n = targets.shape[0]
    shapes = [(n,)] if name in PER_POSITION_ONLY or targets.ndim == 1 else [(n,), targets.shape]
    if array.shape not in shapes:
        want = " or ".join(str(s) for s in shapes)
        raise BatchError(f"{where}: loss_fn_inputs[{name!r}] has shape {array.shape} but model_input has {n} "
                         f"positions, so it must have shape {want} (one entry per position: position i "
                         "predicts token i+1)")
    try:
        array = array.astype(np.float64)
    except (TypeError, ValueError):
        raise BatchError(f"{where}: loss_fn_inputs[{name!r}] must hold numbers") from None
    _check_finite(name, array, where)
    if array.ndim == 1 and targets.ndim == 2 and name not in PER_POSITION_ONLY:
        array = np.repeat(array[:, None], targets.shape[1], axis=1)
    return array


def prepare_datum(index: int, datum: Any, spec: LossSpec, vocab_size: int, max_context: int) -> Prepared:
    """Validate one datum against a loss; raise ``BatchError`` naming datum ``index`` and the position."""
    where = f"datum {index}"
    if not isinstance(datum, Mapping) or "model_input" not in datum:
        raise BatchError(f"{where} must be a dict with 'model_input' and 'loss_fn_inputs', got {type(datum).__name__}")
    ids = model_input_tokens(datum["model_input"], f"{where} model_input")
    if ids.size == 0:
        raise BatchError(f"{where}: model_input is empty; a datum needs at least one position "
                         "(model_input = full[:-1] of a sequence of two or more tokens)")
    if ids.size > max_context:
        raise BatchError(f"{where}: model_input has {ids.size} positions but the model's context is {max_context}; "
                         f"position {max_context} is past it. Shorten the prompt or completion")
    check_tokens(ids, vocab_size, f"{where} model_input")
    inputs_raw = dict(datum.get("loss_fn_inputs") or {})
    allowed = set(spec.inputs) | set(spec.optional_inputs)
    unknown = sorted(set(inputs_raw) - allowed)
    if unknown:
        raise BatchError(f"{where}: loss {spec.name!r} does not read loss_fn_inputs {unknown}; it reads "
                         f"{sorted(spec.inputs)} and optionally {sorted(spec.optional_inputs)}")
    missing = [k for k in spec.inputs if k not in inputs_raw and not (k == "target_tokens" and spec.on_values)]
    if missing:
        raise BatchError(f"{where}: loss {spec.name!r} needs loss_fn_inputs {missing}")
    targets = _targets(inputs_raw, ids, vocab_size, where)
    inputs = {k: _float_input(k, v, targets, where) for k, v in inputs_raw.items() if k != "target_tokens"}
    return Prepared(index, ids, targets, inputs, scored(spec, inputs, ids.size))


def _targets(inputs_raw: dict[str, Any], ids: np.ndarray, vocab_size: int, where: str) -> np.ndarray:
    if "target_tokens" not in inputs_raw:  # a value loss: targets unused
        return np.zeros(ids.size, dtype=np.int64)
    targets = as_array(inputs_raw["target_tokens"], f"{where} loss_fn_inputs['target_tokens']")
    if targets.ndim not in (1, 2) or targets.shape[0] != ids.size or (targets.ndim == 2 and targets.shape[1] == 0):
        raise BatchError(f"{where}: loss_fn_inputs['target_tokens'] has shape {targets.shape} but model_input has "
                         f"{ids.size} positions; it must be ({ids.size},) or ({ids.size}, K)")
    if targets.size and not np.issubdtype(targets.dtype, np.integer):
        if not np.all(np.mod(targets, 1) == 0):
            raise BatchError(f"{where}: loss_fn_inputs['target_tokens'] must hold integer token ids")
        targets = targets.astype(np.int64)
    check_tokens(targets, vocab_size, f"{where} loss_fn_inputs['target_tokens']")
    return targets.astype(np.int64)


def prepare(data: Sequence[Any], spec: LossSpec, vocab_size: int, max_context: int) -> list[Prepared]:
    if isinstance(data, (Mapping, str, bytes)) or not isinstance(data, Sequence):
        raise BatchError("data must be a list of datums (dicts with 'model_input' and 'loss_fn_inputs')")
    if not data:
        raise BatchError("data is empty: pass at least one datum")
    return [prepare_datum(i, d, spec, vocab_size, max_context) for i, d in enumerate(data)]


def make_datum(prompt_tokens: Sequence[int], completion_tokens: Sequence[int],
               **completion_fields: Sequence[float]) -> dict[str, Any]:
    """A datum for a prompt and its completion, shifted so position i predicts token i+1.

    ``completion_fields`` (``advantages``, ``logprobs``, ``weights``, ...) give one value per
    completion token and are 0 over the prompt positions. ``weights`` defaults to 1 on every
    completion token and 0 on the prompt (an SFT datum, and the scored positions of any loss).
    """
    prompt, completion = list(prompt_tokens), list(completion_tokens)
    if not prompt or not completion:
        raise BatchError("make_datum needs a non-empty prompt (the first token has no context) and a "
                         f"non-empty completion; got {len(prompt)} prompt and {len(completion)} completion tokens")
    full = prompt + completion
    pad = len(prompt) - 1
    fields = {"weights": [1.0] * len(completion), **completion_fields}
    inputs: dict[str, Any] = {"target_tokens": full[1:]}
    for name, values in fields.items():
        values = list(values)
        if len(values) != len(completion):
            raise BatchError(f"make_datum: {name} has {len(values)} values but the completion has "
                             f"{len(completion)} tokens; give one per completion token")
        inputs[name] = [0.0] * pad + [float(v) for v in values]
    return {"model_input": full[:-1], "loss_fn_inputs": inputs}


def sft_datum(tokenizer: Any, prompt: str, completion: str, *, add_eos: bool = True) -> dict[str, Any]:
    """An SFT datum from text: weight 1 on the completion's tokens (and the end-of-sequence token)."""
    prompt_ids = text_ids(tokenizer, prompt)  # the one tokenization rule (whileai.prompts)
    completion_ids = tokenizer.encode(completion, add_special_tokens=False)
    if add_eos and tokenizer.eos_token_id is not None:
        completion_ids = completion_ids + [tokenizer.eos_token_id]
    return make_datum(prompt_ids, completion_ids)
