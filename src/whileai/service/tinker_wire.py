"""Tinker SDK bodies <-> the service's bodies, using the SDK's own message definitions (``pip install tinker``).

The SDK sends ``forward_backward`` as a protobuf ``ForwardBackwardRequest`` and reads ``ForwardBackwardOutput``
and ``SampleResponse`` back as protobuf (``tinker.proto.tinker_public_pb2``); every other body is JSON of the
SDK's pydantic types (``tinker.types``). Nothing here is re-declared: the messages and types are the SDK's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tinker import types as T
from tinker.proto import tinker_public_pb2 as pb
from tinker.types.topk_logprobs import MASK_LOGPROB

from whileai.errors import BatchError, ConfigError

_NUMPY = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
_STOP = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}
ADAM_KEYS = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")


def _tokens(chunks: Any, where: str) -> list[int]:
    """A model input's token ids; only text chunks are supported (no images, no audio)."""
    tokens: list[int] = []
    for i, chunk in enumerate(chunks):
        kind = chunk.WhichOneof("chunk") if hasattr(chunk, "WhichOneof") else None
        if kind != "encoded_text":
            raise ConfigError(f"{where}: model_input chunk {i} is {kind or type(chunk).__name__}; wai serve takes "
                              "text token chunks only (ModelInput.from_ints); images and audio are not supported")
        tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
    return tokens


def _tensor(msg: Any, where: str) -> list[Any]:
    """A proto ``Tensor`` as (nested) lists; sparse CSR is made dense."""
    if msg.dtype not in _NUMPY:
        raise ConfigError(f"{where}: tensor dtype {msg.dtype} is not supported; send float32 or int64")
    dtype = _NUMPY[msg.dtype]
    shape = list(msg.shape)
    if msg.HasField("sparse_csr"):
        csr = msg.sparse_csr
        values = np.frombuffer(csr.values, dtype=dtype)
        rows = np.frombuffer(csr.crow_indices, dtype=np.int64)
        cols = np.frombuffer(csr.col_indices, dtype=np.int64)
        dense = np.zeros(shape, dtype=dtype)
        for r in range(len(rows) - 1):
            dense[r, cols[rows[r]:rows[r + 1]]] = values[rows[r]:rows[r + 1]]
        return dense.tolist()  # type: ignore[no-any-return]
    flat = np.frombuffer(msg.dense, dtype=dtype)
    return flat.reshape(shape or [-1]).tolist()  # type: ignore[no-any-return]


def forward_backward_body(raw: bytes) -> tuple[Any, dict[str, Any]]:
    """The protobuf request and the service's ``forward_backward`` fields (data, loss_function, loss_config)."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(raw)
    except Exception as err:  # protobuf's DecodeError
        raise ConfigError(f"/api/v1/forward_backward: the body is not a ForwardBackwardRequest protobuf ({err})") from None
    data = []
    for i, datum in enumerate(msg.data):
        where = f"/api/v1/forward_backward datum {i}"
        if len(datum.model_input_spans) or len(datum.loss_fn_input_spans):
            raise ConfigError(f"{where}: provenance spans are not supported by wai serve; send the datum without them")
        inputs = {name: _tensor(t, f"{where} loss_fn_inputs[{name!r}]") for name, t in datum.loss_fn_inputs.items()}
        if msg.loss_fn == "cross_entropy" and "weights" not in inputs and "target_tokens" in inputs:
            inputs["weights"] = [1.0] * len(inputs["target_tokens"])  # Tinker's default: every position counts
        data.append({"model_input": _tokens(datum.model_input, where), "loss_fn_inputs": inputs})
    config: dict[str, Any] = {k: v.number if v.WhichOneof("value") == "number" else v.text
                              for k, v in msg.loss_fn_config_v2.items()}
    config = config or dict(msg.loss_fn_config)
    return msg, {"data": data, "loss_function": msg.loss_fn, "loss_config": config or None}


def adam_params(request: Any) -> dict[str, Any]:
    """An ``OptimStepRequest``'s Adam settings as the engine's ``AdamParams`` fields."""
    params = request.optim_params
    if not isinstance(params, T.AdamParams):
        raise ConfigError(f"/api/v1/optim_step: optimizer {type(params).__name__} is not supported; wai serve "
                          "runs AdamW (tinker.AdamParams)")
    return {k: getattr(params, k) for k in ADAM_KEYS}


def _batched(arrays: list[np.ndarray], dtype: Any, code: Any) -> Any:
    arrays = [np.asarray(a, dtype=dtype) for a in arrays]
    sizes = [a.nbytes for a in arrays]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    trailing = list(arrays[0].shape[1:]) if arrays else []
    return pb.BatchedTensor(data=b"".join(a.tobytes() for a in arrays), offsets=offsets.tobytes(), dtype=code,
                            trailing_shape=trailing)


def forward_backward_output(result: dict[str, Any]) -> bytes:
    """The engine's ``{"loss_fn_outputs": [...], "metrics": {...}}`` as a ``ForwardBackwardOutput`` protobuf."""
    outputs = result["loss_fn_outputs"]
    record = pb.ArrayRecord(type_tag="TorchLossReturn", num_datums=len(outputs))
    for name in outputs[0] if outputs else []:
        record.fields[name].CopyFrom(_batched([o[name] for o in outputs], np.float32, pb.DTYPE_FLOAT32))
    out = pb.ForwardBackwardOutput(loss_fn_output_type="TorchLossReturn", metrics=result["metrics"])
    out.loss_fn_outputs.append(record)
    return out.SerializeToString()  # type: ignore[no-any-return]


