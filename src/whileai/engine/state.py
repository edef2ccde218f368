"""Saving and restoring a ``TrainingEngine``, and exporting its weights for serving.

Layout of a state directory::

    path/LATEST                      name of the newest complete snapshot (replaced atomically)
    path/step-00000012-1a2b3c4d/     weights.safetensors  (trainable parameters, by name)
                                     optimizer.pt         (AdamW moments and step counts)
                                     critic.pt            (value head + its optimizer, if any)
                                     rng.pt               (torch / CUDA / numpy / python RNG states)
                                     meta.json            (step, how the model was loaded)

A snapshot is written under a temporary name, fsynced, renamed into place, and only then is
``LATEST`` switched to it (write-temp-then-``os.replace``), so a crash at any point leaves the
previous state loadable. Older snapshots are deleted after the switch. Every file is read with
``torch.load(weights_only=True)`` or safetensors: loading a state runs no pickled code.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from whileai.errors import ConfigError

FORMAT = 1
LATEST = "LATEST"
# load_model arguments that must match between the saving and the loading engine
MUST_MATCH = ("name_or_path", "lora_rank", "lora_alpha", "target_modules", "train_attn", "train_mlp",
              "train_unembed")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict[str, Any]:
    """Every global RNG as tensors and plain lists (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": version, "internal": list(internal), "gauss": py_gauss},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_snapshot(engine: Any, folder: Path) -> None:
    weights = {n: p.detach().contiguous().cpu() for n, p in engine.named_params.items()}
    save_file(weights, str(folder / "weights.safetensors"))
    torch.save(engine.optimizer.state_dict(), folder / "optimizer.pt")
    if engine.critic is not None:
        torch.save(engine.critic.state_dict(), folder / "critic.pt")
    torch.save(rng_state(), folder / "rng.pt")
    meta = {"format": FORMAT, "step": engine.step, "load_args": engine.loaded.load_args,
            "has_critic": engine.critic is not None}
    (folder / "meta.json").write_text(json.dumps(meta, indent=2))
    for file in folder.iterdir():
        _fsync(file)


def save_state(engine: Any, path: str | os.PathLike[str]) -> str:
    """Write a new snapshot under ``path`` and point ``LATEST`` at it; returns the snapshot's path."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{engine.step:08d}-{uuid.uuid4().hex[:8]}"
    tmp = root / f".tmp-{name}"
    tmp.mkdir()
    try:
        _write_snapshot(engine, tmp)
        os.replace(tmp, root / name)
        pointer = root / f".tmp-{LATEST}-{name}"
        pointer.write_text(name)
        _fsync(pointer)
        os.replace(pointer, root / LATEST)
        _fsync(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in root.glob("step-*"):
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return str(root / name)


def snapshot_dir(path: str | os.PathLike[str]) -> Path:
    """The snapshot to load: ``path`` itself if it is one, else the one ``path/LATEST`` names."""
    root = Path(path)
    if (root / "meta.json").is_file():
        return root
    pointer = root / LATEST
    if not pointer.is_file():
        raise ConfigError(f"no saved state at {str(root)!r}: expected {LATEST} or meta.json there "
                          "(write one with engine.save_state(path))")
    folder = root / pointer.read_text().strip()
    if not (folder / "meta.json").is_file():
        raise ConfigError(f"{str(pointer)!r} names {folder.name!r}, which is not a complete snapshot")
    return folder


def load_state(engine: Any, path: str | os.PathLike[str]) -> None:
    """Restore weights, optimizer, step, RNG and critic written by ``save_state``."""
    folder = snapshot_dir(path)
    meta = json.loads((folder / "meta.json").read_text())
    saved, mine = meta["load_args"], engine.loaded.load_args
    keys: tuple[str, ...] = MUST_MATCH
    if str(saved.get("name_or_path")).startswith("builtin:") and saved.get("lora_rank"):
        keys += ("seed",)  # the frozen base of a built-in is rebuilt from its seed; only adapters are saved
    differ = [f"{k}: saved {saved.get(k)!r}, this engine {mine.get(k)!r}" for k in keys
              if saved.get(k) != mine.get(k)]
    if differ:
        raise ConfigError(f"the state at {str(folder)!r} was saved by a different model setup ({'; '.join(differ)}); "
                          "build the engine with the saved load_model arguments")
    weights = load_file(str(folder / "weights.safetensors"))
    if set(weights) != set(engine.named_params):
        missing = sorted(set(engine.named_params) - set(weights))[:3]
        raise ConfigError(f"the saved weights do not match this model's trainable parameters (e.g. missing {missing})")
    with torch.no_grad():
        for n, p in engine.named_params.items():
            p.copy_(weights[n])
    engine.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    if meta.get("has_critic"):
        if engine.critic is None:
            raise ConfigError("the saved state has a critic: call engine.add_critic(...) with the same settings "
                              "before load_state")
        engine.critic.load_state_dict(torch.load(folder / "critic.pt", weights_only=True))
    set_rng_state(torch.load(folder / "rng.pt", weights_only=True))
    engine.step = int(meta["step"])


def _layer(module: Any) -> Any:
    """The plain layer under a PEFT wrapper (``base_layer``), or the module itself."""
    return getattr(module, "base_layer", module)


def untie_adapted_embeddings(model: Any) -> bool:
    """Give the output layer its own copy of a tied embedding matrix when an adapter sits on either side.

    With tied input/output embeddings the two layers share one weight. Merging a LoRA delta of the
    output layer (or of the embedding) writes into that shared weight and so changes the other layer
    too: the merged model is no longer the trained one (9-20 nats apart, measured). Untying first, and
    saying so in the config (``tie_word_embeddings=False``), merges each delta into its own layer only.
    Returns whether it untied. ``model`` is a PEFT model about to be merged (a copy: this edits it).
    """
    base = model.get_base_model()
    head, embedding = base.get_output_embeddings(), base.get_input_embeddings()
    if head is None or embedding is None or _layer(head).weight is not _layer(embedding).weight:
        return False
    if _layer(head) is head and _layer(embedding) is embedding:  # no adapter on either: the tie is faithful
        return False
    _layer(head).weight = torch.nn.Parameter(_layer(head).weight.detach().clone(), requires_grad=False)
    for config in {id(c): c for c in (base.config, base.config.get_text_config())}.values():
        config.tie_word_embeddings = False
    return True


def export(engine: Any, path: str | os.PathLike[str], *, merged: bool = False, overwrite: bool = False,
           dtype: str | torch.dtype | None = None) -> str:
    """Write a PEFT adapter dir (``merged=False``) or a full model dir with the tokenizer; atomic rename.

    A full model is written in ``dtype``; None: the dtype of the folder the model was loaded from (a bfloat16
    folder trained in float32 is exported in bfloat16, as it came), or the weights' own for a built-in."""
    target = Path(path)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise ConfigError(f"{str(target)!r} exists and is not empty; pass overwrite=True or another path")
    is_lora = engine.loaded.lora is not None
    if not merged and not is_lora:
        raise ConfigError("this engine trains every weight (no LoRA), so there is no adapter to export; "
                          "use export(path, merged=True) for a full model directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-export-{uuid.uuid4().hex[:8]}"
    try:
        model = engine.model
        if merged and is_lora:
            model = copy.deepcopy(model)
            untie_adapted_embeddings(model)
            model = model.merge_and_unload()
        if merged:
            _save_in(model, tmp, _named(dtype) if dtype is not None else engine.loaded.source_dtype)
        else:  # the vocabulary never changes, so the adapter needs no copy of the embeddings
            model.save_pretrained(str(tmp), save_embedding_layers=False)
        engine.tokenizer.save_pretrained(str(tmp))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(target)


def _named(dtype: str | torch.dtype) -> torch.dtype:
    from whileai.engine.models import _named_dtype

    return _named_dtype(dtype)


def _save_in(model: Any, folder: Path, dtype: torch.dtype | None) -> None:
    """``save_pretrained`` with the floating-point weights cast to ``dtype`` (a tensor shared by tied layers stays
    one), and config.json saying so; the model itself is not changed."""
    if dtype is None or all(p.dtype == dtype for p in model.parameters() if p.is_floating_point()):
        model.save_pretrained(str(folder))
        return
    cast: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}
    state = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))  # tied layers: one storage, one cast tensor
        if key not in cast:
            cast[key] = tensor.detach().to(dtype) if tensor.is_floating_point() else tensor
        state[name] = cast[key]
    model.save_pretrained(str(folder), state_dict=state)
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    for field in ("dtype", "torch_dtype"):
        if field in config:
            config[field] = str(dtype).removeprefix("torch.")
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
