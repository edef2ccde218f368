"""Training throughput of the engine as a fraction of the machine's matrix-multiply peak.

    python benchmarks/train_step.py            # builtin:small (~25M parameters), 4 x 512 tokens a step
    python benchmarks/train_step.py --json
    python benchmarks/train_step.py --device cuda --precision bf16

One step = ``TrainingEngine.forward_backward(data, "cross_entropy")`` + ``optim_step(AdamParams())``
with full fine-tuning, float32 (``--precision bf16``: float32 weights under bfloat16 autocast). Achieved FLOP/s uses the usual 6 * N * tokens rule (2 N for the
forward, 4 N for the backward), with N the parameters that take part in matrix multiplies (the
input embedding is a lookup and is left out); attention-score FLOPs are ignored, which understates
the work done. The peak is ``torch.matmul`` of two square matrices in the compute dtype (default 2048) on the
same cores and thread count, measured in the same run: the script alternates a peak measurement and
one timed step, several rounds, and reports the fastest step against the highest peak (on a shared
machine both are then the least disturbed), plus the median over rounds of each step against the
peak measured just before it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peak_memory  # noqa: E402


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


PRECISIONS = {"float32": ("float32", "off", torch.float32), "bf16": ("float32", "bfloat16", torch.bfloat16)}
"""--precision -> (the engine's weight dtype, its autocast, the peak matmul's dtype): bf16 is what the engine does
on CUDA by default for full fine-tuning (float32 weights, bfloat16 autocast), against a bfloat16 matmul peak"""


def matmul_peak(size: int, seconds: float, device: str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of repeated ``a @ b`` on (size, size) matrices of ``dtype`` for about ``seconds``."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm up
    _sync(device)
    flops_each = 2 * size**3
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.matmul(a, b)
        count += 1
        if count % 16 == 0:
            _sync(device)
    _sync(device)
    return flops_each * count / (time.perf_counter() - start)


def matmul_parameters(model: torch.nn.Module) -> int:
    """Parameters used in matrix multiplies: all of them except the input embedding (unless tied)."""
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    return total if embedding is output else total - embedding.numel()


def make_data(batch: int, length: int, vocab: int, seed: int = 0) -> list[dict]:
    from whileai.engine import make_datum

    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, vocab, (batch, length + 1), generator=generator).tolist()
    return [make_datum(row[:1], row[1:]) for row in tokens]


def run(args: argparse.Namespace) -> dict:
    """Alternate a matmul-peak measurement and one timed training step, ``args.rounds`` times."""
    from whileai.engine import AdamParams, TrainingEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    weights, autocast, peak_dtype = PRECISIONS[args.precision]
    engine = TrainingEngine(args.model, micro_batch_tokens=args.batch * args.length, dtype=weights,
                            autocast=autocast, device=args.device)
    data = make_data(args.batch, args.length, engine.vocab_size)
    adam = AdamParams(learning_rate=1e-4)
    engine.forward_backward(data, "cross_entropy")  # warm up (allocator, kernels)
    engine.optim_step(adam)
    peaks, step_seconds = [], []
    for _ in range(args.rounds):
        peaks.append(matmul_peak(args.matmul_size, args.matmul_seconds, args.device, peak_dtype))
        start = time.perf_counter()
        engine.forward_backward(data, "cross_entropy")
        engine.optim_step(adam)
        _sync(args.device)
        step_seconds.append(time.perf_counter() - start)
    tokens = args.batch * args.length
    n_matmul = matmul_parameters(engine.model)
    flops_per_step = 6 * n_matmul * tokens
    achieved = flops_per_step / min(step_seconds)  # best step against best peak: both least disturbed
    adjacent = sorted(flops_per_step / s / p for s, p in zip(step_seconds, peaks))
    return {
        "model": args.model, "device": args.device, "precision": args.precision, "parameters": sum(p.numel() for p in engine.model.parameters()),
        "matmul_parameters": n_matmul, "tokens_per_step": tokens, "step_seconds": step_seconds,
        "tokens_per_second": tokens / min(step_seconds), "achieved_flops": achieved,
        "matmul_peak_flops": peaks, "fraction_of_peak": achieved / max(peaks),
        "median_adjacent_fraction": adjacent[len(adjacent) // 2],
        "torch_threads": torch.get_num_threads(), "load_average_1min": os.getloadavg()[0],
        "peak_memory_gb": peak_memory.peak_gb(args.device), "peak_memory_kind": peak_memory.kind(args.device),
        "activation_checkpointing": engine.activation_checkpointing,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin:small", help="model to train (default builtin:small, ~25M)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    parser.add_argument("--length", type=int, default=512, help="tokens per sequence (default 512)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of (matmul peak, one timed step) after one warm-up step (default 5)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to run (default cpu)")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="float32",
                        help="float32 (default): float32 weights and compute; bf16: float32 weights under bfloat16 "
                        "autocast (the engine's CUDA default), against a bfloat16 matmul peak")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default 0: torch's default)")
    parser.add_argument("--matmul-size", type=int, default=2048, help="side of the peak matmul (default 2048)")
    parser.add_argument("--matmul-seconds", type=float, default=1.5,
                        help="seconds per peak measurement (default 1.5)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['model']}: {result['parameters']:,} parameters ({result['matmul_parameters']:,} in matmuls), "
          f"{result['tokens_per_step']:,} tokens a step, {result['torch_threads']} threads, {result['precision']} on {result['device']}, full fine-tune, "
          f"load average {result['load_average_1min']:.1f} on {os.cpu_count()} cores")
    print("step seconds: " + ", ".join(f"{s:.2f}" for s in result["step_seconds"]))
    print(f"tokens/s: {result['tokens_per_second']:,.0f} (fastest step)")
    print(f"achieved: {result['achieved_flops'] / 1e9:.1f} GFLOP/s (6 * N * tokens, fastest step); matmul peak "
          "per round: " + ", ".join(f"{p / 1e9:.1f}" for p in result["matmul_peak_flops"]) + " GFLOP/s")
    print(f"fraction of matmul peak: {result['fraction_of_peak']:.3f} (fastest step / highest peak); "
          f"median over rounds of step / the peak measured just before it: {result['median_adjacent_fraction']:.3f}"
          f"  (goal >= 0.30: {'met' if result['fraction_of_peak'] >= 0.3 else 'NOT met'})")
    print(f"{result['peak_memory_kind']}: {result['peak_memory_gb']:.2f} GB (activation checkpointing "
          f"{'on' if result['activation_checkpointing'] else 'off'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
