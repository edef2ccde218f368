"""Defaults that learn on tasks nobody tuned them for: `wai train --taskset FILE` with every setting left to the
rules, against settings chosen by hand, on six tasksets and environments written for this benchmark (not the
built-ins, not examples/tasksets), over seeds.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/own_tasks.py --out /tmp/own_tasks.jsonl [--seeds 0 1]
        [--arms default ws200 ws400 ws800] [--tasks sum3 ...] [--jobs 2]
    python benchmarks/own_tasks.py --out /tmp/own_tasks.jsonl --table      # BENCHMARKS.md's table

Each run: builtin:tiny, flash_reinforce, 40 RL steps of 32 rollouts, lag 2, held-out pass@1 over 64 test tasks x 4
samples (the loop's defaults). Arms: ``default`` leaves the warm start and both rates to the rules
(whileai.loop.plan.rules); ``wsN`` is N warm-start steps at 3e-3 then RL at 1e-3; ``wsN@1e-2`` at 1e-2. A row of
--out per (task, arm, seed): held-out pass@1 after the warm start ("before" RL) and after RL, RL's own paired
gain with its 95% interval, the final weights' pass@1 ("final": the warm start's when RL undid it and the run
handed them back, ``rules.keep_warm_start``; else "after"), the warm-start steps run and the wall seconds. Runs already in --out are skipped, so
the benchmark can be stopped and continued.

The tasks (1,000 prompts each unless said; 10% held out as test by the JSONL default):
  sum3     "3+4+2=" -> "9"               the sum of three digits (graded numeric)
  rot1     "cat>" -> "dbu"               each letter shifted by one (3-4 letters of a-y)
  vowels   "kotai:" -> "oai"             the vowels of a 5-letter word, in order
  commas   "1234567," -> "1,234,567"     thousands separators (4-7 digits)
  count    "abbcab#" -> "3"              how many b's in 6 letters of a-c (graded exact)
  shop     an environment: "buy kex" -> the model calls "price kex", reads "=37", answers "pay 37"
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

TASKS = ("sum3", "rot1", "vowels", "commas", "count", "shop")
ARMS = ("default", "ws200", "ws400", "ws800", "ws1200", "ws1600", "ws2400", "ws3200", "ws200@1e-2")


def _rows(name: str) -> list[dict[str, Any]]:
    rng = random.Random(0)
    if name == "sum3":
        seen = rng.sample([(a, b, c) for a in range(10) for b in range(10) for c in range(10)], 1000)
        return [{"prompt": f"{a}+{b}+{c}=", "answer": str(a + b + c)} for a, b, c in seen]
    if name == "rot1":
        words: dict[str, None] = {}
        while len(words) < 1000:
            words["".join(rng.choice("abcdefghijklmnopqrstuvwxy") for _ in range(rng.randint(3, 4)))] = None
        return [{"prompt": f"{w}>", "answer": "".join(chr(ord(c) + 1) for c in w)} for w in words]
    if name == "vowels":
        words = {}
        while len(words) < 1000:
            w = "".join(rng.choice("bcdfgklmnprstaeiou") for _ in range(5))
            if any(c in "aeiou" for c in w):
                words[w] = None
        return [{"prompt": f"{w}:", "answer": "".join(c for c in w if c in "aeiou")} for w in words]
    if name == "commas":
        numbers = rng.sample(range(1000, 10_000_000), 1000)
        return [{"prompt": f"{n},", "answer": f"{n:,}"} for n in numbers]
    if name == "count":
        words = {}
        while len(words) < 700:  # 3**6 = 729 strings in all
            words["".join(rng.choice("abc") for _ in range(6))] = None
        return [{"prompt": f"{w}#", "answer": str(w.count("b"))} for w in words]
    raise ValueError(name)


def taskset(name: str, folder: Path) -> Any:
    """The taskset spec (a JSONL path) or, for ``shop``, the environment object."""
    if name == "shop":
        return shop()
    path = folder / f"{name}.jsonl"
    if not path.exists():
        path.write_text("".join(json.dumps(r) + "\n" for r in _rows(name)))
    return str(path)


def options(name: str) -> dict[str, Any]:
    return {"grader": "numeric"} if name == "sum3" else {}


def shop() -> Any:
    from whileai.envs import Env, EnvTaskset, Task

    class Shop(Env):
        """A price list behind a tool: `price ITEM` answers `=PRICE`; `pay N` ends the episode."""

        stop = ("\n",)
        max_turns = 3

        def __init__(self, task: Task) -> None:
            self.task, self.paid = task, None

        def step(self, text: str) -> str | None:
            text = text.strip()
            if text.startswith("price "):
                item = text[6:].strip()
                return f"={PRICES[item]}\n" if item in PRICES else "=?\n"
            self.paid = text[4:].strip() if text.startswith("pay ") else text
            return None

        def reward(self) -> float:
            return float(self.paid == str(self.task.info["price"]))

    rng = random.Random(0)
    items = sorted({"".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3)) for _ in range(1200)})[:1000]
    PRICES = {item: rng.randint(10, 99) for item in items}  # noqa: N806 - the shop's catalogue
    tasks = [Task(item, f"buy {item}\n", [f"price {item}\n", f"pay {PRICES[item]}\n"], {"price": PRICES[item]})
             for item in items]
    rng.shuffle(tasks)
    return EnvTaskset("shop", train=tasks[100:], test=tasks[:100], env=Shop, max_tokens=24)


def settings(arm: str) -> dict[str, Any]:
    if arm == "default":
        return {}
    steps, _, rate = arm[2:].partition("@")
    return {"warm_start_steps": int(steps), "warm_start_learning_rate": float(rate or 3e-3), "learning_rate": 1e-3}


def run_one(task: str, arm: str, seed: int, folder: Path) -> dict[str, Any]:
    import whileai as wai

    started = time.perf_counter()
    run = wai.train(taskset=taskset(task, folder), taskset_options=options(task), seed=seed, progress=False,
                    export=False, run_dir=str(folder / f"{task}-{arm}-{seed}-{os.getpid()}-{time.time_ns()}"),
                    **settings(arm))
    compare, kept = run.summary["compare"], run.summary.get("kept_warm_start")
    return {"task": task, "arm": arm, "seed": seed, "before": compare["before"], "after": compare["after"],
            "final": kept["held_out"]["pass_at_1"] if kept else compare["after"],
            "rl_delta": compare["delta"], "rl_ci95": compare["ci95"],
            "warm_start_steps": run.summary.get("warm_start_steps_run", 0),
            "warm_start_learning_rate": run.summary["resolved"]["warm_start_learning_rate"],
            "learning_rate": run.summary["resolved"]["learning_rate"],
            "seconds": round(time.perf_counter() - started, 1),
            "preflight_notes": run.summary.get("preflight", {}).get("notes", [])}


def _work(job: tuple[str, str, int, str, str]) -> dict[str, Any]:
    task, arm, seed, folder, out = job
    try:
        row = run_one(task, arm, seed, Path(folder))
    except Exception as err:  # a run the loop refused: recorded as such, the benchmark goes on
        row = {"task": task, "arm": arm, "seed": seed, "error": f"{type(err).__name__}: {err}"[:500]}
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """Per task: each arm's final held-out pass@1 per seed (its final weights'), the default's gap to the best hand arm (each
    compared on the seeds both have), RL's own gain under the default (per seed, with its interval), the
    default's warm-start steps and wall seconds."""
    arms = [a for a in ARMS if any(r["arm"] == a for r in rows)]
    lines = ["| task | " + " | ".join(arms) + " | default - best hand (arm) | RL's gain under the default, per "
             "seed [95%] | default warm-start steps | default wall s |",
             "|---" * (len(arms) + 5) + "|"]
    met, tasks = 0, [t for t in TASKS if any(r["task"] == t for r in rows)]
    for task in tasks:
        after = {(r["arm"], r["seed"]): r.get("final", r["after"]) for r in rows if r["task"] == task}
        cells = []
        for arm in arms:
            seeds = sorted(s for a, s in after if a == arm)
            cells.append(" / ".join(f"{after[(arm, s)]:.3f}" for s in seeds))
        gaps = []
        for arm in arms[1:]:
            common = [s for a, s in after if a == arm and ("default", s) in after]
            if common:
                gaps.append((statistics.fmean(after[("default", s)] - after[(arm, s)] for s in common), arm))
        gap, best = min(gaps) if gaps else (float("nan"), "")
        met += gap >= -0.02
        mine = sorted((r for r in rows if r["task"] == task and r["arm"] == "default"), key=lambda r: r["seed"])
        rl = "; ".join(f"{r['rl_delta']:+.3f} [{r['rl_ci95'][0]:+.3f}, {r['rl_ci95'][1]:+.3f}]" for r in mine)
        steps = ", ".join(str(r["warm_start_steps"]) for r in mine)
        wall = ", ".join(f"{r['seconds']:.0f}" for r in mine)
        lines.append(f"| {task} | " + " | ".join(cells) + f" | {gap:+.3f} ({best}) | {rl} | {steps} | {wall} |")
    lines.append(f"\nthe default within 0.02 of the best hand arm (on the seeds both ran) on {met} of {len(tasks)} tasks")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--arms", nargs="+", default=list(ARMS))
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--table", action="store_true", help="print the table of the rows in --out and exit")
    args = parser.parse_args()
    out = Path(args.out)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if args.table:
        rows = [r for r in rows if "error" not in r]
        print(table(rows))
        return
    done = {(r["task"], r["arm"], r["seed"]) for r in rows}
    folder = tempfile.mkdtemp(prefix="own_tasks-")
    jobs = [(t, a, s, folder, str(out)) for s in args.seeds for a in args.arms for t in args.tasks
            if (t, a, s) not in done]
    if args.jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            list(pool.imap_unordered(_work, jobs))
    else:
        for job in jobs:
            _work(job)
    print(table([r for r in map(json.loads, out.read_text().splitlines()) if "error" not in r]))


if __name__ == "__main__":
    main()