def _topk(rows: list[Any]) -> Any:
    """Rows of (token, logprob) pairs (None for a position with none) as a dense ``TopkLogprobs``."""
    k = max([len(r) for r in rows if r is not None] or [0])
    ids = np.zeros((len(rows), k), np.int32)
    lps = np.full((len(rows), k), MASK_LOGPROB, np.float32)
    for i, row in enumerate(rows):
        for j, (token, logprob) in enumerate(row or []):
            ids[i, j], lps[i, j] = token, logprob
    return pb.TopkLogprobs(token_ids=ids.tobytes(), logprobs=lps.tobytes(), k=k, length=len(rows))


def _dense(values: Any, dtype: Any, code: Any) -> Any:
    array = np.asarray(values, dtype=dtype)
    return pb.Tensor(dense=array.tobytes(), dtype=code, shape=list(array.shape))


def _targets_output(rows: list[list[float | None]], sparse: Any) -> Any:
    values = np.asarray([[0.0 if v is None else v for v in row] for row in rows], np.float32).reshape(len(rows), -1)
    if sparse is None:
        return _dense(values, np.float32, pb.DTYPE_FLOAT32)
    crow, col = sparse
    at = np.repeat(np.arange(len(crow) - 1), np.diff(crow))
    csr = pb.SparseCsr(values=values[at, col].astype(np.float32).tobytes(),
                       crow_indices=np.asarray(crow, np.int64).tobytes(), col_indices=np.asarray(col, np.int64).tobytes())
    return pb.Tensor(sparse_csr=csr, dtype=pb.DTYPE_FLOAT32, shape=list(values.shape))


def sample_output(result: dict[str, Any], last_n: int | None = None, sparse: Any = None) -> bytes:
    """The service's ``sample`` result (one prompt) as a ``SampleResponse`` protobuf. ``last_n``: only the last
    n prompt positions keep their scores (``prompt_logprobs_last_n``); ``sparse``: the (crow, col) layout the
    request's ``target_prompt_logprobs`` came in, which the answer keeps."""
    out = pb.SampleResponse()
    for seq in result["sequences"][0]:
        sampled = pb.SampledSequence(
            stop_reason=_STOP[seq["stop_reason"]], tokens=np.asarray(seq["tokens"], np.int32).tobytes(),
            logprobs=np.asarray(seq["logprobs"], np.float32).tobytes())
        if seq.get("topk_logprobs") is not None:
            sampled.topk_sampled_logprobs.CopyFrom(_topk(seq["topk_logprobs"]))
        out.sequences.append(sampled)
    skipped = 0 if last_n is None else max(len(result.get("prompt_logprobs") or []) - last_n, 0)
    if result.get("prompt_logprobs") is not None:
        values = [np.nan if v is None or i < skipped else v for i, v in enumerate(result["prompt_logprobs"])]
        out.prompt_logprobs = np.asarray(values, np.float32).tobytes()
    if result.get("topk_prompt_logprobs") is not None:
        rows = [None if i < skipped else r for i, r in enumerate(result["topk_prompt_logprobs"])]
        out.topk_prompt_logprobs.CopyFrom(_topk(rows))
    if result.get("target_prompt_logprobs") is not None:
        out.target_prompt_logprobs.CopyFrom(_targets_output(result["target_prompt_logprobs"], sparse))
    if result.get("prompt_alt_tokens") is not None:
        alt = result["prompt_alt_tokens"]
        out.prompt_alt_tokens.CopyFrom(pb.PromptAltTokens(
            tokens=_dense(alt["tokens"], np.int32, pb.DTYPE_INT32),
            logprobs=_dense(alt["logprobs"], np.float32, pb.DTYPE_FLOAT32)))
    return out.SerializeToString()  # type: ignore[no-any-return]


UNSUPPORTED_SAMPLE = {"record_stability_info": None}


