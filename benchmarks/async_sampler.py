"""Rollouts in process vs from a `wai policy` server sampled ahead of the trainer: steps per minute and held-out
pass@1 after the same wall-clock budget, in one run (the server is a subprocess of it).

    python benchmarks/async_sampler.py                 # builtin:tiny on builtin:case, 60 s of training per arm
    python benchmarks/async_sampler.py --budget 30 --json

Arms: the in-process sampler (lag 1; sampling and training take turns on the trainer's cores), the same with two
torch threads (what a user without a server would try on two cores), and ``--sampler-url`` against one
``wai policy --threads 1`` subprocess at lag 0 (synchronous: push, then sample), 1 and 4. Every arm is the
embedded default run (14 warm-start steps, 32 rollouts a step, full fine-tuning) with a constant learning rate
and no step limit; a timer sends the run a Ctrl-C ``--budget`` seconds after its first step is recorded, the run
finishes that step and checkpoints, and the checkpoint's weights are scored on the 64 held-out tasks x 4
samples with the run's own evaluation seeds. Steps per minute are counted from step 2 on (the first step fills
the pipeline), from the steps' own clock (``time/elapsed_s``). The paired interval compares each arm's held-out
pass@1 with the in-process arm's on the same tasks and seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from whileai.engine import TrainingEngine
from whileai.envs import load_taskset
from whileai.loop.hooks.context import Interrupted
from whileai.loop.hooks.held_out import before_after, held_out
from whileai.loop.run import dry_run, train
from whileai.loop.types import prompts
from whileai.record.launch import Started

RUN = dict(steps=100_000, lr_schedule="constant", progress=False, export=False, save_every=100_000, seed=0)
ARMS = [("in-process, lag 1", {"lag": 1}, 1), ("in-process, lag 1, 2 threads", {"lag": 1}, 2),
        ("server, lag 0", {"lag": 0, "server": True}, 1), ("server, lag 1", {"lag": 1, "server": True}, 1),
        ("server, lag 4", {"lag": 4, "server": True}, 1),
        ("server, lag 4, sync every 4", {"lag": 4, "server": True, "sync_every": 4}, 1)]


def _stop_after(metrics: Path, budget: float, done: threading.Event) -> None:
    """Ctrl-C the run (this process) ``budget`` seconds after its first step is in metrics.jsonl."""
    while not done.is_set() and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.05)
    if not done.wait(budget):
        os.kill(os.getpid(), signal.SIGINT)


def arm(name: str, settings: dict[str, Any], threads: int, budget: float, url: str, root: Path) -> dict[str, Any]:
    run_dir = root / name.replace(" ", "_").replace(",", "")
    extra = {k: v for k, v in settings.items() if k != "server"}
    if settings.get("server"):
        extra["sampler_url"] = url
    done = threading.Event()
    timer = threading.Thread(target=_stop_after, args=(run_dir / "metrics.jsonl", budget, done), daemon=True)
    torch.set_num_threads(threads)
    load = os.getloadavg()[0]
    timer.start()
    try:
        train(**RUN, **extra, run_dir=str(run_dir))
    except Interrupted:
        pass
    finally:
        done.set()
        torch.set_num_threads(1)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, last = records[0], records[-1]
    rate = 60 * (last["step"] - first["step"]) / (last["time/elapsed_s"] - first["time/elapsed_s"])
    evaluation = evaluate(run_dir, extra)
    return {"arm": name, "steps": last["step"], "steps_per_min": rate, "pass_at_1": evaluation["pass_at_1"],
            "ci95": evaluation["ci95"], "rows": evaluation["rows"], "load_before": load,
            "staleness_max": max(r.get("staleness/max", 0) for r in records),
            "sample_s": sum(r["time/sample_s"] for r in records[1:]) / (len(records) - 1),
            "train_s": sum(r["time/train_s"] for r in records[1:]) / (len(records) - 1)}


def evaluate(run_dir: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Held-out pass@1 of the run's checkpoint, with the run's evaluation settings and seeds."""
    plan = dry_run(**RUN, **{k: v for k, v in extra.items() if k != "sampler_url"})
    engine = TrainingEngine(plan.model, seed=plan.seed)
    engine.load_state(str(run_dir / "checkpoint"))
    taskset = load_taskset(RUN.get("taskset", "builtin:case"))
    tasks = taskset.split("test")[: plan.eval_tasks]
    return held_out(engine, taskset, tasks, prompts(engine.tokenizer, tasks), plan.eval_samples, plan.sampling(),
                    plan.seed, cap_is_answer_length=plan.cap_is_answer_length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of training per arm (default 60)")
    parser.add_argument("--max-tokens", type=int, help="the generation cap (default: the taskset's, 4): a longer "
                        "one makes sampling a larger share of a step")
    parser.add_argument("--warm-start-steps", type=int, help="the supervised warm start (default: the taskset's); 0 "
                        "leaves the random-init model's replies running to the cap, so sampling is most of a step")
    parser.add_argument("--taskset", default="builtin:case", help="the taskset (default builtin:case; builtin:count "
                        "has scratchpad replies, so sampling is a larger share of a step)")
    parser.add_argument("--arms", default=",".join(str(i) for i in range(len(ARMS))),
                        help="which arms, by index (default all: " + "; ".join(
                            f"{i} {a[0]}" for i, a in enumerate(ARMS)) + ")")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.max_tokens:
        RUN["max_tokens"] = args.max_tokens
    RUN["taskset"] = args.taskset
    if args.warm_start_steps is not None:
        RUN["warm_start_steps"] = args.warm_start_steps
    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as tmp, Started(["policy", "builtin:tiny", "--threads", "1"],
                                                       Path(tmp)) as server:
        os.environ["WAI_TOKEN"] = server.token or ""  # the trainer's sampler client reads the server's token here
        for name, settings, threads in (ARMS[int(i)] for i in args.arms.split(",")):
            results.append(arm(name, settings, threads, args.budget, server.url, Path(tmp)))
            print(f"{name}: {results[-1]['steps']} steps, {results[-1]['steps_per_min']:.1f} steps/min", flush=True)
    base = results[0]
    for result in results:
        result["speedup"] = result["steps_per_min"] / base["steps_per_min"]
        result["vs_in_process"] = None if result is base else before_after(base, result)["text"]
    report = [{k: v for k, v in r.items() if k != "rows"} for r in results]
    if args.json:
        print(json.dumps({"budget_s": args.budget, "cpus": os.cpu_count(), "max_tokens": RUN.get("max_tokens"),
                          "taskset": args.taskset,
                          "arms": report}, indent=2))
        return
    print(f"budget {args.budget:g} s of training per arm, {os.cpu_count()} CPUs, builtin:tiny on {args.taskset}, "
          f"max_tokens {RUN.get('max_tokens', 'the taskset cap')}")
    for r in report:
        low, high = r["ci95"]
        print(f"  {r['arm']:30s} {r['steps_per_min']:6.1f} steps/min ({r['speedup']:.2f}x)  {r['steps']:4d} steps  "
              f"pass@1 {r['pass_at_1']:.3f} [{low:.3f}, {high:.3f}]  sample {r['sample_s']:.2f} s  train "
              f"{r['train_s']:.2f} s  max gap {r['staleness_max']:g}  load {r['load_before']:.1f}")
        if r["vs_in_process"]:
            print(f"    vs in-process: {r['vs_in_process']}")


if __name__ == "__main__":
    main()
