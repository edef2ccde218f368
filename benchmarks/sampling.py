"""The engine's sampler against ``transformers``' ``generate``: tokens per second, side by side.

    python benchmarks/sampling.py                       # the default cases below, 5 repeats each
    python benchmarks/sampling.py --case small:8x8x32:16 --repeats 7 --json

A case is ``MODEL:PROMPTSxSAMPLESxTOKENS:PROMPT_LENGTH`` (``builtin:`` is implied): e.g.
``small:8x8x32:16`` is builtin:small (~25M parameters), 8 prompts of 16 random tokens, 8 samples each,
32 new tokens per sample. Both sides get the same model (float32, eval mode), the same prompts and
the same lengths, at temperature 1 with no top-k / top-p, and no end-of-sequence token, so every
sample is exactly TOKENS long:

- **whileai**: ``whileai.engine.generation.sample(model, prompts, SAMPLES, SamplingParams(...))``, which
  also returns each token's log-probability (``generate`` returns tokens only);
- **generate**: ``model.generate(input_ids, do_sample=True, num_return_sequences=SAMPLES,
  max_new_tokens=TOKENS, top_k=0, top_p=1.0, temperature=1.0)``.

Each round measures the float32 matmul peak (``train_step.matmul_peak``) and then times one call of
each side, alternating which goes first; after one warm-up call of each, the medians over rounds and
the ratio of medians are reported, by wall time and by the process's CPU time (``time.process_time``:
on a machine shared with other jobs, time spent waiting for a core is not counted; with ``--threads 1``
it is the work done), plus the compute floor: the sampled tokens' FLOPs (2 * N per token,
N = parameters in matrix multiplies, prompts not counted) at the median peak, as a share of each
side's median time (1.0 would be the matmul peak).
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
from train_step import matmul_parameters, matmul_peak  # noqa: E402

DEFAULT_CASES = ["mini:8x8x32:16", "small:8x8x32:16", "small:8x8x32:64", "small:8x8x128:64"]


def parse_case(text: str) -> dict[str, Any]:
    try:
        model, shape, prompt_length = text.split(":")
        prompts, samples, tokens = (int(x) for x in shape.split("x"))
        return {"model": f"builtin:{model}", "prompts": prompts, "samples": samples, "tokens": tokens,
                "prompt_length": int(prompt_length), "name": text}
    except ValueError:
        raise SystemExit(f"--case {text!r} is not MODEL:PROMPTSxSAMPLESxTOKENS:PROMPT_LENGTH, e.g. small:8x8x32:16") from None


def whileai_side(model: Any, prompts: list[list[int]], case: dict[str, Any], seed: int) -> int:
    from whileai.engine.generation import sample
    from whileai.engine.sampling import SamplingParams

    result = sample(model, prompts, case["samples"], SamplingParams(max_tokens=case["tokens"], seed=seed))
    return sum(len(s.tokens) for per_prompt in result for s in per_prompt)


def generate_side(model: Any, prompts: list[list[int]], case: dict[str, Any], seed: int) -> int:
    torch.manual_seed(seed)
    input_ids = torch.tensor(prompts)
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                             num_return_sequences=case["samples"], max_new_tokens=case["tokens"], top_k=0,
                             top_p=1.0, temperature=1.0, eos_token_id=None, pad_token_id=0)
    return int(out[:, input_ids.shape[1]:].numel())


def run_case(case: dict[str, Any], repeats: int, matmul_seconds: float) -> dict[str, Any]:
    from whileai.engine import load_model

    model = load_model(case["model"], dtype="float32", autocast="off", device="cpu").model.eval()
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 259, (case["prompts"], case["prompt_length"]), generator=generator).tolist()
    sides = {"whileai": whileai_side, "generate": generate_side}
    times: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    tokens: dict[str, int] = {name: fn(model, prompts, case, 0) for name, fn in sides.items()}  # warm-up
    peaks = []
    for round_index in range(repeats):
        peaks.append(matmul_peak(1024, matmul_seconds))
        order = list(sides) if round_index % 2 == 0 else list(sides)[::-1]
        for name in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            tokens[name] = sides[name](model, prompts, case, round_index + 1)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    n_matmul = matmul_parameters(model)
    peak = statistics.median(peaks)
    out: dict[str, Any] = {**case, "matmul_parameters": n_matmul, "peak_flops_median": peak, "peaks": peaks}
    for name in sides:
        median = statistics.median(times[name])
        out[name] = {"seconds": times[name], "median_s": median, "tokens": tokens[name],
                     "tokens_per_s": tokens[name] / median, "cpu_seconds": cpu[name],
                     "median_cpu_s": statistics.median(cpu[name]),
                     "floor_share": 2 * n_matmul * tokens[name] / peak / median}
    out["speedup"] = out["generate"]["median_s"] / out["whileai"]["median_s"]
    out["cpu_speedup"] = out["generate"]["median_cpu_s"] / out["whileai"]["median_cpu_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", action="append", help=f"a case to run (repeatable; default {DEFAULT_CASES})")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per case (default 5)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default 0: torch's default)")
    parser.add_argument("--matmul-seconds", type=float, default=0.5, help="seconds per peak measurement")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for text in args.case or DEFAULT_CASES:
        result = run_case(parse_case(text), args.repeats, args.matmul_seconds)
        results.append(result)
        if not args.json:
            print_case(result)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


def print_case(r: dict[str, Any]) -> None:
    print(f"\n{r['name']}: {r['model']} ({r['matmul_parameters']:,} matmul parameters), {r['prompts']} prompts "
          f"x {r['samples']} samples x {r['tokens']} tokens, prompts of {r['prompt_length']} tokens; "
          f"matmul peak median {r['peak_flops_median'] / 1e9:.1f} GFLOP/s")
    for name in ("whileai", "generate"):
        side = r[name]
        print(f"  {name:8s} median {side['median_s']:.3f} s  {side['tokens_per_s']:8.0f} tokens/s  "
              f"floor share {side['floor_share']:.3f}  (rounds: {', '.join(f'{s:.3f}' for s in side['seconds'])}; "
              f"CPU seconds median {side['median_cpu_s']:.3f})")
    print(f"  whileai / generate tokens/s: {r['speedup']:.2f}x by wall time, {r['cpu_speedup']:.2f}x by CPU time "
          f"(goal >= 1.3x: {'met' if r['speedup'] >= 1.3 else 'NOT met'} by wall time)", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
