"""Peak memory of training from a traces file: the streaming pass against reading the file whole.

    python benchmarks/traces_memory.py                  # 100,000 traces, 64 completion tokens each
    python benchmarks/traces_memory.py --traces 20000 --json

One file of generated traces in the library's form (prompt_tokens, tokens, behavior_logprobs, reward,
task_id), then two fresh processes, side by side:

1. stream: what ``wai train --rows FILE`` does: ``traces.scan`` (every line parsed and checked, keeping ~40
   bytes a trace), then 20 batches of 32 traces read back by seeking (``RowsFile.batch``);
2. whole: every line parsed into a list of dicts, what the loop did before (``json.loads`` per line, kept).

Each process reports its peak resident memory (VmHWM, reset through /proc/self/clear_refs after the imports)
above its resident memory at that moment, and the seconds the work took. Goal: the stream's peak a small
fraction of the file's size, and flat in the number of traces (compare two sizes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time


def _resident_kib() -> tuple[int, int]:
    status = open("/proc/self/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return rss, hwm


def _reset_peak() -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _resident_kib()[0]


def write_file(path: str, traces: int, tokens: int, seed: int = 0) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(traces):
            f.write(json.dumps({"task_id": f"t{i}", "prompt_tokens": rng.integers(3, 250, 32).tolist(),
                                "tokens": rng.integers(3, 250, tokens).tolist(),
                                "behavior_logprobs": np.round(-rng.random(tokens) * 4, 6).tolist(),
                                "reward": float(rng.random() < 0.4)}) + "\n")


def _measure(mode: str, path: str) -> dict[str, float]:
    """Run in a child process: import what the mode needs, reset the peak, do the work, report."""
    from pathlib import Path

    from whileai.loop.sources.traces import load_vocab, scan

    vocab = load_vocab("builtin:tiny")
    base = _reset_peak()
    began = time.perf_counter()
    if mode == "stream":
        source = scan(Path(path), vocab, trace=True)
        for step in range(20):
            source.batch(step, 32, seed=0, grouped=False)
        count = source.n
    else:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        count = len(rows)
    seconds = time.perf_counter() - began
    peak = _resident_kib()[1] - base
    return {"traces": count, "seconds": seconds, "peak_mib": peak / 1024}


def _child(mode: str, path: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", mode, path], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=64, help="completion tokens per trace")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_measure(*args.child)))
        return
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "traces.jsonl")
        write_file(path, args.traces, args.tokens)
        size = os.path.getsize(path) / 2**20
        results = {"file_mib": size, "stream": _child("stream", path), "whole": _child("whole", path)}
    results["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.traces} traces x {args.tokens} tokens: {size:.1f} MiB of JSONL ({results['machine']})")
    for mode in ("stream", "whole"):
        r = results[mode]
        print(f"  {mode:6s}: peak {r['peak_mib']:8.1f} MiB ({r['peak_mib'] / size:.3f} of the file) in "
              f"{r['seconds']:.1f} s")
    print(f"  stream / whole peak: {results['stream']['peak_mib'] / results['whole']['peak_mib']:.4f}")


if __name__ == "__main__":
    main()
