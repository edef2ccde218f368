"""How fast is ``method.update(batch)``? Side by side, in one process, on the same packed arrays.

    python benchmarks/update_throughput.py [--rows 4096] [--tokens 1024] [--subset 256] [--repeats 3]

For each method this prints:

* ``update`` - the best of ``--repeats`` timings of ``method.update(batch)``. The rows are validated
  into a ``Batch`` once (timed separately, as ``Batch.from_rows``); every timed call gets a fresh copy
  (``dataclasses.replace``: the same arrays, an empty cache), so the ratio and every other derived
  array are recomputed in every timing;
* ``x pass`` - that time over one *plain pass* over the same input arrays: one vectorised numpy pass
  computing ``rho = exp(logprobs - behavior_logprobs)`` over every token and a per-row sum of it
  (``np.add.reduceat``), the least any method that reads the ratio must do;
* ``x faster than ref`` - the slow per-token reference (``whileai.simulations.reference``: plain Python
  loops over every token, the same functions the tests check ``update`` against), timed on the first
  ``--subset`` trajectories (best of up to 3) and scaled linearly to the whole batch, over ``update``.
  Each reference is first checked equal to ``update`` on that subset, so the two compute the same
  thing. The grouped references look up each row's group by scanning the batch (quadratic in rows), so
  linear scaling from a subset *understates* their full-batch time: that speed-up is a lower bound.

Goals (issue 2): FlashReinforce and GRPO within 10x of one pass, SAO and BPCO within 25x, every method
at least 50x faster than the per-token reference.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import whileai as wai
from whileai.methods.supervised import pair_rows
from whileai.rows.batch import Batch
from whileai.simulations import reference

Row = dict[str, Any]


# --------------------------------------------------------------------- data
def make_rows(n_rows: int, n_tokens: int, seed: int = 0) -> list[Row]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_rows):
        logprobs = -rng.exponential(0.5, n_tokens) - 1e-4
        behavior = np.minimum(logprobs + 0.01 * rng.standard_normal(n_tokens), -1e-5)
        mask = rng.random(n_tokens) > 0.1
        mask[-1] = True
        rows.append({
            "reward": float(rng.integers(0, 2)), "logprobs": logprobs, "behavior_logprobs": behavior,
            "action_mask": mask, "values": rng.random(n_tokens),
            "ref_logprobs": np.minimum(logprobs + 0.01 * rng.standard_normal(n_tokens), -1e-5),
            "teacher_logprobs": np.minimum(logprobs + 0.3 * rng.standard_normal(n_tokens), -1e-5),
            "task_id": f"t{i // 8}", "agent": f"a{i % 4}",
        })
    return rows


def as_lists(rows: list[Row]) -> list[Row]:
    return [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()} for r in rows]


# --------------------------------------------------------------------- the slow references
def ref_dpo(rows: list[Row]) -> list[list[float]]:
    pairs = pair_rows(Batch.from_rows(rows), 1.0, "dpo")  # the pairing itself is tested separately
    return reference.dpo(rows, pairs.chosen.tolist(), pairs.rejected.tolist())


CASES: list[tuple[str, Callable[[], Any], Callable[[list[Row]], list[list[float]]]]] = [
    ("flash_reinforce", lambda: wai.FlashReinforce(), reference.flash_reinforce),
    ("grpo", lambda: wai.GRPO(), reference.grpo),
    ("rloo", lambda: wai.RLOO(), reference.rloo),
    ("max_rl", lambda: wai.MaxRL(), reference.max_rl),
    ("rae", lambda: wai.RAE(), reference.rae),
    ("sao", lambda: wai.SAO(), reference.sao),
    ("bpco", lambda: wai.BPCO(), reference.bpco),
    ("async(grpo, icepop)", lambda: wai.Async("grpo", correction="icepop"),
     lambda rows: reference.async_correction(rows, reference.grpo(rows), "icepop")),
    ("sft", lambda: wai.SFT(), reference.sft),
    ("dpo", lambda: wai.DPO(), ref_dpo),
    ("opd", lambda: wai.OPD(), reference.opd),
]


# --------------------------------------------------------------------- timing
def best_time(fn: Callable[[], Any], repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def plain_pass(batch: Batch) -> np.ndarray:
    ratio = np.exp(batch.logprobs_N - batch.behavior_logprobs_N)
    return np.add.reduceat(ratio, batch.offsets[:-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4096, help="trajectories in the batch (default 4096)")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per trajectory (default 1024)")
    parser.add_argument("--subset", type=int, default=256,
                        help="trajectories the slow reference runs on (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="timings per measurement; the best is kept")
    args = parser.parse_args(argv)

    rows = make_rows(args.rows, args.tokens)
    start = time.perf_counter()
    batch = Batch.from_rows(rows)
    validate = time.perf_counter() - start
    one_pass = best_time(lambda: plain_pass(batch), args.repeats)
    subset = as_lists(rows[: args.subset])
    scale = args.rows / args.subset
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}, Python "
          f"{platform.python_version()}, numpy {np.__version__}")
    print(f"batch: {args.rows} trajectories x {args.tokens} tokens = {args.rows * args.tokens:,} tokens; "
          f"Batch.from_rows {validate:.2f} s (once); one plain pass {one_pass * 1e3:.1f} ms")
    print(f"slow reference: per-token Python loops on {args.subset} trajectories, scaled x{scale:g}\n")
    print(f"{'method':22s} {'update ms':>10s} {'x pass':>8s} {'ref s (scaled)':>15s} {'x faster than ref':>18s}")
    for name, factory, slow in CASES:
        method = factory()
        # a fresh Batch (same arrays, empty cache) per call, so nothing derived is reused between timings
        update_s = best_time(lambda m=method: m.update(dataclasses.replace(batch)), args.repeats)
        want = slow(subset)
        got = factory().update(subset).coefficients
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12, err_msg=name)
        ref_s = best_time(lambda ref=slow: ref(subset), min(args.repeats, 3)) * scale
        print(f"{name:22s} {update_s * 1e3:10.1f} {update_s / one_pass:8.1f} {ref_s:15.1f} {ref_s / update_s:18.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