def targets_of(tensor: Any, prompt_length: int) -> tuple[list[list[int]], Any]:
    """A request's ``target_prompt_logprobs`` (dense or sparse CSR, ``[len(prompt) - 1, K]``) as dense rows with
    -1 where nothing is asked, and its sparse layout (None when dense)."""
    where = "/api/v1/asample: target_prompt_logprobs"
    shape = list(tensor.shape or [])
    if len(shape) != 2 or shape[0] != prompt_length - 1:
        raise ConfigError(f"{where} has shape {shape}; it must be [len(prompt) - 1, K] = [{prompt_length - 1}, K] "
                          "(row i is scored at prompt position i + 1)")
    if tensor.dtype != "int64" or any(not isinstance(t, int) for t in tensor.data):
        raise ConfigError(f"{where} has dtype {tensor.dtype}; it holds token ids: int64")
    if tensor.sparse_crow_indices is None:
        if len(tensor.data) != shape[0] * shape[1]:
            raise ConfigError(f"{where} has {len(tensor.data)} values for the shape {shape}")
        return np.asarray(tensor.data, np.int64).reshape(shape).tolist(), None  # type: ignore[no-any-return]
    crow, col = list(tensor.sparse_crow_indices), list(tensor.sparse_col_indices or [])
    if len(crow) != shape[0] + 1 or len(col) != len(tensor.data) or crow[-1] != len(col) or \
            any(not 0 <= c < shape[1] for c in col):
        raise ConfigError(f"{where}: the sparse CSR indices do not describe a {shape} tensor")
    dense = np.full(shape, -1, np.int64)
    for r in range(shape[0]):
        dense[r, col[crow[r]:crow[r + 1]]] = tensor.data[crow[r]:crow[r + 1]]
    return dense.tolist(), (crow, col)


def sample_body(request: Any, vocab_size: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ``SampleRequest``'s fields as the service's ``sample`` fields, and how to shape the answer
    (``last_n``, the targets' sparse layout). Every field of SDK 0.38 but ``record_stability_info``."""
    asked = [k for k, off in UNSUPPORTED_SAMPLE.items() if getattr(request, k) not in (off, False)]
    if asked:
        raise ConfigError(f"/api/v1/asample: {', '.join(asked)} (StableReinforce's stability records) is not "
                          "available on wai serve; its losses do not read them")
    try:
        prompt = request.prompt.to_ints()
    except ValueError as err:
        raise BatchError(f"/api/v1/asample: the prompt must be text tokens only ({err})") from None
    params = sampling_params(request.sampling_params)
    scores = bool(request.prompt_logprobs) or request.topk_prompt_logprobs > 0
    last_n = request.prompt_logprobs_last_n
    if last_n is not None and (not scores or not 1 <= last_n <= len(prompt) - 1):
        raise ConfigError(f"/api/v1/asample: prompt_logprobs_last_n={last_n} needs prompt_logprobs (or "
                          f"topk_prompt_logprobs) and must be between 1 and len(prompt) - 1 = {len(prompt) - 1}")
    for name in ("topk_prompt_logprobs", "topk_sample_logprobs"):
        k = getattr(request, name)
        if vocab_size is not None and not 0 <= k <= vocab_size:
            raise ConfigError(f"/api/v1/asample: {name}={k} must be between 0 and the vocabulary size {vocab_size}")
    if request.prompt_alt_tokens_k and request.sampling_params.temperature <= 0:
        raise ConfigError(f"/api/v1/asample: prompt_alt_tokens_k={request.prompt_alt_tokens_k} draws at the "
                          "request's temperature; temperature 0 (greedy) has no distribution to draw from")
    targets, sparse = (None, None) if request.target_prompt_logprobs is None else \
        targets_of(request.target_prompt_logprobs, len(prompt))
    if targets is not None and vocab_size is not None and any(t >= vocab_size or t < -1 for r in targets for t in r):
        raise ConfigError(f"/api/v1/asample: target_prompt_logprobs holds ids outside [0, {vocab_size}) (-1 asks "
                          "nothing)")
    fields = {"prompt_tokens": prompt, "num_samples": request.num_samples, "sampling_params": params,
              "prompt_logprobs": scores, "topk_prompt_logprobs": request.topk_prompt_logprobs,
              "topk_sample_logprobs": request.topk_sample_logprobs, "target_prompt_logprobs": targets,
              "prompt_alt_tokens_k": request.prompt_alt_tokens_k}
    return fields, {"last_n": last_n, "sparse": sparse}


UNTIL_CONTEXT = 2**31 - 1
"""``max_tokens`` for the SDK's ``max_tokens=None``: no cap but the model's context (the engine stops a sample
there, with ``stop_reason="length"``)."""


def sampling_params(params: Any) -> dict[str, Any]:
    """The SDK's ``SamplingParams`` as the engine's fields. ``stop`` keeps its strings (the engine matches them
    on the decoded text with the run's tokenizer) and token ids; ``stop=[]`` means no EOS stop either
    (``ignore_eos``), ``stop=None`` the EOS stop only; ``max_tokens=None`` runs to the model's context."""
    fields = params.model_dump(exclude_none=True)
    if params.stop is not None and not isinstance(params.stop, str) and len(params.stop) == 0:
        fields["ignore_eos"] = True
    if params.max_tokens is None:
        fields["max_tokens"] = UNTIL_CONTEXT
    return fields  # type: ignore[no-any-return]
