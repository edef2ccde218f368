"""What the training service costs on top of the engine: one training step over HTTP against in-process.

    python benchmarks/service_overhead.py                 # builtin:mini, 64 x 256 tokens, 5 rounds
    python benchmarks/service_overhead.py --json

One step = ``forward_backward(data, "cross_entropy")`` + ``optim_step()`` on a 64-datum batch of 256
positions each (weights 1 on every position). Direct: a ``TrainingEngine`` in this process. Service: the
same step through ``whileai.service.Client`` against ``wai serve`` started in its own process on loopback
(bearer auth, JSON both ways, ordering, the answer recorded in SQLite before it is sent). Both use the same
torch thread count and the same model, seed and batch; the rounds alternate one direct and one service
step, so a busy machine slows both alike. Reported: the best and the median step of each, their ratios
(goal: service <= 1.2x direct), and the round-trip of a ``noop`` operation through the whole stack.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def make_data(batch: int, length: int, vocab: int, seed: int = 0) -> list[dict[str, Any]]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, vocab, (batch, length + 1), generator=generator).tolist()
    return [{"model_input": t[:-1], "loss_fn_inputs": {"target_tokens": t[1:], "weights": [1.0] * length}}
            for t in tokens]


def timed(step: Any) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from whileai.engine import AdamParams, TrainingEngine
    from whileai.service import Client
    from whileai.service.launch import start_server

    torch.set_num_threads(args.threads)
    engine = TrainingEngine(args.model, seed=0)
    data = make_data(args.batch, args.length, engine.vocab_size)
    adam = AdamParams(learning_rate=1e-5)
    with tempfile.TemporaryDirectory() as tmp:
        with start_server(Path(tmp) / "data", threads=args.threads, args=["--model", args.model]) as server:
            run = Client(server.url, server.token).create_session().create_run(args.model, seed=0)

            def direct() -> None:
                engine.forward_backward(data, "cross_entropy")
                engine.optim_step(adam)

            def service() -> None:
                run.forward_backward(data, "cross_entropy")
                run.optim_step(adam)

            direct(), service()  # warm up both
            times: dict[str, list[float]] = {"direct": [], "service": []}
            for _ in range(args.rounds):
                times["direct"].append(timed(direct))
                times["service"].append(timed(service))
            noop = [timed(lambda: run.call("noop")) for _ in range(args.noops)]
    return {"model": args.model, "batch": args.batch, "length": args.length, "threads": args.threads,
            "rounds": args.rounds, "times_s": times,
            "best_s": {k: min(v) for k, v in times.items()},
            "median_s": {k: statistics.median(v) for k, v in times.items()},
            "ratio_best": min(times["service"]) / min(times["direct"]),
            "ratio_median": statistics.median(times["service"]) / statistics.median(times["direct"]),
            "noop_ms": {"median": 1e3 * statistics.median(noop), "p90": 1e3 * sorted(noop)[int(0.9 * len(noop))],
                        "count": len(noop)},
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}, "
                       f"torch {torch.__version__}, {torch.get_num_threads()} torch thread(s)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin:mini", help="the model of both (default builtin:mini)")
    parser.add_argument("--batch", type=int, default=64, help="datums per step (default 64)")
    parser.add_argument("--length", type=int, default=256, help="positions per datum (default 256)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating timed rounds (default 5)")
    parser.add_argument("--noops", type=int, default=200, help="noop operations timed (default 200)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both (default 1)")
    parser.add_argument("--json", action="store_true", help="print the whole measurement as JSON")
    args = parser.parse_args()
    result = measure(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['model']}, {args.batch} x {args.length} tokens, {result['machine']}")
    for kind in ("direct", "service"):
        print(f"  {kind:8s} best {result['best_s'][kind]:.3f} s  median {result['median_s'][kind]:.3f} s")
    print(f"  service / direct: best {result['ratio_best']:.3f}x, median {result['ratio_median']:.3f}x (goal <= 1.2x)")
    noop = result["noop_ms"]
    print(f"  noop through the full stack: median {noop['median']:.2f} ms, p90 {noop['p90']:.2f} ms "
          f"({noop['count']} calls)")


if __name__ == "__main__":
    main()
