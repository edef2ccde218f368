"""Load a causal language model: a built-in, a local Hugging Face directory, or a hub id.

Built-ins (``builtin:tiny``, ``builtin:mini``, ``builtin:small``) are real Qwen2 decoders built
from a config and randomly initialised from a seed, with a byte-level tokenizer constructed in
code (256 byte tokens + 3 specials), so nothing is downloaded and the same seed gives the same
weights on every machine. LoRA goes through PEFT; without ``lora_rank`` every weight trains.
"""

from __future__ import annotations

import contextlib
import os
import socket
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import torch

from whileai.engine.rng import seeded
from whileai.errors import ConfigError

SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>")

# name -> Qwen2 config fields. Parameter counts are printed by `python -m whileai.engine.models`.
BUILTINS: dict[str, dict[str, int]] = {
    # ~0.1M parameters: tests
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256),
    # ~0.85M parameters: the CPU demo
    "mini": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512),
    # ~25M parameters: the train_step benchmark
    "small": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=8, max_position_embeddings=1024),
}

# Path components that mark a layer as part of attention / of the MLP (Qwen2 and Llama: self_attn / mlp;
# GPT-2: attn / mlp; GPT-NeoX: attention; Falcon: self_attention; Gemma 3n / Mixtral: feed_forward).
ATTN_MARKS = ("attn", "attention")
MLP_MARKS = ("mlp", "feed_forward", "ffn")
# Mixture-of-experts routers sit inside the MLP as plain linear layers; adapting one moves which expert
# a token takes, so discovery leaves them out (name them in target_modules to adapt them anyway).
ROUTERS = ("gate", "router", "shared_expert_gate")


@dataclass
class LoadedModel:
    """A model ready for the engine: the (possibly PEFT-wrapped) model and its tokenizer."""

    model: Any
    tokenizer: Any
    name: str
    device: torch.device
    dtype: torch.dtype
    lora: dict[str, Any] | None = None
    load_args: dict[str, Any] = field(default_factory=dict)
    autocast: torch.dtype | None = None
    """Compute dtype of the forward passes under ``torch.autocast`` (None: run in the weights' dtype)."""
    notes: list[str] = field(default_factory=list)
    """Plain sentences about how the model was set up that a user should know (e.g. LoRA on the head only)."""
    source_dtype: torch.dtype | None = None
    """The dtype the model folder holds its weights in (its config's ``dtype``; None for a built-in): an export
    writes that dtype (a bfloat16 folder stays bfloat16) unless asked otherwise."""

    def precision(self) -> Any:
        """A context manager running its block under this model's autocast (a no-op without one)."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast)

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2 ** 31))

    @property
    def vocab_size(self) -> int:
        """Rows of the output layer: every valid token id is below this."""
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        return int(base.get_output_embeddings().weight.shape[0])


# ----------------------------------------------------------------------------- tokenizer
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for every byte (what the ByteLevel pre-tokenizer emits)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer() -> Any:
    """A byte-level tokenizer: ids 0-2 are pad/bos/eos, id ``3 + b`` is byte ``b``. Deterministic.

    It adds BOS itself (``encode(text)`` is ``[1, ...]``; ``add_special_tokens=False`` leaves it out), so the
    tokenizer saved to a model folder encodes text exactly as training did (``whileai.prompts``). Text is
    NFC-normalised first, as transformers' Qwen2 tokenizer class (the one ``AutoTokenizer`` picks for an
    exported built-in folder) always does, so in-process and reloaded ids agree on every text. It has no
    unknown token (every byte has an id), so a reloaded copy has the model's 259 ids, not one more.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for b, ch in _bytes_to_unicode().items():
        vocab[ch] = len(SPECIAL_TOKENS) + b
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=SPECIAL_TOKENS[0], bos_token=SPECIAL_TOKENS[1],
                                   eos_token=SPECIAL_TOKENS[2], unk_token=None, add_bos_token=True)


# ----------------------------------------------------------------------------- devices
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "float64": torch.float64}
AUTOCAST = ("auto", "off", "bfloat16", "float16")


def _named_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not known: use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The given device, or CUDA when torch sees a GPU, else the CPU."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {str(dev)!r} was asked for but torch sees no CUDA GPU "
                          f"(torch {torch.__version__}); use device='cpu' or install a CUDA build of torch")
    return dev


