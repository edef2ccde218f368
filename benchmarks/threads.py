"""`wai train --threads`: what torch's own thread count (every core) costs on a shared machine, against the rule's.

    PYTHONPATH=src python benchmarks/threads.py [--busy 2] [--steps 30] [--rounds 3] [--model builtin:tiny]

One process, side by side: supervised steps of the warm start (16 reference answers of builtin:case a step, the
loop's own datums) on the model, timed at each thread count in turn, ``--rounds`` times interleaved so that the
machine's other load falls on every arm alike. ``--busy N`` starts N processes spinning on the CPU for the run
(the "shared machine": other users' jobs). Prints seconds per step per thread count, the ratio to 1 thread, the
load average, and the rule's choice (whileai.loop.plan.rules.threads) for this machine now.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time


def _spin(stop: object) -> None:
    x = 0
    while not stop.is_set():  # type: ignore[attr-defined]
        x = (x * 31 + 7) % 1_000_003


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on the CPU during the run")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="builtin:tiny")
    args = parser.parse_args()

    import torch

    from whileai.engine import TrainingEngine
    from whileai.engine.datums import make_datum
    from whileai.envs import load_taskset, render_prompt
    from whileai.envs.episode import reference_episode
    from whileai.loop.plan import rules
    from whileai.loop.plan.run_plan import threads_rule

    cores = len(os.sched_getaffinity(0))
    counts = sorted({1, cores, torch.get_num_threads()})
    stop = multiprocessing.Event()
    busy = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    time.sleep(1.0 if busy else 0.0)
    taskset = load_taskset("builtin:case")
    engine = TrainingEngine(args.model, seed=0, keep_sampler_versions=1)
    tasks = taskset.split("train")[:16]
    data = [(render_prompt(engine.tokenizer, t), *reference_episode(taskset, t, engine.tokenizer)) for t in tasks]
    count = sum(sum(m) for _, _, m in data)
    datums = [make_datum(p, a, weights=[float(m) / count for m in mask]) for p, a, mask in data]
    times: dict[int, list[float]] = {n: [] for n in counts}
    try:
        for _ in range(args.rounds):
            for n in counts:
                torch.set_num_threads(n)
                started = time.perf_counter()
                for _ in range(args.steps):
                    engine.forward_backward(datums, "cross_entropy")
                    engine.optim_step({"learning_rate": 1e-3})
                times[n].append((time.perf_counter() - started) / args.steps)
    finally:
        stop.set()
        for p in busy:
            p.join(timeout=5)
    load = os.getloadavg()[0]
    print(f"{args.model}, {cores} cores in this process's affinity, {args.busy} busy processes started, "
          f"load average {load:.2f} at the end; {args.steps} supervised steps x {args.rounds} rounds per count")
    base = statistics.median(times[1])
    for n in counts:
        med = statistics.median(times[n])
        print(f"  threads {n}: {med * 1000:.1f} ms a step (median of {args.rounds}; rounds "
              f"{', '.join(f'{t * 1000:.1f}' for t in times[n])}), {med / base:.2f}x of 1 thread")
    value, why = threads_rule()
    print(f"the rule now: {why} (rules.MAX_THREADS {rules.MAX_THREADS})")


if __name__ == "__main__":
    main()
