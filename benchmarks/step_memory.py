"""Peak memory of the training step: set by the micro-batch, not the batch; lag without weight copies.

    python benchmarks/step_memory.py            # builtin:small (25M parameters), full fine-tuning, CPU
    python benchmarks/step_memory.py --json

Three measurements, each configuration in a fresh subprocess (one cannot inherit another's allocator
state). On CPU the peak is the high-water mark of resident memory (VmHWM, reset through
/proc/self/clear_refs just before the measured work) minus the resident memory at that moment.

1. batch growth: one ``policy_step`` (score -> update -> forward_backward -> optim_step) on B and 4B rows
   at a fixed ``micro_batch_tokens``. Goal: the 4B peak within 1.2x of the B peak.
2. the scoring pass: the same step with the scoring forward and without it (lag 0: the sampler's
   log-probabilities are the policy's), seconds per step both ways.
3. lag: ``wai.train`` for lag + 3 steps at lag 0 and lag 8 (the loop holds rows in flight, one set of
   weights), against the engine's sampler snapshots at lag 8 (``keep_sampler_versions = 9``, one copy
   of the trainable weights per version: what a loop that samples from old weights must keep).
   Goal: lag 8 within 1.1x of lag 0, plus the rows in flight.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

MODEL = "builtin:small"


def _resident_kib() -> tuple[int, int]:
    status = open("/proc/self/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return rss, hwm


def _reset_peak() -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _resident_kib()[0]


def _rows(engine, count: int, length: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        tokens = rng.integers(3, 259, size=length).tolist()
        rows.append({"prompt_tokens": [1, 70, 71], "tokens": tokens, "task_id": str(i // 2),
                     "reward": float(i % 2), "behavior_logprobs": [-5.5] * length})
    return rows


def measure_step(rows_count: int, length: int, micro: int, rescore: bool) -> dict:
    import whileai as wai
    from whileai.engine import TrainingEngine
    from whileai.loop.step import policy_step

    engine = TrainingEngine(MODEL, micro_batch_tokens=micro, keep_sampler_versions=1)
    warm = _rows(engine, 2, length, 0)
    policy_step(engine, wai.GRPO(rollouts_per_prompt=2), warm, adam={"learning_rate": 1e-5})  # allocate Adam state
    rows = _rows(engine, rows_count, length, 1)
    before = _reset_peak()
    began = time.perf_counter()
    policy_step(engine, wai.GRPO(rollouts_per_prompt=2), rows, adam={"learning_rate": 1e-5}, rescore=rescore)
    seconds = time.perf_counter() - began
    return {"peak_mib": (_resident_kib()[1] - before) / 1024, "seconds": seconds}


def measure_lag(lag: int, snapshots: bool) -> dict:
    import tempfile

    import whileai as wai
    from whileai.engine import SamplingParams, TrainingEngine

    if snapshots:  # the engine's versioned sampler weights: sample from the weights of `lag` steps ago
        engine = TrainingEngine(MODEL, keep_sampler_versions=lag + 1)
        before = _reset_peak()
        for step in range(lag + 3):
            engine.save_weights_for_sampler()
            engine.sample([[1, 70, 71]] * 4, 2, SamplingParams(max_tokens=4, seed=step),
                          version=max(0, engine.step - lag))
            engine.forward_backward([{"model_input": [1, 70, 71, 72], "loss_fn_inputs": {
                "target_tokens": [70, 71, 72, 73], "weights": [0.0, 0.0, 1.0, 1.0]}}], "cross_entropy")
            engine.optim_step({"learning_rate": 1e-5})
        return {"peak_mib": (_resident_kib()[1] - before) / 1024}
    # the loop: load the same model once (outside the measurement), then train lag + 3 steps
    TrainingEngine(MODEL)  # import and first-build costs, so both arms measure the run alone
    before = _reset_peak()
    with tempfile.TemporaryDirectory() as folder:
        wai.train(model=MODEL, lag=lag, steps=lag + 3, rollouts_per_step=8, warm_start_steps=0, eval_tasks=0,
                  export=False, progress=False, save_every=10_000, learning_rate=1e-5, run_dir=folder + "/run")
    return {"peak_mib": (_resident_kib()[1] - before) / 1024}


def _child(kind: str, args: list) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import step_memory as m; "
            f"print(json.dumps(m.{kind}(*{args!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "TQDM_DISABLE": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16, help="B: rows of the smaller batch (the larger is 4B)")
    parser.add_argument("--length", type=int, default=64, help="completion tokens per row")
    parser.add_argument("--micro-batch-tokens", type=int, default=1024, help="padded tokens per forward pass")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict = {"model": MODEL, "machine": f"{os.cpu_count()} cores, CPU"}
    small = _child("measure_step", [args.rows, args.length, args.micro_batch_tokens, True])
    large = _child("measure_step", [4 * args.rows, args.length, args.micro_batch_tokens, True])
    skip = _child("measure_step", [4 * args.rows, args.length, args.micro_batch_tokens, False])
    results["batch"] = {"B": args.rows, "peak_mib_B": small["peak_mib"], "peak_mib_4B": large["peak_mib"],
                        "ratio_4B_over_B": large["peak_mib"] / small["peak_mib"], "goal": "<= 1.2"}
    results["scoring"] = {"seconds_with_scoring": large["seconds"], "seconds_without": skip["seconds"],
                          "ratio": skip["seconds"] / large["seconds"]}
    lag0 = _child("measure_lag", [0, False])
    lag8 = _child("measure_lag", [8, False])
    snap = _child("measure_lag", [8, True])
    results["lag"] = {"loop_lag0_mib": lag0["peak_mib"], "loop_lag8_mib": lag8["peak_mib"],
                      "ratio_lag8_over_lag0": lag8["peak_mib"] / lag0["peak_mib"], "goal": "<= 1.1",
                      "engine_snapshots_lag8_mib": snap["peak_mib"]}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    b, s, lag = results["batch"], results["scoring"], results["lag"]
    print(f"{MODEL}, full fine-tuning, {results['machine']}")
    print(f"step peak, {b['B']} rows: {b['peak_mib_B']:.0f} MiB; {4 * b['B']} rows: {b['peak_mib_4B']:.0f} MiB; "
          f"ratio {b['ratio_4B_over_B']:.2f} (goal <= 1.2)")
    print(f"step time with the scoring forward {s['seconds_with_scoring']:.2f} s, without {s['seconds_without']:.2f} s "
          f"({s['ratio']:.2f}x)")
    print(f"run peak, lag 0: {lag['loop_lag0_mib']:.0f} MiB; lag 8: {lag['loop_lag8_mib']:.0f} MiB; ratio "
          f"{lag['ratio_lag8_over_lag0']:.2f} (goal <= 1.1); engine snapshots at lag 8: "
          f"{lag['engine_snapshots_lag8_mib']:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