def resolve_precision(device_type: str, dtype: str | torch.dtype | None, autocast: str,
                      lora: bool) -> tuple[torch.dtype, torch.dtype | None]:
    """``(weight dtype, autocast dtype or None)``; a pure function of the arguments.

    Default (``dtype=None, autocast="auto"``): CPU float32, no autocast. On CUDA under LoRA, bfloat16
    base weights (PEFT keeps the trained adapters in float32); on CUDA for full fine-tuning, float32
    weights with bfloat16 autocast, so small AdamW updates are not rounded away by bf16 weights.
    An explicit ``dtype`` is used as given (native, no autocast unless ``autocast`` names a dtype).
    """
    if autocast not in AUTOCAST:
        raise ConfigError(f"autocast {autocast!r} is not known: use one of {list(AUTOCAST)}")
    weights = None if dtype is None else _named_dtype(dtype)
    if autocast not in ("auto", "off"):
        return weights or torch.float32, DTYPES[autocast]
    if weights is not None or device_type != "cuda":
        return weights or torch.float32, None
    if lora:
        return torch.bfloat16, None
    return torch.float32, (torch.bfloat16 if autocast == "auto" else None)


# ----------------------------------------------------------------------------- building
def build_builtin(size: str, seed: int = 0) -> tuple[Any, Any]:
    """A randomly initialised Qwen2 decoder of the named size and the byte tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if size not in BUILTINS:
        raise ConfigError(f"unknown built-in model 'builtin:{size}': use one of "
                          f"{['builtin:' + n for n in BUILTINS]}")
    tokenizer = byte_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=False,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2, **BUILTINS[size])
    with seeded(seed):
        model = Qwen2ForCausalLM(config)
    return model, tokenizer


def _looks_like_path(name: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else that is not a directory is a missing path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def model_problem(name: str) -> str | None:
    """What is wrong with a model name that can be told without loading it, or None: an unknown built-in, a
    path that is not a folder, a folder without config.json. (A hub id is only checked when loaded.)"""
    builtins = ["builtin:" + n for n in BUILTINS]
    if name.startswith("builtin:"):
        return None if name in builtins else f"model {name!r} is not a built-in model; the built-ins are {builtins}"
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            return (f"model folder {name!r} has no config.json; pass a folder holding config.json, the tokenizer "
                    "and the weights (what save_pretrained writes; a run's RUN_DIR/final)")
        return None
    if _looks_like_path(name) or os.path.exists(name):
        return f"model folder {name!r} does not exist (or is not a folder); pass a model folder, a hub id or one of {builtins}"
    return None


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached (offline mode, no TCP connection within ``timeout`` seconds,
    or, behind a proxy, no answer from the hub through it), or None.

    Without this check an unreachable hub costs ~25-50 s of retries before transformers gives up.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return _through_proxy(endpoint, timeout)
    url = urlparse(endpoint)
    try:
        with socket.create_connection((url.hostname or "", url.port or (443 if url.scheme == "https" else 80)),
                                      timeout=timeout):
            return None
    except OSError as err:
        return f"{endpoint} is not reachable from this machine ({err})"


def _through_proxy(endpoint: str, timeout: float) -> str | None:
    """Behind a proxy only a real request tells: one HEAD through it (the proxy's refusal, 403/407 or 5xx, counts
    as unreachable; any answer of the hub's own does not)."""
    import httpx

    try:
        answer = httpx.head(endpoint, timeout=timeout)
    except httpx.HTTPError as err:
        return f"{endpoint} is not reachable through the proxy ({type(err).__name__}: {err})"
    if answer.status_code in (403, 407) or answer.status_code >= 500:
        return f"{endpoint} answered {answer.status_code} through the proxy"
    return None


SESSION_FLAGS = ("local_files_only", "is_local")
"""What transformers records in a loaded tokenizer's init kwargs about this session (and would write into an
exported tokenizer_config.json, where vLLM or another machine would read it as the tokenizer's)."""


def _from_pretrained(name_or_path: str, dtype: torch.dtype, local_only: bool) -> tuple[Any, Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(name_or_path, local_files_only=local_only)  # the cheapest file first
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=local_only)
    for flag in SESSION_FLAGS:  # how this session loaded it, not the tokenizer's: never saved with an export
        tokenizer.init_kwargs.pop(flag, None)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, local_files_only=local_only)
    source = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(source, str):
        source = DTYPES.get(source)
    return model, tokenizer, source if isinstance(source, torch.dtype) else None


