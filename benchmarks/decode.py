"""The sampler's time per decode step against ``transformers``' ``generate``, side by side in one process.

    python benchmarks/decode.py                                   # CPU: a 24-layer narrow Qwen2, batch 1
    python benchmarks/decode.py --device cuda --shape 0.5b --batches 1,64,512 --graph --dtype bfloat16

Three sides decode the same prompts with the same model (eval mode, no EOS, so every row runs the full
length), alternating order round by round; medians over rounds, ratios of medians:

- **whileai**: ``whileai.engine.generation.sample`` with the fast decode step (``whileai.engine.decode``;
  ``--graph``: one CUDA-graph replay per token; ``--static``: the graph's fixed-shape step, not recorded), which
  also returns each token's log-probability;
- **whileai, model forward**: the same sampler calling ``model(...)`` every step (the sampler before the fast
  step: ``decode_step`` switched off), to show what the step itself gained;
- **generate**: ``model.generate(do_sample=True, top_k=0, top_p=1.0, max_new_tokens=T)`` at batch B.

Time per decode step = a call's wall time / T (and its process CPU time / T: on a shared machine, time spent
waiting for a core is not counted; with one thread it is the work done) (the one prefill forward is included on every side; with
T = 128 it is under 1% of a call). ``--shape narrow`` (default): 24 layers of width 64 (4 heads, 2 key/value
heads, MLP 128, the byte vocabulary of 259): a model whose arithmetic per token is tiny, so the time is the
per-token overhead, as on a GPU. ``0.5b``: Qwen2.5-0.5B's shape (24 layers, width 896, vocabulary 151,936).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peak_memory  # noqa: E402
from shaped_model import SHAPES, build  # noqa: E402


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def sides(graph: bool, samples: int, static: bool = False) -> dict[str, Any]:
    from whileai.engine import generation
    from whileai.engine.generation import sample
    from whileai.engine.sampling import SamplingParams

    def ours(model: Any, prompts: list[list[int]], tokens: int, seed: int) -> None:
        sample(model, prompts, samples, SamplingParams(max_tokens=tokens, seed=seed), cuda_graph=graph,
               static_cache=static)

    def forward(model: Any, prompts: list[list[int]], tokens: int, seed: int) -> None:
        original = generation.decode_step
        generation.decode_step = lambda model: None
        try:
            sample(model, prompts, samples, SamplingParams(max_tokens=tokens, seed=seed))
        finally:
            generation.decode_step = original

    def generate(model: Any, prompts: list[list[int]], tokens: int, seed: int) -> None:
        torch.manual_seed(seed)
        ids = torch.tensor(prompts, device=model.device)
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=tokens,
                           num_return_sequences=samples,
                           min_new_tokens=tokens, top_k=0, top_p=1.0, temperature=1.0, eos_token_id=None,
                           pad_token_id=0)

    return {"whileai": ours, "whileai_model_forward": forward, "generate": generate}


def run_case(model: Any, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(batch)
    vocab = model.config.vocab_size
    prompts = torch.randint(3, vocab, (batch, args.prompt_length), generator=generator).tolist()
    functions = sides(args.graph, args.samples, args.static)
    times: dict[str, list[float]] = {name: [] for name in functions}
    cpu: dict[str, list[float]] = {name: [] for name in functions}
    peaks: dict[str, float] = {name: 0.0 for name in functions}
    for fn in functions.values():  # warm-up
        fn(model, prompts, args.tokens, 0)
    for round_index in range(args.repeats):
        order = list(functions) if round_index % 2 == 0 else list(functions)[::-1]
        for name in order:
            peak_memory.reset(args.device)
            start, start_cpu = time.perf_counter(), time.process_time()
            functions[name](model, prompts, args.tokens, round_index + 1)
            _sync(args.device)
            times[name].append((time.perf_counter() - start) / args.tokens)
            peaks[name] = max(peaks[name], peak_memory.peak_gb(args.device))
            cpu[name].append((time.process_time() - start_cpu) / args.tokens)
    out: dict[str, Any] = {"batch": batch, "samples": args.samples, "tokens": args.tokens,
                           "prompt_length": args.prompt_length}
    for name, values in times.items():
        out[name] = {"ms_per_step": [1e3 * v for v in values], "median_ms": 1e3 * statistics.median(values),
                     "tokens_per_s": batch * args.samples / statistics.median(values),
                     "median_cpu_ms": 1e3 * statistics.median(cpu[name]),
                     "peak_memory_gb": peaks[name] if args.device.startswith("cuda") else None}
    base, base_cpu = out["generate"]["median_ms"], out["generate"]["median_cpu_ms"]
    out["ratio_to_generate"] = {name: out[name]["median_ms"] / base for name in functions}
    out["cpu_ratio_to_generate"] = {name: out[name]["median_cpu_ms"] / base_cpu for name in functions}
    out["peak_memory"] = peak_memory.describe(args.device, max(peaks.values()))
    return out


def report(r: dict[str, Any], args: argparse.Namespace) -> str:
    """One line per case: ms per decode step per side, the ratios, the goal that applies to the case (the CPU's at
    batch 1, the GPU's at 64 x 8 rows on CUDA), tokens/s, CPU time and peak memory."""
    sides_ = list(r["ratio_to_generate"])
    ratio = r["ratio_to_generate"]["whileai"]
    speedup = r["generate"]["median_ms"] / r["whileai"]["median_ms"]  # tokens/s whileai / generate
    cuda = args.device.startswith("cuda")
    if cuda and r["batch"] * r["samples"] >= 512:
        goal = f" (GPU goal >= 4x at 64 x 8 x 128: {'met' if speedup >= 4 else 'NOT met'})"
    elif not cuda and r["batch"] * r["samples"] == 1:
        goal = f" (CPU goal: whileai <= 0.5x generate's time per step: {'met' if ratio <= 0.5 else 'NOT met'})"
    else:
        goal = ""
    memory = (", ".join(f"peak GPU memory {k} {r[k]['peak_memory_gb']:.2f} GB" for k in sides_) if cuda
              else r["peak_memory"])
    return (f"{r['batch']} prompts x {r['samples']} samples x {r['tokens']} tokens, prompts of {r['prompt_length']}: "
            f"ms per decode step (median of {args.repeats}): "
            + ", ".join(f"{k} {r[k]['median_ms']:.2f}" for k in sides_)
            + f"; whileai / generate {ratio:.2f}x, model-forward sampler / generate "
            f"{r['ratio_to_generate']['whileai_model_forward']:.2f}x; tokens/s whileai {r['whileai']['tokens_per_s']:.0f}, "
            f"generate {r['generate']['tokens_per_s']:.0f} ({speedup:.2f}x){goal}; by process CPU time: "
            + ", ".join(f"{k} {r[k]['median_cpu_ms']:.2f} ms ({r['cpu_ratio_to_generate'][k]:.2f}x)" for k in sides_)
            + f"; {memory}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="narrow")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batches", default="1", help="comma-separated numbers of prompts (default 1)")
    parser.add_argument("--samples", type=int, default=1, help="samples per prompt (default 1): rows = prompts x samples")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per row (default 128)")
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (default 1)")
    parser.add_argument("--graph", action="store_true", help="whileai decodes as a CUDA graph (CUDA only)")
    parser.add_argument("--static", action="store_true", help="whileai decodes with fixed shapes, as the CUDA graph "
                        "does, without recording one (any device: the graph's path, tried on a CPU)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = build(args.shape, args.device, getattr(torch, args.dtype))
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else f"{os.cpu_count()}-core CPU"
    print(f"{name}, torch {torch.__version__}, {torch.get_num_threads()} threads, shape {args.shape} "
          f"({sum(p.numel() for p in model.parameters()):,} parameters, {args.dtype}), load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for batch in (int(b) for b in args.batches.split(",")):
        r = run_case(model, batch, args)
        results.append(r)
        print(report(r, args), flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
