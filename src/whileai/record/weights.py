"""New weights for a running ``wai policy``: LoRA adapters loaded and unloaded at runtime, and a full reload.

The routes (``record.policy_app``) take the bodies of the servers a trainer syncs to in production:

    POST /v1/load_lora_adapter     {"lora_name", "lora_path", "load_inplace"?}   vLLM's runtime LoRA route
    POST /v1/unload_lora_adapter   {"lora_name"}                                 vLLM's
    POST /update_weights_from_disk {"model_path", "weight_version"?}             SGLang's full reload

An adapter is a PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``, what
``TrainingEngine.export`` writes); completions with ``model=<lora_name>`` then sample from base + adapter.
Adapters share the one base model (PEFT's multi-adapter wrapper); each has its own weights version,
``<lora_name>@<digest of the adapter file>``. A full reload replaces the base (and drops every adapter,
which was trained on the old one); its version is the folder's digest, or the ``weight_version`` sent.

Before the model is touched, an adapter is checked against the base: its folder and PEFT config exist, every
LoRA matrix fits the layer it names (shapes), and, where the trainer wrote ``whileai_base.json`` (see
``loop.sources.server_sampler.write_weights``), the base it was trained on has this server's base version.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from whileai.record.policy import Served, load, weights_version
from whileai.record.requests import RequestError

BASE_FILE = "whileai_base.json"
"""Written beside an adapter by the trainer: ``{"base_version": ...}``, the base model it was trained on."""
ARCHITECTURE = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads")


def _name(body: Any, field: str) -> str:
    value = body.get(field) if isinstance(body, dict) else None
    if not isinstance(value, str) or not value:
        raise RequestError(f"'{field}' is {value!r}; it must be a non-empty string", param=field)
    return value


def _adapter_folder(path: str) -> Path:
    folder = Path(path)
    if not folder.is_dir():
        raise RequestError(f"lora_path {path!r}: no such folder on the server's machine. Fix: give the folder "
                           "the trainer wrote (TrainingEngine.export(path) writes a PEFT adapter)", param="lora_path")
    config = folder / "adapter_config.json"
    if not config.is_file() or not (folder / "adapter_model.safetensors").is_file():
        raise RequestError(f"lora_path {path!r} is not a PEFT adapter folder: it needs adapter_config.json and "
                           "adapter_model.safetensors. Fix: export the adapter with TrainingEngine.export(path) "
                           "(merged=False) or PeftModel.save_pretrained", param="lora_path")
    peft_type = json.loads(config.read_text()).get("peft_type")
    if peft_type != "LORA":
        raise RequestError(f"lora_path {path!r} holds a {peft_type} adapter; only LoRA adapters load here",
                           param="lora_path")
    return folder


def _check_base(served: Served, folder: Path) -> None:
    """Refuse an adapter trained on another base: its recorded base version, then every matrix's shape."""
    base_file = folder / BASE_FILE
    if base_file.is_file():
        trained_on = json.loads(base_file.read_text()).get("base_version")
        if trained_on != served.version:
            raise RequestError(f"the adapter at {str(folder)!r} was trained on base {trained_on!r}, but this server's "
                               f"base is {served.name!r} (version {served.version!r}). Fix: serve the base the "
                               "adapter was trained on (same model and seed)", param="lora_path")
    from safetensors import safe_open

    model = served.engine.model
    with safe_open(str(folder / "adapter_model.safetensors"), "pt") as tensors:
        for key in tensors.keys():
            problem = _misfit(model, key, tuple(tensors.get_slice(key).get_shape()))
            if problem is not None:
                raise RequestError(f"the adapter at {str(folder)!r} does not fit this server's base {served.name!r} "
                                   f"(base mismatch): {problem}. Fix: load it on the base it was trained on",
                                   param="lora_path")