def _load_pretrained(name_or_path: str, dtype: torch.dtype) -> tuple[Any, Any, Any]:
    """A local directory, or a hub id: from the local cache when it is there, else downloaded."""
    builtins = ["builtin:" + n for n in BUILTINS]
    local = os.path.isdir(name_or_path)
    if not local and _looks_like_path(name_or_path):
        raise ConfigError(f"model directory {name_or_path!r} does not exist; pass a directory holding "
                          f"config.json, the tokenizer and the weights, a hub id, or one of {builtins}")
    advice = (f"Pass a directory holding config.json, the tokenizer and the weights, a hub id on a machine "
              f"that can reach the hub (or that has it in the Hugging Face cache), or one of {builtins}")
    try:
        return _from_pretrained(name_or_path, dtype, local_only=True)
    except (OSError, ValueError) as err:
        if local:
            raise ConfigError(f"could not load model {name_or_path!r} from the local directory: "
                              f"{str(err).strip().rstrip('.')}. {advice}") from err
    where = "the Hugging Face hub (no such local directory, so it was taken as a hub id)"
    if (why := hub_unreachable()) is not None:
        raise ConfigError(f"could not load model {name_or_path!r} from {where}: it is not in the local "
                          f"cache and {why}. {advice}")
    try:
        return _from_pretrained(name_or_path, dtype, local_only=False)
    except (OSError, ValueError) as err:
        raise ConfigError(f"could not load model {name_or_path!r} from {where}: "
                          f"{str(err).strip().rstrip('.')}. {advice}") from err


def adaptable_layer_types() -> tuple[type, ...]:
    """The layer types PEFT's LoRA can wrap (``peft.tuners.lora.layer.dispatch_default``)."""
    from transformers.pytorch_utils import Conv1D

    nn = torch.nn
    return (nn.Linear, Conv1D, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention)


def adaptable_layers(model: Any) -> dict[str, str]:
    """Every layer LoRA can adapt, by full module name -> its kind: ``attn``, ``mlp``, ``unembed`` (the
    output layer), ``embed`` (the input embeddings) or ``other``."""
    types = adaptable_layer_types()
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    kinds = {}
    for name, module in model.named_modules():
        if not name or not isinstance(module, types):
            continue
        parts = name.lower().split(".")
        if module is head:
            kinds[name] = "unembed"
        elif module is embedding:
            kinds[name] = "embed"
        elif any(mark in part for part in parts[:-1] for mark in ATTN_MARKS):
            kinds[name] = "attn"
        elif any(mark in part for part in parts[:-1] for mark in MLP_MARKS) and parts[-1] not in ROUTERS:
            kinds[name] = "mlp"
        else:
            kinds[name] = "other"
    return kinds


def _matches(name: str, target: str) -> bool:
    """PEFT's rule for a list of target_modules: the full name, or a suffix after a dot."""
    return name == target or name.endswith("." + target)


def _short_names(chosen: Sequence[str], every: Sequence[str]) -> list[str]:
    """The shortest suffixes (``q_proj``, ``attn.c_proj``) that select exactly ``chosen`` among ``every``."""
    chosen_set, names = set(chosen), []
    for name in chosen:
        parts = name.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            if all(m in chosen_set for m in every if _matches(m, suffix)):
                break
        if suffix not in names:
            names.append(suffix)
    return names


