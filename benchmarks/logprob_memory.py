"""Peak memory of per-token log-probabilities: whileai's chunked scorer against the naive one.

    python benchmarks/logprob_memory.py              # vocab 151,936, 2,048 positions, hidden 896
    python benchmarks/logprob_memory.py --json

Both start from the same decoder hidden states (T, H) and the same output layer (V, H) (a Qwen2
head sized like Qwen2.5-0.5B: V = 151,936, H = 896) and return log pi(target) at every position:

- naive:   ``log_softmax(head(hidden).float()).gather(-1, targets)``, the whole (T, V) logits at once;
- whileai: ``whileai.engine.logprobs.token_logprobs`` (the engine's scorer: chunks of positions,
  each reduced to ``logit[target] - logsumexp`` before the next, recomputed in the backward pass).

Each is measured twice, forward only (scoring, e.g. reference or sampler logprobs) and forward +
backward (training, gradient into the hidden states), each in a fresh subprocess so one cannot
inherit the other's allocator state. On CPU the peak is the kernel's high-water mark of resident
memory (VmHWM, reset through /proc/self/clear_refs just before the measured call) minus the
resident memory at that moment; on CUDA it is torch.cuda.max_memory_allocated minus the memory
allocated before. The goal (issue 4) is a whileai peak of at most half the naive peak.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

METHODS = ("naive", "whileai")
WARM_UP = 64  # positions scored once, untimed and unmeasured, before the measured call
MODES = ("forward", "forward+backward")


def _resident_kib() -> tuple[int, int]:
    """(current resident KiB, high-water mark KiB) of this process, from /proc/self/status."""
    status = open("/proc/self/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return rss, hwm


def _build(vocab: int, hidden: int, positions: int, device: str):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=14 if hidden % 14 == 0 else 8, num_key_value_heads=2,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).to(device).eval()
    model.requires_grad_(False)
    hidden_TH = torch.randn(positions, hidden, device=device)
    targets_T = torch.randint(0, vocab, (positions,), device=device)
    return model, hidden_TH, targets_T


def _score(method: str, model, hidden_TH, targets_T):
    import torch

    if method == "naive":
        logits_TV = model.get_output_embeddings()(hidden_TH).float()
        return torch.log_softmax(logits_TV, dim=-1).gather(-1, targets_T.unsqueeze(-1)).squeeze(-1)
    from whileai.engine.logprobs import token_logprobs

    return token_logprobs(model, hidden_TH, targets_T)


def worker(method: str, mode: str, vocab: int, hidden: int, positions: int, device: str, out_path: str) -> None:
    """Measure one (method, mode) in this process and write the result as JSON to ``out_path``."""
    import torch

    model, hidden_TH, targets_T = _build(vocab, hidden, positions, device)
    backward = mode == "forward+backward"
    hidden_TH.requires_grad_(backward)
    with torch.set_grad_enabled(backward):  # warm up: lazy initialisation is not the method's memory
        warm = _score(method, model, hidden_TH[:WARM_UP], targets_T[:WARM_UP])
        if backward:
            warm.sum().backward()
    del warm
    hidden_TH.grad = None
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current resident size
        base = _resident_kib()[0] * 1024
    start = time.perf_counter()
    with torch.set_grad_enabled(backward):
        logprobs_T = _score(method, model, hidden_TH, targets_T)
        if backward:
            logprobs_T.sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = _resident_kib()[1] * 1024 - base
    seconds = time.perf_counter() - start
    grad = hidden_TH.grad.double().sum().item() if backward else 0.0
    with open(out_path, "w") as f:
        json.dump({"peak_bytes": peak, "seconds": seconds, "logprobs": logprobs_T.detach().cpu().tolist(),
                   "grad_sum": grad}, f)


def measure(method: str, mode: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out_path = os.path.join(folder, "result.json")
        command = [sys.executable, __file__, "--worker", method, "--mode", mode, "--vocab", str(args.vocab),
                   "--hidden", str(args.hidden), "--positions", str(args.positions), "--device", args.device,
                   "--out", out_path]
        # A fixed glibc mmap threshold: every block over 1 MiB is mapped and unmapped on free, so resident
        # memory tracks live tensors (glibc's default threshold grows and then keeps freed blocks resident).
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}
        subprocess.run(command, check=True, env=env)
        with open(out_path) as f:
            return json.load(f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary size (default: Qwen2's 151,936)")
    parser.add_argument("--hidden", type=int, default=896, help="hidden size (default: Qwen2.5-0.5B's 896)")
    parser.add_argument("--positions", type=int, default=2048, help="positions scored (default 2,048)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to run (default cpu)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.mode, args.vocab, args.hidden, args.positions, args.device, args.out)
        return 0
    import torch

    rows = []
    for mode in MODES:
        naive, ours = measure("naive", mode, args), measure("whileai", mode, args)
        difference = (torch.tensor(naive["logprobs"]) - torch.tensor(ours["logprobs"])).abs().max().item()
        rows.append({"mode": mode, "naive_peak_mb": naive["peak_bytes"] / 2**20,
                     "whileai_peak_mb": ours["peak_bytes"] / 2**20,
                     "ratio": ours["peak_bytes"] / naive["peak_bytes"],
                     "naive_seconds": naive["seconds"], "whileai_seconds": ours["seconds"],
                     "max_abs_logprob_difference": difference,
                     "grad_sums": [naive["grad_sum"], ours["grad_sum"]]})
    if args.json:
        print(json.dumps({"vocab": args.vocab, "positions": args.positions, "hidden": args.hidden,
                          "device": args.device, "torch_threads": torch.get_num_threads(),
                          "load_average_1min": os.getloadavg()[0], "rows": rows}, indent=2))
        return 0
    print(f"per-token logprobs, vocab {args.vocab:,} x {args.positions:,} positions, hidden {args.hidden}, "
          f"{args.device}; float32 logits alone would be {args.vocab * args.positions * 4 / 2**20:,.0f} MB; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'mode':<18}{'naive MB':>10}{'whileai MB':>12}{'ratio':>8}{'naive s':>9}{'whileai s':>11}"
          f"{'max |diff|':>12}{'grad sums (naive, whileai)':>32}")
    for r in rows:
        grads = "" if r["mode"] == "forward" else "{:.6g}, {:.6g}".format(*r["grad_sums"])
        print(f"{r['mode']:<18}{r['naive_peak_mb']:>10,.0f}{r['whileai_peak_mb']:>12,.0f}{r['ratio']:>8.3f}"
              f"{r['naive_seconds']:>9.2f}{r['whileai_seconds']:>11.2f}{r['max_abs_logprob_difference']:>12.2e}"
              f"{grads:>32}")
    worst = max(r["ratio"] for r in rows)
    print(f"ratio (whileai peak / naive peak), worst mode: {worst:.3f}  (goal <= 0.5: "
          f"{'met' if worst <= 0.5 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