def _misfit(model: Any, key: str, shape: tuple[int, ...]) -> str | None:
    """Why the LoRA tensor ``key`` (PEFT's saved name) cannot sit on its layer of ``model``, or None."""
    parts = key.removeprefix("base_model.model.").split(".")
    kinds = [i for i, p in enumerate(parts) if p.startswith("lora_")]
    if not kinds:
        return None
    where, kind = ".".join(parts[:kinds[0]]), parts[kinds[0]]
    try:
        layer = model.get_submodule(where)
    except AttributeError:
        return f"it adapts layer {where!r}, which this model does not have"
    layer = getattr(layer, "base_layer", layer)
    sizes = {"lora_A": getattr(layer, "in_features", None), "lora_B": getattr(layer, "out_features", None),
             "lora_embedding_A": getattr(layer, "num_embeddings", None),
             "lora_embedding_B": getattr(layer, "embedding_dim", None)}
    want = sizes.get(kind)
    got = shape[1] if kind in ("lora_A", "lora_embedding_A") else shape[0]
    if want is not None and got != want:
        return f"{key} has shape {list(shape)}, but layer {where!r} has {want} where the adapter has {got}"
    return None


def load_adapter(served: Served, body: Any) -> str:
    """Load (or, with ``load_inplace``, replace) a runtime adapter; returns its weights version."""
    name, path = _name(body, "lora_name"), _name(body, "lora_path")
    if name == served.name:
        raise RequestError(f"lora_name {name!r} is the base model's name; pick another", param="lora_name")
    if name in served.adapters and not body.get("load_inplace"):
        raise RequestError(f"The lora adapter {name!r} has already been loaded. Fix: send load_inplace=true to "
                           "replace it, unload it first, or load the new weights under a new name",
                           param="lora_name")
    folder = _adapter_folder(path)
    _check_base(served, folder)
    if name in served.adapters:  # replaced in place: the name stays listed, so a request read meanwhile waits
        _drop(served, name)      # on the lock for the new weights instead of finding no such model
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PEFT's notes on deprecated transformers calls and on active adapters
            if served.peft is None:
                from peft import PeftModel

                served.peft = PeftModel.from_pretrained(served.engine.model, str(folder), adapter_name=name)
            else:
                served.peft.load_adapter(str(folder), adapter_name=name)
    except BaseException:
        served.adapters.pop(name, None)
        raise
    served.peft.eval()
    served.adapters[name] = f"{name}@{weights_version(str(folder), 0)}"
    return served.adapters[name]


def unload_adapter(served: Served, body: Any) -> str:
    """Remove a runtime adapter (the last one out restores the plain base model); returns its name."""
    name = _name(body, "lora_name")
    if name not in served.adapters:
        raise RequestError(f"The lora adapter {name!r} cannot be found; loaded: {sorted(served.adapters)}",
                           status=404, param="lora_name")
    _drop(served, name)
    del served.adapters[name]
    return name


def _drop(served: Served, name: str) -> None:
    """Take adapter ``name`` out of the PEFT wrapper (the last one out restores the plain base model)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if set(served.adapters) - {name}:
            served.peft.delete_adapter(name)
        else:
            served.peft.unload()
            served.peft = None


def read_full(served: Served, body: Any) -> tuple[Served, str]:
    """Load the weights folder of an ``update_weights_from_disk`` body (slow: outside the sampling lock) and
    check it has the served architecture. Returns the new ``Served`` (same name) and its version."""
    path = _name(body, "model_path")
    version = body.get("weight_version")
    if version is not None and (not isinstance(version, str) or not version):
        raise RequestError(f"'weight_version' is {version!r}; it must be a non-empty string or left out",
                           param="weight_version")
    try:
        new = load(path)
    except Exception as err:  # a missing folder, an adapter-only folder, unreadable weights
        raise RequestError(f"model_path {path!r} could not be loaded: {err}", param="model_path") from None
    old_config, new_config = served.engine.model.config, new.engine.model.config
    differ = [f"{k}: served {getattr(old_config, k, None)!r}, new {getattr(new_config, k, None)!r}"
              for k in ARCHITECTURE if getattr(old_config, k, None) != getattr(new_config, k, None)]
    if differ:
        raise RequestError(f"model_path {path!r} has another architecture than the served model ({'; '.join(differ)})."
                           " Fix: reload weights of the same model, or start a new `wai policy` for this one",
                           param="model_path")
    return Served(new.engine, served.name, version or new.version), path


def swap_full(served: Served, new: Served) -> list[str]:
    """Put the reloaded weights in place (under the sampling lock); returns the adapters it dropped."""
    dropped = sorted(served.adapters)
    served.engine, served.version = new.engine, new.version
    served.adapters.clear()
    served.peft = None
    return dropped
