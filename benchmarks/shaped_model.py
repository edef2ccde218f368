"""A random-init Qwen2 model folder of a published shape, for benchmarks on a machine with no model hub.

    python benchmarks/shaped_model.py --shape 0.5b --out /tmp/qwen-0.5b --device cuda --dtype bfloat16

Shapes (the published configs' sizes; random weights): ``narrow`` (24 layers of width 64, the byte
vocabulary: per-token overhead), ``0.5b`` (Qwen2.5-0.5B: 0.49B parameters with the tied 151,936-row
embedding), ``1.5b`` (Qwen2.5-1.5B, 1.54B), ``7b`` (Qwen2.5-7B, 7.6B). The folder holds the weights (in
``--dtype``) and whileai's byte tokenizer (ids below 259: prompts of any vocabulary size work). Built on
``--device`` (a GPU initialises 7B in seconds where a CPU takes minutes).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

SHAPES: dict[str, dict[str, Any]] = {
    "narrow": dict(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=24, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=1024),
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=False),
}


def build(shape: str, device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0) -> Any:
    """The model of ``shape``, random weights (seeded), in eval mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**SHAPES[shape], pad_token_id=0, bos_token_id=1, eos_token_id=2, torch_dtype=dtype)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    return model.eval()


def save(shape: str, out: str, device: str, dtype: torch.dtype) -> str:
    from whileai.engine.models import byte_tokenizer

    model = build(shape, device, dtype)
    model.save_pretrained(out)
    byte_tokenizer().save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    start = time.perf_counter()
    save(args.shape, args.out, args.device, getattr(torch, args.dtype))
    print(f"{args.shape}: {args.out} written in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
