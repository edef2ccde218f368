"""The inputs of the golden table (tests/methods/test_golden.py): fixed random batches and the cases run on them.

``METHOD_CASES`` are registry methods with options that change arithmetic; ``SERVICE_CASES`` are the service
page's algorithms (spec 004) as they were computed by ``whileai.algorithms`` before the fold, on batches whose
every token is an action token (those algorithms had no observation tokens). The values were recorded once,
before the fold, into ``data/golden.json``; after it the same inputs run through ``whileai.methods``.
"""

from __future__ import annotations

from typing import Any

from tests.methods._kit import random_rows

SEEDS = (0, 1, 2)


def grader(rows: list[dict[str, Any]]) -> list[float]:
    """GroupwiseGrading's grader in the golden cases: a longer pass ranks higher."""
    return [float(len(r["logprobs"])) for r in rows]


def method_batch(seed: int) -> list[dict[str, Any]]:
    """12 rows of 3 tasks with values, ref, teacher fields; seed 1 has two truncated rows, seed 2 real rewards,
    and every row a 'score' (RM)."""
    rows = random_rows(seed, 12, values=True, ref=True, teacher=True, tasks=3, binary=seed != 2)
    for i, row in enumerate(rows):
        row["score"] = float((i * 37 + seed * 11) % 17) / 7.0 - 1.0
        if seed == 1 and i in (1, 5):
            row["truncated"] = True
    return rows


def service_batch(seed: int) -> list[dict[str, Any]]:
    """The method batch with every token an action token (the service algorithms see completions only)."""
    rows = method_batch(seed)
    for row in rows:
        row["action_mask"] = [True] * len(row["logprobs"])
    return rows


METHOD_CASES: list[tuple[str, dict[str, Any]]] = [
    ("flash_reinforce", {}), ("flash_reinforce", {"trust": 0.05}),
    ("sao", {}), ("sao", {"ratio": [0.5, 2.0], "gae_alpha": 0.5}),
    ("bpco", {}), ("bpco", {"clip": 0.05, "gae_alpha": 2.0}),
    ("grpo", {}), ("grpo", {"loss_type": "bnpo"}), ("grpo", {"loss_type": "dr_grpo"}), ("grpo", {"beta": 0.04}),
    ("grpo", {"truncated": "zero"}), ("grpo", {"clip_high": 0.28, "dual_clip": 3.0}), ("grpo", {"clip": 0.05}),
    ("dr_grpo", {}), ("rloo", {}), ("rloo", {"clip_high": 0.28}), ("max_rl", {}), ("max_rl", {"clip": 0.05}),
    ("rae", {}), ("rae", {"decay": 0.5}),
    ("async", {"method": "grpo"}), ("async", {"method": "grpo", "correction": "icepop"}),
    ("async", {"method": "grpo", "correction": "tis"}), ("async", {"method": "rloo", "threshold": 0.1}),
    ("sft", {}), ("sft", {"normalize": "token_mean"}), ("sft", {"normalize": "sequence_mean"}),
    ("dpo", {}), ("dpo", {"beta": 0.5}), ("rm", {}),
    ("opd", {}), ("opd", {"divergence": "forward_kl"}), ("opd", {"divergence": "jsd"}), ("opd", {"max_ratio": None}),
    ("opsd", {}), ("opsd", {"anchor": "initial", "max_ratio": 1.5}),
    ("groupwise_grading", {"grader": "grader"}), ("groupwise_grading", {"grader": "grader", "mode": "advantage"}),
    ("reinforce_ada", {}), ("reinforce_ada", {"exit": "pos"}), ("reinforce_ada", {"divide_by_std": False}),
]

SERVICE_CASES: list[tuple[str, dict[str, Any]]] = [
    ("grpo_nostd", {}), ("grpo_len_norm", {}), ("drgrpo", {}), ("drgrpo", {"length": "own"}),
    ("ppo", {}), ("ppo", {"clip_low": 0.7, "clip_high": 1.3}), ("cispo", {}), ("cispo", {"clip_low": 0.5}),
    ("gspo", {}), ("dppo", {}), ("dppo", {"delta_low": 0.1, "divergence": "binary_kl"}),
    ("dapo", {"max_rounds": 0}), ("dapo", {"max_rounds": 0, "dynamic_sampling": False}),
    ("sapo", {}), ("sapo", {"tau_pos": 2.0}), ("rloo", {}),
    ("reinforce_pp", {}), ("reinforce_pp", {"kl_in": "token", "kl_coef": 0.1}),
    ("maxrl", {}), ("maxrl", {"estimator": "beat_the_best"}),
    ("opd", {}), ("opd", {"kl_coef": 0.5}), ("opsd", {}), ("sdpo", {}),
]

MAX_TOKENS = 8  # the service cases' generation cap (Dr. GRPO's L_max)


def case_id(kind: str, name: str, options: dict[str, Any], seed: int) -> str:
    shown = ",".join(f"{k}={v}" for k, v in sorted(options.items()))
    return f"{kind}:{name}[{shown}]@{seed}"
