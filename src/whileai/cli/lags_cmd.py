"""`wai lags`: the lag table, each method's held-out pass@1 at sampler lags 0, 2, 4, 8, 16 and its share of lag 0.

Writes RUN_DIR/lags.json and lags.txt next to the runs; runs already finished in RUN_DIR are read back, so a
stopped sweep resumes and two processes with different --methods can share one RUN_DIR. See docs/evidence.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any


def _ints(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers, e.g. 0,2,4,8,16") from None


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def register(subparsers: Any) -> None:
    from whileai.cli.recipe_cmd import add_budget_flags, add_output_flags, add_seed_flags
    from whileai.evidence.lags import LAG_METHODS, LAG_SEEDS, LAGS

    p = subparsers.add_parser(
        "lags", help="the lag table: held-out pass@1 at sampler lags 0..16 as a share of each method's lag 0",
        description="Train each method at each sampler lag and seed on one fixed budget (same model, taskset, steps, "
                    "rollouts per step and learning rate everywhere), then print held-out pass@1 per cell and its "
                    "share of the same method's lag-0 result, with a 95% interval over seeds, next to AReaL's "
                    "published 97.6% at lag 8 and 92.1% at lag 16.")
    p.add_argument("--methods", type=_names, default=list(LAG_METHODS),
                   help=f"comma-separated rows (default all: {','.join(LAG_METHODS)})")
    p.add_argument("--lags", type=_ints, default=list(LAGS),
                   help=f"comma-separated lags (default {','.join(map(str, LAGS))}; include 0 for the shares)")
    add_seed_flags(p, LAG_SEEDS, f"per cell (default {LAG_SEEDS})")
    p.add_argument("--set", dest="knobs", action="append", default=[], metavar="[METHOD:]KEY=VALUE",
                   help="a method knob for every run of METHOD (one of the rows; none: every method), e.g. "
                   "--set sao:critic_warmup=5; repeatable")
    add_budget_flags(p)
    add_output_flags(p, "lags.json", "runs/lags-TIME", "the table", "; finished runs there are reused")
    p.set_defaults(func=cmd_lags)


def cmd_lags(args: argparse.Namespace) -> int:
    from whileai.cli.recipe_cmd import budget, stopped_kept
    from whileai.cli.train_cmd import _pairs
    from whileai.evidence.lags import run_lag_table

    run_dir = args.run_dir or f"runs/lags-{time.strftime('%Y%m%d-%H%M%S')}"
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout), stopped_kept("wai lags", run_dir):
        table = run_lag_table(methods=args.methods, lags=args.lags, seeds=args.seeds, progress=args.progress,
                              knobs=_pairs(args.knobs, "--set"), run_dir=run_dir,
                              seed=args.seed, **budget(args))
    print(json.dumps(table.to_dict(), indent=2) if args.json else table)
    return 0
