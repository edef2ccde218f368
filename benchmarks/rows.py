"""`wai report` on a million graded rows against a plain `json.loads` pass over the same file.

    python benchmarks/rows.py                 # 1,000,000 rows, 10,000 tasks (about 215 MiB on disk)
    python benchmarks/rows.py --rows 100000   # a quicker run

Both sides run on the same file in the same run, measured two ways:

* in this process: wall time (best of --repeat runs, alternated, no tracing) and peak Python
  memory (tracemalloc, numpy included, a separate traced run). `wai report` goes through the real
  command line entry point (`whileai.cli.main`), output discarded.
* as separate processes, the way a user runs them: a fresh Python running `wai report FILE`
  (`whileai.cli.main`) against a fresh Python running the `json.loads` pass, wall time including
  interpreter start and imports, and each process's peak resident memory (VmHWM), which counts
  everything the process holds: interpreter, numpy, buffers.

The baseline parses every line and keeps nothing, the least any JSONL reader can do; `wai report`
parses, validates and keeps the graded fields as columns, then prints the whole report. Goals:
report time within 3x of the baseline, peak memory well under the file size.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from whileai.cli import main as wai

# Each child reports its own peak resident memory (VmHWM: the high-water mark of the memory it
# mapped after exec, so the parent's pages copied at fork are not counted) on stderr.
_PEAK = ("import sys\n"
         "peak = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
         "print(int(peak) * 1024, file=sys.stderr)\n")
BASELINE_CODE = ("import json, sys\n"
                 "with open(sys.argv[1], encoding='utf-8') as handle:\n"
                 "    for line in handle:\n"
                 "        json.loads(line)\n" + _PEAK)
WAI_CODE = ("import sys\n"
            "from whileai.cli import main\n"
            "code = main(['report', sys.argv[1]])\n" + _PEAK + "sys.exit(code)\n")


def generate(path: Path, rows: int, tasks: int, seed: int = 0) -> None:
    """Rows of `tasks` tasks, each with its own pass rate; 20 token ids per row, 2% of fails truncated."""
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


def run_process(argv: list[str]) -> tuple[float, int]:
    """(wall seconds, peak resident bytes) of one child process, its output discarded."""
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:3]} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds, int(done.stderr.split()[-1])


def processes(path: Path, repeat: int) -> list[tuple[float, int]]:
    """Best wall time and largest peak RSS of each command, runs alternated."""
    commands = [[sys.executable, "-c", BASELINE_CODE, str(path)], [sys.executable, "-c", WAI_CODE, str(path)]]
    best = [(float("inf"), 0)] * len(commands)
    for _ in range(repeat):
        for i, argv in enumerate(commands):
            seconds, rss = run_process(argv)
            best[i] = (min(best[i][0], seconds), max(best[i][1], rss))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
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
        (base_ps, base_rss), (report_ps, report_rss) = processes(path, args.repeat)
    mb = 1 / 2**20
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"file: {args.rows:,} rows, {args.tasks:,} tasks, {size * mb:.1f} MiB")
    print("in process (best wall time; tracemalloc peak):")
    print(f"  json.loads pass: {base_s:6.2f} s, peak {base_mem * mb:7.2f} MiB")
    print(f"  wai report:      {report_s:6.2f} s, peak {report_mem * mb:7.2f} MiB")
    print(f"  time ratio: {report_s / base_s:.2f}x (goal <= 3x); peak / file size: {report_mem / size:.3f}")
    print("as processes (best wall time incl. start-up; peak resident memory):")
    print(f"  python: json.loads pass:        {base_ps:6.2f} s, RSS {base_rss * mb:7.1f} MiB")
    print(f"  python: wai report FILE:         {report_ps:6.2f} s, RSS {report_rss * mb:7.1f} MiB")
    print(f"  time ratio: {report_ps / base_ps:.2f}x (goal <= 3x); RSS / file size: {report_rss / size:.3f}, "
          f"RSS over the baseline's: {(report_rss - base_rss) * mb:.1f} MiB")


if __name__ == "__main__":
    main()
