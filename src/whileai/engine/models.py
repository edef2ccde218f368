"""Load a causal language model: a built-in, a local Hugging Face directory, or a hub id.

Built-ins (``builtin:tiny``, ``builtin:mini``, ``builtin:small``) are real Qwen2 decoders built
from a config and randomly initialised from a seed, with a byte-level tokenizer constructed in
code (256 byte tokens + 3 specials), so nothing is downloaded and the same seed gives the same
weights on every machine. LoRA goes through PEFT; without ``lora_rank`` every weight trains.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

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

ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)


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
    """A byte-level tokenizer: ids 0-2 are pad/bos/eos, id ``3 + b`` is byte ``b``. Deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for b, ch in _bytes_to_unicode().items():
        vocab[ch] = len(SPECIAL_TOKENS) + b
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=SPECIAL_TOKENS[0],
                                   bos_token=SPECIAL_TOKENS[1], eos_token=SPECIAL_TOKENS[2])


# ----------------------------------------------------------------------------- devices
def resolve_device_dtype(device: str | torch.device | None,
                         dtype: str | torch.dtype | None) -> tuple[torch.device, torch.dtype]:
    """CPU + float32 by default; CUDA + bfloat16 when a GPU is present and nothing is asked."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {str(dev)!r} was asked for but torch sees no CUDA GPU "
                          f"(torch {torch.__version__}); use device='cpu' or install a CUDA build of torch")
    if dtype is None:
        return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    if isinstance(dtype, str):
        named = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                 "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
                 "float64": torch.float64}
        if dtype not in named:
            raise ConfigError(f"dtype {dtype!r} is not known: use one of {sorted(named)}")
        return dev, named[dtype]
    return dev, dtype


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
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model, tokenizer


def _looks_like_path(name: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else that is not a directory is a missing path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def _load_pretrained(name_or_path: str, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    builtins = ["builtin:" + n for n in BUILTINS]
    local = os.path.isdir(name_or_path)
    if not local and _looks_like_path(name_or_path):
        raise ConfigError(f"model directory {name_or_path!r} does not exist; pass a directory holding "
                          f"config.json, the tokenizer and the weights, a hub id, or one of {builtins}")
    try:
        AutoConfig.from_pretrained(name_or_path)  # the cheapest file first: fail before the weights
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
    except (OSError, ValueError) as err:
        where = ("the local directory" if local else
                 "the Hugging Face hub (no such local directory, so it was taken as a hub id)")
        raise ConfigError(
            f"could not load model {name_or_path!r} from {where}: {str(err).strip().rstrip('.')}. Pass a "
            f"directory holding config.json, the tokenizer and the weights, a hub id on a machine that can "
            f"reach the hub, or one of {builtins}") from err
    return model, tokenizer


def lora_targets(model: Any, train_attn: bool, train_mlp: bool, train_unembed: bool,
                 target_modules: Sequence[str] | None) -> list[str]:
    """Module names LoRA wraps: the given list, or the attention/MLP/unembedding projections present."""
    present = {name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}
    if target_modules is not None:
        missing = sorted(set(target_modules) - present)
        if missing:
            raise ConfigError(f"target_modules {missing} are not linear layers of this model; "
                              f"its linear layers are {sorted(present)}")
        return list(target_modules)
    wanted = ((ATTN_MODULES if train_attn else ()) + (MLP_MODULES if train_mlp else ())
              + (UNEMBED_MODULES if train_unembed else ()))
    targets = [n for n in wanted if n in present]
    if not targets:
        raise ConfigError(f"no LoRA target found (asked for {list(wanted)}); pass target_modules "
                          f"from this model's linear layers: {sorted(present)}")
    return targets


def load_model(name_or_path: str, *, lora_rank: int = 0, lora_alpha: float | None = None,
               lora_dropout: float = 0.0, target_modules: Sequence[str] | None = None,
               train_attn: bool = True, train_mlp: bool = True, train_unembed: bool = True,
               dtype: str | torch.dtype | None = None, device: str | torch.device | None = None,
               seed: int = 0) -> LoadedModel:
    """Load a model for training.

    ``name_or_path``: ``"builtin:tiny" | "builtin:mini" | "builtin:small"``, a local Hugging Face
    directory, or a hub id. ``lora_rank > 0`` wraps the model with PEFT LoRA (``lora_alpha``
    defaults to the rank, i.e. scale 1; the attention, MLP and unembedding projections train
    unless switched off or ``target_modules`` names others); ``lora_rank = 0`` trains every
    weight. ``seed`` initialises the built-ins and the LoRA matrices.
    """
    if lora_rank < 0:
        raise ConfigError(f"lora_rank={lora_rank} is negative: use 0 for full fine-tuning or a rank >= 1")
    dev, dt = resolve_device_dtype(device, dtype)
    args = dict(name_or_path=name_or_path, lora_rank=lora_rank, lora_alpha=lora_alpha,
                lora_dropout=lora_dropout, target_modules=list(target_modules) if target_modules else None,
                train_attn=train_attn, train_mlp=train_mlp, train_unembed=train_unembed,
                dtype=str(dt).removeprefix("torch."), seed=seed)
    if name_or_path.startswith("builtin:"):
        model, tokenizer = build_builtin(name_or_path.removeprefix("builtin:"), seed)
        model.config.name_or_path = name_or_path
    else:
        model, tokenizer = _load_pretrained(name_or_path, dt)
    model.to(device=dev, dtype=dt)
    lora = None
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        targets = lora_targets(model, train_attn, train_mlp, train_unembed, target_modules)
        lora = dict(r=lora_rank, lora_alpha=lora_alpha if lora_alpha is not None else lora_rank,
                    lora_dropout=lora_dropout, target_modules=targets)
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # PEFT calls a transformers method that transformers 5 deprecated; nothing for a user to do
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            torch.manual_seed(seed + 1)
            model = get_peft_model(model, LoraConfig(**lora))
        if model.peft_config["default"].base_model_name_or_path is None:  # built-ins: say which base
            model.peft_config["default"].base_model_name_or_path = name_or_path
        model.to(device=dev)
    model.train()
    return LoadedModel(model, tokenizer, name_or_path, dev, dt, lora, args)


def parameter_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":  # pragma: no cover - a table for the docs
    for size in BUILTINS:
        m, _ = build_builtin(size)
        print(f"builtin:{size:6s} {parameter_count(m):>12,d} parameters")