def lora_targets(model: Any, train_attn: bool, train_mlp: bool, train_unembed: bool,
                 target_modules: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """``(target_modules for PEFT, notes)``: the given names, or the attention / MLP / output layers found
    (any layer type PEFT adapts: ``Linear``, transformers' ``Conv1D`` of GPT-2, ...). Notes say what a
    user should know: layers asked for that were not found, or an adapter on the output layer only."""
    kinds = adaptable_layers(model)
    leaves = sorted({n.rsplit(".", 1)[-1] for n in kinds})
    if target_modules is not None:
        names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
        missing = [t for t in names if not any(_matches(n, t) for n in kinds)]
        if missing or not names:
            raise ConfigError(f"target_modules {missing or names} name no layer LoRA can adapt in this model; "
                              f"its adaptable layers end in {leaves} (a name or a dotted suffix such as "
                              "'attn.c_proj' selects every layer ending in it)")
        chosen = [n for n in kinds if any(_matches(n, t) for t in names)]
        return names, _head_only_note(chosen, kinds)
    wanted = {"attn": train_attn, "mlp": train_mlp, "unembed": train_unembed}
    chosen = [n for n, kind in kinds.items() if wanted.get(kind)]
    if not chosen:
        raise ConfigError(f"no LoRA target found (asked for {[k for k, on in wanted.items() if on]}); pass "
                          f"target_modules from this model's adaptable layers: {leaves}")
    notes = [f"train_{kind}=True but no {label} layer was recognised in this model (by a path containing "
             f"{marks}); name its layers with target_modules, from {leaves}"
             for kind, label, marks in (("attn", "attention", ATTN_MARKS), ("mlp", "MLP", MLP_MARKS))
             if wanted[kind] and kind not in kinds.values()]
    return _short_names(chosen, list(kinds)), notes + _head_only_note(chosen, kinds)


def _head_only_note(chosen: Sequence[str], kinds: dict[str, str]) -> list[str]:
    if not chosen or any(kinds[n] != "unembed" for n in chosen):
        return []
    return [f"LoRA adapts only the output layer {chosen[0]!r}: attention and MLP stay frozen, so training can "
            "change only the last projection. Name more layers with target_modules (adaptable here: "
            f"{sorted({n.rsplit('.', 1)[-1] for n in kinds})})"]


def adapted_modules(model: Any) -> dict[str, int]:
    """The layers carrying a LoRA adapter, as name patterns (layer numbers as ``*``) -> how many."""
    from peft.tuners.lora import LoraLayer

    counts: dict[str, int] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            pattern = ".".join("*" if p.isdigit() else p for p in name.removeprefix("base_model.model.").split("."))
            counts[pattern] = counts.get(pattern, 0) + 1
    return counts


def _check_load_arguments(name_or_path: Any, lora_rank: Any, lora_alpha: Any, lora_dropout: Any, seed: Any,
                          flags: dict[str, Any]) -> None:
    """Every bad ``load_model`` argument at once, as one ``ConfigError``."""
    problems = []
    if not isinstance(name_or_path, str) or not name_or_path:
        problems.append(f"name_or_path={name_or_path!r} must be a string: 'builtin:tiny', a local directory "
                        "or a hub id")
    if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank < 0:
        problems.append(f"lora_rank={lora_rank!r} must be an integer: 0 for full fine-tuning or a rank >= 1")
    if lora_alpha is not None and (isinstance(lora_alpha, bool) or not isinstance(lora_alpha, (int, float))
                                   or not 0 < lora_alpha < float("inf")):
        problems.append(f"lora_alpha={lora_alpha!r} must be a finite number > 0, or None for the rank (scale 1)")
    if isinstance(lora_dropout, bool) or not isinstance(lora_dropout, (int, float)) or not 0 <= lora_dropout < 1:
        problems.append(f"lora_dropout={lora_dropout!r} must be a number in [0, 1)")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        problems.append(f"seed={seed!r} must be an integer >= 0")
    problems += [f"{name}={value!r} must be True or False" for name, value in flags.items()
                 if not isinstance(value, bool)]
    if problems:
        raise ConfigError("; ".join(problems))


def load_model(name_or_path: str, *, lora_rank: int = 0, lora_alpha: float | None = None,
               lora_dropout: float = 0.0, target_modules: Sequence[str] | None = None,
               train_attn: bool = True, train_mlp: bool = True, train_unembed: bool = True,
               dtype: str | torch.dtype | None = None, device: str | torch.device | None = None,
               autocast: str = "auto", seed: int = 0) -> LoadedModel:
    """Load a model for training.

    ``name_or_path``: ``"builtin:tiny" | "builtin:mini" | "builtin:small"``, a local Hugging Face
    directory, or a hub id. ``lora_rank > 0`` wraps the model with PEFT LoRA (``lora_alpha``
    defaults to the rank, i.e. scale 1; the attention, MLP and unembedding projections train
    unless switched off or ``target_modules`` names others); ``lora_rank = 0`` trains every
    weight. ``seed`` initialises the built-ins and the LoRA matrices. ``dtype``, ``device`` and
    ``autocast`` ("auto", "off", "bfloat16", "float16"): see :func:`resolve_precision`; CPU and
    float32 by default.
    """
    _check_load_arguments(name_or_path, lora_rank, lora_alpha, lora_dropout, seed,
                          {"train_attn": train_attn, "train_mlp": train_mlp, "train_unembed": train_unembed})
    dev = resolve_device(device)
    dt, compute = resolve_precision(dev.type, dtype, autocast, lora=lora_rank > 0)
    args = dict(name_or_path=name_or_path, lora_rank=lora_rank, lora_alpha=lora_alpha,
                lora_dropout=lora_dropout, target_modules=list(target_modules) if target_modules else None,
                train_attn=train_attn, train_mlp=train_mlp, train_unembed=train_unembed,
                dtype=str(dt).removeprefix("torch."),
                autocast=None if compute is None else str(compute).removeprefix("torch."), seed=seed)
    source = None
    if name_or_path.startswith("builtin:"):
        model, tokenizer = build_builtin(name_or_path.removeprefix("builtin:"), seed)
        model.config.name_or_path = name_or_path
    else:
        model, tokenizer, source = _load_pretrained(name_or_path, dt)
    model.to(device=dev, dtype=dt)
    lora = None
    notes: list[str] = [note] if (note := vocabulary_note(model, tokenizer, name_or_path)) else []
    if notes:
        warnings.warn(notes[0], stacklevel=2)
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        targets, lora_notes = lora_targets(model, train_attn, train_mlp, train_unembed, target_modules)
        for note in lora_notes:
            warnings.warn(note, stacklevel=2)
        notes += lora_notes
        lora = dict(r=lora_rank, lora_alpha=lora_alpha if lora_alpha is not None else lora_rank,
                    lora_dropout=lora_dropout, target_modules=targets)
        with seeded(seed + 1), warnings.catch_warnings():
            # PEFT calls a transformers method that transformers 5 deprecated; nothing for a user to do
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            # PEFT sets fan_in_fan_out per layer type itself (True for Conv1D, False for Linear) and says so
            warnings.filterwarnings("ignore", message="fan_in_fan_out is set to")
            # an adapter on a tied output layer: export(merged=True) unties it before merging (state.py)
            warnings.filterwarnings("ignore", message="Model has `tie_word_embeddings=True` and a tied layer")
            model = get_peft_model(model, LoraConfig(**lora))
        if model.peft_config["default"].base_model_name_or_path is None:  # built-ins: say which base
            model.peft_config["default"].base_model_name_or_path = name_or_path
        model.to(device=dev)
    model.train()
    return LoadedModel(model, tokenizer, name_or_path, dev, dt, lora, args, compute, notes, source)


def vocabulary_note(model: Any, tokenizer: Any, name: str) -> str | None:
    """A sentence when the tokenizer has special tokens the model has no row for (one vocabulary, or None)."""
    rows = int(model.get_input_embeddings().weight.shape[0])
    outside = sorted({(t, i) for t, i in zip(tokenizer.all_special_tokens, tokenizer.all_special_ids) if i >= rows})
    if not outside:
        return None
    return (f"model {name!r}: its tokenizer has special token(s) {[t for t, _ in outside]} with ids "
            f"{[i for _, i in outside]}, past the model's {rows} embedding rows, so a text holding one cannot be "
            "read (an index error). Fix: remove them from the tokenizer files (a built-in exported before whileai "
            "pinned unk_token to null: set \"unk_token\": null in its tokenizer_config.json)")


def parameter_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def builtin_table() -> str:
    """The built-in models and their parameter counts (``python -m whileai.engine`` prints it)."""
    lines = []
    for size in BUILTINS:
        m, _ = build_builtin(size)
        lines.append(f"builtin:{size:6s} {parameter_count(m):>12,d} parameters")
    return "\n".join(lines)
