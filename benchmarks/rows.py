"""`wai report` on a million graded rows against a plain `json.loads` pass over the same file.

    python benchmarks/rows.py                 # 1,000,000 rows, 10,000 tasks (about 150 MB on disk)
    python benchmarks/rows.py --rows 100000   # a quicker run

Both sides run in this process on the same file: wall time (best of --repeat runs, no tracing) and
peak Python memory (tracemalloc, numpy included, a separate traced run). The baseline parses every
line and keeps nothing, the least any JSONL reader can do; `wai report` parses, validates and
keeps the graded fields as columns, then prints the whole report. Goals: report time within 3x of
the baseline, peak memory well under the file size.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from whileai.cli.rows_cmd import main as wai


def generate(path: Path, rows: int, tasks: int, seed: int = 0) -> None:
    """Rows of `tasks` tasks, each with its own pass rate; 20 token ids per row, 2% truncated."""
    rng = random.Random(seed)
    rates = [rng.betavariate(0.8, 0.9) for _ in range(tasks)]
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(rows):
            task = i % tasks
            passed = rng.random() < rates[task]
            truncated = not passed and rng.random() < 0.02
            tokens = ",".join(str(rng.randrange(151_000)) for _ in range(20))
            handle.write(f'{{"task_id": "task-{task:05d}", "reward": {1.0 if passed else 0.0}, '
                         f'"truncated": {"true" if truncated else "false"}, "model": "Qwen/Qwen3-4B", '
                         f'"tokens": [{tokens}]}}\n')


def plain_json_pass(path: Path) -> None:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            json.loads(line)


def wai_report(path: Path) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        code = wai(["report", str(path)])
    if code != 0:
        raise RuntimeError(f"wai report exited {code}")


def timed(fns: list[Callable[[Path], None]], path: Path, repeat: int) -> list[float]:
    """Best wall time of each function; runs alternate so a busy neighbour slows both sides alike."""
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn(path)
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def peak_bytes(fn: Callable[[Path], None], path: Path) -> int:
    tracemalloc.start()
    try:
        fn(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows to generate (default 1,000,000)")
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks the rows spread over (default 10,000)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per side; the best is kept (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.jsonl"
        generate(path, args.rows, args.tasks)
        size = os.path.getsize(path)
        base_s, report_s = timed([plain_json_pass, wai_report], path, args.repeat)
        base_mem, report_mem = peak_bytes(plain_json_pass, path), peak_bytes(wai_report, path)
    mb = 1 / 2**20
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"file: {args.rows:,} rows, {args.tasks:,} tasks, {size * mb:.1f} MiB")
    print(f"json.loads pass: {base_s:.2f} s, peak {base_mem * mb:.2f} MiB")
    print(f"wai report:      {report_s:.2f} s, peak {report_mem * mb:.2f} MiB")
    print(f"time ratio (wai report / json.loads pass): {report_s / base_s:.2f}x  (goal <= 3x)")
    print(f"peak memory / file size: {report_mem / size:.3f}  (goal: well under 1)")


if __name__ == "__main__":
    main()
