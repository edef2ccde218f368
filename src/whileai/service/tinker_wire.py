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


def sample_output(result: dict[str, Any]) -> bytes:
    """The service's ``sample`` result (one prompt) as a ``SampleResponse`` protobuf."""
    out = pb.SampleResponse()
    for seq in result["sequences"][0]:
        out.sequences.append(pb.SampledSequence(
            stop_reason=_STOP[seq["stop_reason"]], tokens=np.asarray(seq["tokens"], np.int32).tobytes(),
            logprobs=np.asarray(seq["logprobs"], np.float32).tobytes()))
    if result.get("prompt_logprobs") is not None:
        values = [np.nan if v is None else v for v in result["prompt_logprobs"]]
        out.prompt_logprobs = np.asarray(values, np.float32).tobytes()
    if result.get("topk_prompt_logprobs") is not None:
        rows = result["topk_prompt_logprobs"]
        k = max(len(r) for r in rows if r is not None)
        ids = np.zeros((len(rows), k), np.int32)
        lps = np.full((len(rows), k), MASK_LOGPROB, np.float32)
        for i, row in enumerate(rows):
            for j, (token, logprob) in enumerate(row or []):
                ids[i, j], lps[i, j] = token, logprob
        out.topk_prompt_logprobs.CopyFrom(pb.TopkLogprobs(token_ids=ids.tobytes(), logprobs=lps.tobytes(), k=k,
                                                          length=len(rows)))
    return out.SerializeToString()  # type: ignore[no-any-return]


UNSUPPORTED_SAMPLE = {"topk_sample_logprobs": 0, "target_prompt_logprobs": None, "prompt_alt_tokens_k": 0,
                      "prompt_logprobs_last_n": None, "record_stability_info": None}


def sample_body(request: Any) -> dict[str, Any]:
    """A ``SampleRequest``'s fields as the service's ``sample`` fields (prompt, n, params, prompt scoring)."""
    asked = [k for k, off in UNSUPPORTED_SAMPLE.items() if getattr(request, k) not in (off, False)]
    if asked:
        raise ConfigError(f"/api/v1/asample: {', '.join(asked)} not supported by wai serve; supported: prompt, "
                          "num_samples, sampling_params, prompt_logprobs, topk_prompt_logprobs")
    try:
        prompt = request.prompt.to_ints()
    except ValueError as err:
        raise BatchError(f"/api/v1/asample: the prompt must be text tokens only ({err})") from None
    params = sampling_params(request.sampling_params)
    return {"prompt_tokens": prompt, "num_samples": request.num_samples, "sampling_params": params,
            "prompt_logprobs": bool(request.prompt_logprobs) or request.topk_prompt_logprobs > 0,
            "topk_prompt_logprobs": request.topk_prompt_logprobs}


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
