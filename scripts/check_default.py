"""Run the embedded default (`wai train` with no arguments) for several seeds and check what it promises.

    python scripts/check_default.py                 # seeds 0-4
    python scripts/check_default.py --seeds 0 1 2 3 4 5 6 7

For each seed: held-out pass@1 before (must lie in [0.1, 0.6]) and after, the paired before/after interval
from `compare` (must exclude zero), and the wall time (must be under 5 minutes on 2 CPU cores). Prints a
Markdown table for docs/train.md and exits 1 if any seed misses a promise.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import whileai as wai


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args()
    print("| seed | before | after | paired delta [95% interval] | excludes 0 | seconds |")
    print("|---|---|---|---|---|---|")
    failed = 0
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as folder:
            began = time.perf_counter()
            run = wai.train(seed=seed, run_dir=f"{folder}/run", progress=False)
            seconds = time.perf_counter() - began
        before, after, paired = run.summary["eval_before"], run.summary["eval_after"], run.summary["compare"]
        ok = 0.1 <= before["pass_at_1"] <= 0.6 and paired["excludes_zero"] and paired["delta"] > 0 and seconds < 300
        failed += not ok
        low, high = paired["ci95"]
        print(f"| {seed} | {before['pass_at_1']:.3f} | {after['pass_at_1']:.3f} | {paired['delta']:+.3f} "
              f"[{low:+.3f}, {high:+.3f}] | {'yes' if paired['excludes_zero'] else 'NO'} | {seconds:.0f}"
              f"{'' if ok else '  <- misses a promise'} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
