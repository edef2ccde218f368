"""How fast is ``method.update(batch)``? Side by side, in one process, on the same packed arrays.

    python benchmarks/update_throughput.py [--rows 4096] [--tokens 1024] [--subset 64] [--repeats 3]

For each method this prints:

* ``update`` - the best of ``--repeats`` timings of ``method.update(batch)`` on a ``Batch`` built once
  (validation is timed separately, once, as ``Batch.from_rows``);
* ``x pass`` - that time over one *plain pass* over the same input arrays: one vectorised numpy pass
  computing ``rho = exp(logprobs - behavior_logprobs)`` over every token and a per-row sum of it
  (``np.add.reduceat``), the least any method that reads the ratio must do;
* ``x faster than ref`` - the slow per-token reference (plain Python loops over every token, the
  obvious implementation of the same formula) timed on the first ``--subset`` trajectories and scaled
  linearly to the whole batch, over ``update``. Each reference is first checked equal to ``update`` on
  that subset, so the two compute the same thing.

Goals (issue 2): FlashReinforce and GRPO within 10x of one pass, SAO and BPCO within 25x, every method
at least 50x faster than the per-token reference.
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

import whileai as wai
from whileai.rows.batch import Batch

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


# --------------------------------------------------------------------- slow per-token references
def ref_flash_reinforce(rows: list[Row], trust: float = 0.003) -> list[list[float]]:
    mean_r = sum(r["reward"] for r in rows) / len(rows)
    out = []
    for r in rows:
        kl, n = 0.0, 0
        for lp, blp, m in zip(r["logprobs"], r["behavior_logprobs"], r["action_mask"]):
            if m:
                p, q = math.exp(blp), math.exp(lp)
                kl += p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))
                n += 1
        keep = kl / n <= trust
        a = r["reward"] - mean_r
        out.append([a * math.exp(lp - blp) / (n * len(rows)) if (m and keep) else 0.0
                    for lp, blp, m in zip(r["logprobs"], r["behavior_logprobs"], r["action_mask"])])
    return out


def _grouped(rows: list[Row], advantage: Callable[[float, list[float]], float], clip: float = 0.2):
    groups: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        groups[r["task_id"]].append(r["reward"])
    out = []
    for r in rows:
        a = advantage(r["reward"], groups[r["task_id"]])
        n = sum(1 for m in r["action_mask"] if m)
        line = []
        for lp, blp, m in zip(r["logprobs"], r["behavior_logprobs"], r["action_mask"]):
            rho = math.exp(lp - blp)
            unclipped = rho * a <= min(max(rho, 1 - clip), 1 + clip) * a
            line.append(rho * a / (len(rows) * n) if (m and unclipped) else 0.0)
        out.append(line)
    return out


def _grpo_advantage(reward: float, group: list[float]) -> float:
    mean = sum(group) / len(group)
    if max(group) == min(group):
        return 0.0
    std = math.sqrt(sum((g - mean) ** 2 for g in group) / (len(group) - 1))
    return (reward - mean) / (std + 1e-6)


def ref_grpo(rows: list[Row]) -> list[list[float]]:
    return _grouped(rows, _grpo_advantage)


def ref_rloo(rows: list[Row]) -> list[list[float]]:
    def advantage(reward: float, group: list[float]) -> float:
        return 0.0 if max(group) == min(group) else reward - (sum(group) - reward) / (len(group) - 1)
    return _grouped(rows, advantage)


def _gae(r: Row, alpha: float) -> list[float]:
    idx = [t for t, m in enumerate(r["action_mask"]) if m]
    lam = max(0.0, 1 - 1 / (alpha * len(idx)))
    adv = [0.0] * len(r["logprobs"])
    running = 0.0
    for k in range(len(idx) - 1, -1, -1):
        v_next = r["values"][idx[k + 1]] if k + 1 < len(idx) else 0.0
        reward = r["reward"] if k == len(idx) - 1 else 0.0
        running = reward + v_next - r["values"][idx[k]] + lam * running
        adv[idx[k]] = running
    return adv


def ref_sao(rows: list[Row], low: float = 0.7, high: float = 6.0) -> list[list[float]]:
    n = sum(sum(1 for m in r["action_mask"] if m) for r in rows)
    out = []
    for r in rows:
        adv = _gae(r, 1.5)
        line = []
        for t, (lp, blp, m) in enumerate(zip(r["logprobs"], r["behavior_logprobs"], r["action_mask"])):
            rho = math.exp(lp - blp)
            line.append(rho * adv[t] / n if (m and low < rho < high) else 0.0)
        out.append(line)
    return out


def ref_bpco(rows: list[Row], clip: float = 0.2) -> list[list[float]]:
    out = []
    for r in rows:
        adv = _gae(r, 0.4)
        line = []
        for t, (lp, blp, m) in enumerate(zip(r["logprobs"], r["behavior_logprobs"], r["action_mask"])):
            rho, mu = math.exp(lp - blp), math.exp(blp)
            bound = min(max(rho, 1 - clip / mu), 1 + clip / mu)
            line.append(rho * adv[t] / len(rows) if (m and rho * adv[t] <= bound * adv[t]) else 0.0)
        out.append(line)
    return out


def ref_sft(rows: list[Row]) -> list[list[float]]:
    return [[1.0 if m else 0.0 for m in r["action_mask"]] for r in rows]


def ref_opd(rows: list[Row]) -> list[list[float]]:
    return [[t - lp if m else 0.0 for lp, t, m in zip(r["logprobs"], r["teacher_logprobs"], r["action_mask"])]
            for r in rows]


def ref_dpo(rows: list[Row], beta: float = 0.1) -> list[list[float]]:
    from whileai.methods.supervised import pair_rows  # the pairing itself is tested separately
    pairs = pair_rows(Batch.from_rows(rows), 1.0, "dpo")
    out = [[0.0] * len(r["logprobs"]) for r in rows]
    for w, lose in zip(pairs.chosen, pairs.rejected):
        def margin(r: Row) -> float:
            return sum(a - b for a, b, m in zip(r["logprobs"], r["ref_logprobs"], r["action_mask"]) if m)
        weight = beta / (1 + math.exp(beta * (margin(rows[w]) - margin(rows[lose]))))
        for i, sign in ((w, 1.0), (lose, -1.0)):
            out[i] = [sign * weight if m else 0.0 for m in rows[i]["action_mask"]]
    return out


def ref_async_icepop(rows: list[Row]) -> list[list[float]]:
    inner = ref_grpo(rows)
    return [[c if 0.5 <= math.exp(lp - blp) <= 5.0 else 0.0
             for c, lp, blp in zip(line, r["logprobs"], r["behavior_logprobs"])] for line, r in zip(inner, rows)]


CASES: list[tuple[str, Callable[[], Any], Callable[[list[Row]], list[list[float]]]]] = [
    ("flash_reinforce", lambda: wai.FlashReinforce(), ref_flash_reinforce),
    ("grpo", lambda: wai.GRPO(), ref_grpo),
    ("rloo", lambda: wai.RLOO(), ref_rloo),
    ("sao", lambda: wai.SAO(), ref_sao),
    ("bpco", lambda: wai.BPCO(), ref_bpco),
    ("async(grpo, icepop)", lambda: wai.Async("grpo", correction="icepop"), ref_async_icepop),
    ("sft", lambda: wai.SFT(), ref_sft),
    ("dpo", lambda: wai.DPO(), ref_dpo),
    ("opd", lambda: wai.OPD(), ref_opd),
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
    parser.add_argument("--subset", type=int, default=64, help="trajectories the slow reference runs on (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timings per measurement; the best is kept")
    args = parser.parse_args(argv)

    rows = make_rows(args.rows, args.tokens)
    start = time.perf_counter()
    batch = Batch.from_rows(rows)
    validate = time.perf_counter() - start
    one_pass = best_time(lambda: plain_pass(batch), args.repeats)
    subset = as_lists(rows[: args.subset])
    scale = args.rows / args.subset
    print(f"machine: {platform.processor() or platform.machine()}, {platform.system()}, numpy {np.__version__}")
    print(f"batch: {args.rows} trajectories x {args.tokens} tokens = {args.rows * args.tokens:,} tokens; "
          f"Batch.from_rows {validate:.2f} s (once); one plain pass {one_pass * 1e3:.1f} ms")
    print(f"slow reference: per-token Python loops on {args.subset} trajectories, scaled x{scale:g}\n")
    print(f"{'method':22s} {'update ms':>10s} {'x pass':>8s} {'ref s (scaled)':>15s} {'x faster than ref':>18s}")
    for name, factory, reference in CASES:
        method = factory()
        update_s = best_time(lambda m=method: m.update(batch), args.repeats)
        want = reference(subset)
        got = method.update(subset).coefficients
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12, err_msg=name)
        ref_s = best_time(lambda ref=reference: ref(subset), 1) * scale
        print(f"{name:22s} {update_s * 1e3:10.1f} {update_s / one_pass:8.1f} {ref_s:15.1f} {ref_s / update_s:18.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
