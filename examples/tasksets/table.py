"""The numbers of docs/tasksets.md ("Your own taskset"): for each taskset, today's defaults against the rules
over the seeds run, from the run directories `wai train` wrote (RUN_ROOT/NAME-ARM-sSEED).

    python examples/tasksets/table.py RUN_ROOT parity upper successor --arms default rules --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from whileai.rows.stats import compare


def rows(run: Path, name: str, seed: int) -> list[dict]:
    return [{**json.loads(line), "seed": seed} for line in (run / name).read_text().splitlines() if line.strip()]


def line(c: Any) -> str:
    lo, hi = c.ci95
    return (f"{c.baseline:.3f} -> {c.treatment:.3f}, paired delta {c.delta:+.3f} [{lo:+.3f}, {hi:+.3f}] over "
            f"{c.n_tasks} tasks x {c.treatment_seeds} seeds ({c.verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("tasksets", nargs="+")
    parser.add_argument("--arms", nargs=2, default=["default", "rules"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    args = parser.parse_args()
    for taskset in args.tasksets:
        arms = {arm: [args.root / f"{taskset}-{arm}-s{s}" for s in args.seeds] for arm in args.arms}
        for arm, runs in arms.items():
            for seed, run in zip(args.seeds, runs):
                summary = json.loads((run / "summary.json").read_text())
                warm = run / "warm_start_steps.txt"
                steps = warm.read_text().strip() if warm.exists() else summary["resolved"]["warm_start_steps"]
                print(f"{taskset} {arm} seed {seed}: warm start {steps}, lr {summary['resolved']['learning_rate']:g}, "
                      f"cap {summary['resolved']['max_tokens']}: {summary['compare']['text']}")
            pooled = compare([r for s, run in zip(args.seeds, runs) for r in rows(run, "heldout-before.jsonl", s)],
                             [r for s, run in zip(args.seeds, runs) for r in rows(run, "heldout.jsonl", s)])
            print(f"{taskset} {arm}, RL phase pooled over seeds: {line(pooled)}")
        base, treat = arms[args.arms[0]], arms[args.arms[1]]
        versus = compare([r for s, run in zip(args.seeds, base) for r in rows(run, "heldout.jsonl", s)],
                         [r for s, run in zip(args.seeds, treat) for r in rows(run, "heldout.jsonl", s)])
        print(f"{taskset}: {args.arms[1]} vs {args.arms[0]}, final held-out: {line(versus)}")


if __name__ == "__main__":
    main()
