"""Slow, obviously-correct per-token references for the method coefficients.

Plain Python: one loop over rows, one over tokens, ``math`` only, each line a formula from the
methods reference. The tests check every method's vectorised ``update()`` against these over several
seeds, and ``benchmarks/update_throughput.py`` times these same functions as the speed-up baseline.
Nothing here is fast on purpose, and nothing is slow on purpose either: it is the loop a reader would
write to check the arithmetic by hand.

Every function takes rows (plain dicts, lists of floats) and returns one list of floats per row: the
coefficient c on each token, 0 on environment tokens.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]
Coefficients = list[list[float]]


def _mask(row: Row) -> list[bool]:
    return [bool(m) for m in row.get("action_mask", [True] * len(row["logprobs"]))]


def _behavior(row: Row) -> Sequence[float]:
    return row.get("behavior_logprobs", row["logprobs"])  # type: ignore[no-any-return]


def action_tokens(row: Row) -> int:
    return sum(_mask(row))


# --------------------------------------------------------------------- FlashReinforce
def flash_reinforce(rows: Sequence[Row], trust: float = 0.003) -> Coefficients:
    """c = m_i A_i rho / (T_i B), A_i = R_i - mean R, m_i = 1[mean Bernoulli KL <= trust] (Eq. 5-10)."""
    size = len(rows)
    mean_reward = sum(r["reward"] for r in rows) / size
    out = []
    for row in rows:
        logprobs, behavior, mask = row["logprobs"], _behavior(row), _mask(row)
        kls = []
        for t in range(len(logprobs)):
            if mask[t]:
                p, q = math.exp(behavior[t]), math.exp(logprobs[t])
                kls.append(p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q)))
        tokens = len(kls)
        admitted = sum(kls) / tokens <= trust
        advantage = row["reward"] - mean_reward
        out.append([advantage * math.exp(logprobs[t] - behavior[t]) / (tokens * size) if mask[t] and admitted
                    else 0.0 for t in range(len(logprobs))])
    return out


# --------------------------------------------------------------------- the grouped family
def surrogate(rows: Sequence[Row], advantages: Sequence[float], weights: Sequence[float],
              admitted: Sequence[bool], clip: float, clip_high: float | None = None,
              dual_clip: float | None = None) -> Coefficients:
    """c = w rho A where PPO's unclipped branch min(rho A, clip(rho, 1 - clip, 1 + clip_high) A) is the
    minimum and, for A < 0 with a dual clip, rho <= dual_clip (else the loss is the constant -dual_clip A); else 0."""
    high = clip if clip_high is None else clip_high
    out = []
    for row, a, w, ok in zip(rows, advantages, weights, admitted):
        behavior, mask = _behavior(row), _mask(row)
        coefficients = []
        for t, lp in enumerate(row["logprobs"]):
            rho = math.exp(lp - behavior[t])
            unclipped = rho * a
            clipped = min(max(rho, 1 - clip), 1 + high) * a
            dual_binds = dual_clip is not None and a < 0 and rho > dual_clip
            carries = ok and mask[t] and unclipped <= clipped and not dual_binds
            coefficients.append(w * rho * a if carries else 0.0)
        out.append(coefficients)
    return out


def grpo(rows: Sequence[Row], clip: float = 0.2, loss_type: str = "grpo", truncated: str = "mask",
         max_tokens: int = 1024, beta: float = 0.0, clip_high: float | None = None,
         dual_clip: float | None = None) -> Coefficients:
    """GRPO's group-normalised advantage (sample std + 1e-6), length weight and optional k3 KL gradient."""
    rewards = [0.0 if (truncated == "zero" and r.get("truncated")) else r["reward"] for r in rows]
    admitted = [truncated == "zero" or not r.get("truncated") for r in rows]
    advantages = []
    for i, row in enumerate(rows):
        group = [rewards[j] for j, other in enumerate(rows) if other["task_id"] == row["task_id"] and admitted[j]]
        if not admitted[i] or len(group) < 2 or len(set(group)) == 1:
            advantages.append(0.0)
        elif loss_type == "dr_grpo":
            advantages.append(rewards[i] - statistics.mean(group))
        else:
            advantages.append((rewards[i] - statistics.mean(group)) / (statistics.stdev(group) + 1e-6))
    # bnpo's N: the action tokens that can carry gradient (a masked truncated row's are left out)
    total_tokens = sum(action_tokens(r) for r, ok in zip(rows, admitted) if ok)
    weights = [{"grpo": 1 / (len(rows) * action_tokens(r)), "bnpo": 1 / max(total_tokens, 1),
                "dr_grpo": 1 / (len(rows) * max_tokens)}[loss_type] for r in rows]
    out = surrogate(rows, advantages, weights, admitted, clip, clip_high, dual_clip)
    for i, row in enumerate(rows):
        mask = _mask(row)
        for t in range(len(row["logprobs"])):
            if beta and admitted[i] and mask[t]:
                out[i][t] -= beta * weights[i] * (1 - math.exp(row["ref_logprobs"][t] - row["logprobs"][t]))
    return out


def _per_sequence(rows: Sequence[Row]) -> list[float]:
    return [1 / (len(rows) * action_tokens(r)) for r in rows]


def rloo(rows: Sequence[Row], clip: float = 0.2, clip_high: float | None = None,
         dual_clip: float | None = None) -> Coefficients:
    """A_i = R_i - mean of the other rollouts of its task (0 alone), GRPO's surrogate with 1/(B T_i)."""
    advantages = []
    for i, row in enumerate(rows):
        others = [o["reward"] for j, o in enumerate(rows) if o["task_id"] == row["task_id"] and j != i]
        advantages.append(row["reward"] - statistics.mean(others) if others else 0.0)
    return surrogate(rows, advantages, _per_sequence(rows), [True] * len(rows), clip, clip_high, dual_clip)


def max_rl(rows: Sequence[Row], clip: float = 0.2, clip_high: float | None = None,
           dual_clip: float | None = None) -> Coefficients:
    """A_i = (R_i - mean) / mean over its task (0 when mean <= 0), GRPO's surrogate with 1/(B T_i)."""
    advantages = []
    for row in rows:
        mean = statistics.mean(o["reward"] for o in rows if o["task_id"] == row["task_id"])
        advantages.append((row["reward"] - mean) / mean if mean > 0 else 0.0)
    return surrogate(rows, advantages, _per_sequence(rows), [True] * len(rows), clip, clip_high, dual_clip)


def rae(rows: Sequence[Row], decay: float = 0.95, clip: float = 0.2,
        baselines: Mapping[Any, float] | None = None, clip_high: float | None = None,
        dual_clip: float | None = None) -> Coefficients:
    """A_i = R_i - b_agent, then b_agent <- decay b + (1 - decay) R_i, in row order."""
    running = dict(baselines or {})
    advantages = []
    for row in rows:
        agent = None if row.get("agent") is None else str(row["agent"])  # labels are strings: 1 and "1" agree
        b = running.get(agent, 0.0)
        advantages.append(row["reward"] - b)
        running[agent] = decay * b + (1 - decay) * row["reward"]
    return surrogate(rows, advantages, _per_sequence(rows), [True] * len(rows), clip, clip_high, dual_clip)


# --------------------------------------------------------------------- the critic methods
def gae(row: Row, alpha: float) -> list[float]:
    """A_k = r_k + V_{k+1} - V_k + lambda A_{k+1} over the action tokens, lambda = max(0, 1 - 1/(alpha L))."""
    mask = _mask(row)
    actions = [t for t, m in enumerate(mask) if m]
    length = len(actions)
    lam = max(0.0, 1 - 1 / (alpha * length))
    advantages = [0.0] * len(mask)
    running = 0.0
    for k in reversed(range(length)):
        value = row["values"][actions[k]]
        next_value = row["values"][actions[k + 1]] if k + 1 < length else 0.0
        reward = row["reward"] if k == length - 1 else 0.0
        running = reward + next_value - value + lam * running
        advantages[actions[k]] = running
    return advantages


def sao(rows: Sequence[Row], band: tuple[float, float] = (0.7, 6.0), alpha: float = 1.5) -> Coefficients:
    """c = rho A / N strictly inside the band, else 0 (Eq. 1-5)."""
    total = sum(action_tokens(r) for r in rows)
    out = []
    for row in rows:
        advantages, behavior, mask = gae(row, alpha), _behavior(row), _mask(row)
        c = []
        for t, m in enumerate(mask):
            rho = math.exp(row["logprobs"][t] - behavior[t])
            c.append(rho * advantages[t] / total if m and band[0] < rho < band[1] else 0.0)
        out.append(c)
    return out


def bpco(rows: Sequence[Row], clip: float = 0.2, alpha: float = 0.4) -> Coefficients:
    """c = rho A / B where DPPO's unclipped branch (clip range 1 +/- clip/mu) is the minimum, else 0."""
    out = []
    for row in rows:
        advantages, behavior, mask = gae(row, alpha), _behavior(row), _mask(row)
        c = []
        for t, m in enumerate(mask):
            mu = math.exp(behavior[t])
            rho = math.exp(row["logprobs"][t] - behavior[t])
            clipped = min(max(rho, 1 - clip / mu), 1 + clip / mu)
            unclipped_is_min = rho * advantages[t] <= clipped * advantages[t]
            c.append(rho * advantages[t] / len(rows) if m and unclipped_is_min else 0.0)
        out.append(c)
    return out


# --------------------------------------------------------------------- Async corrections
def async_correction(rows: Sequence[Row], inner: Coefficients, correction: str, threshold: float = 0.3,
                     band: tuple[float, float] = (0.5, 5.0), max_ratio: float = 2.0) -> Coefficients:
    """The wrapped method's c times ipo's, icepop's or tis's per-token factor."""
    out = []
    for row, line in zip(rows, inner):
        behavior = _behavior(row)
        corrected = []
        for t, c in enumerate(line):
            lp, blp = row["logprobs"][t], behavior[t]
            rho = math.exp(lp - blp)
            if correction == "ipo":
                factor = 1.0 if abs(math.exp(lp) - math.exp(blp)) <= threshold else 0.0
            elif correction == "icepop":
                factor = 1.0 if band[0] <= rho <= band[1] else 0.0
            else:
                factor = min(rho, max_ratio) / rho
            corrected.append(c * factor)
        out.append(corrected)
    return out


# --------------------------------------------------------------------- supervised and distillation
def sft(rows: Sequence[Row], normalize: str = "sum") -> Coefficients:
    """c = 1 (or 1/N, or 1/(B T_i)) on every action token."""
    total = sum(action_tokens(r) for r in rows)
    out = []
    for row in rows:
        scale = {"sum": 1.0, "token_mean": 1 / total, "sequence_mean": 1 / (len(rows) * action_tokens(row))}
        out.append([scale[normalize] if m else 0.0 for m in _mask(row)])
    return out


def dpo(rows: Sequence[Row], chosen: Sequence[int], rejected: Sequence[int], beta: float = 0.1) -> Coefficients:
    """c = +beta sigmoid(-z) on the chosen row's action tokens, -beta sigmoid(-z) on the rejected row's."""
    def margin(row: Row) -> float:
        return sum(lp - ref for lp, ref, m in zip(row["logprobs"], row["ref_logprobs"], _mask(row)) if m)

    out = [[0.0] * len(r["logprobs"]) for r in rows]
    for w, lose in zip(chosen, rejected):
        z = beta * (margin(rows[w]) - margin(rows[lose]))
        weight = beta / (1.0 + math.exp(z))
        for i, sign in ((w, 1.0), (lose, -1.0)):
            out[i] = [sign * weight if m else 0.0 for m in _mask(rows[i])]
    return out


def rm(rows: Sequence[Row], chosen: Sequence[int], rejected: Sequence[int]) -> Coefficients:
    """c = +-sigmoid(-(r_w - r_l)) on the last token of the chosen / rejected row (where the head reads r)."""
    out = [[0.0] * len(r["logprobs"]) for r in rows]
    for w, lose in zip(chosen, rejected):
        weight = 1.0 / (1.0 + math.exp(rows[w]["score"] - rows[lose]["score"]))
        for i, sign in ((w, 1.0), (lose, -1.0)):
            out[i][-1] = sign * weight
    return out


def _importance(row: Row, t: int, max_ratio: float | None) -> float:
    """min(rho, max_ratio) at token t (rho uncapped when max_ratio is None); 1 without behavior_logprobs."""
    rho = math.exp(row["logprobs"][t] - _behavior(row)[t])
    return rho if max_ratio is None else min(rho, max_ratio)


def opd_topk(rows: Sequence[Row], divergence: str = "reverse_kl",
             max_ratio: float | None = 2.0) -> list[list[list[float]]]:
    """The top-k form, every slot kept: c_v = -p_v (g(p_v, q_v) - g(p_tail, q_tail)), g = df/dp, per token,
    times the token's min(rho, max_ratio).

    p is the student (``topk_logprobs``), q the teacher (``teacher_topk_logprobs``); the tail is the mass
    outside the K slots on each side (floored at 1e-12). One list of K coefficients per token.
    """
    def slope(p: float, q: float) -> float:
        if divergence == "reverse_kl":
            return math.log(p / q) + 1.0
        if divergence == "forward_kl":
            return -q / p
        return 0.5 * math.log(p / ((p + q) / 2))

    out = []
    for row in rows:
        mask, lines = _mask(row), []
        for t, (student, teacher) in enumerate(zip(row["topk_logprobs"], row["teacher_topk_logprobs"])):
            p = [math.exp(x) for x in student]
            q = [math.exp(x) for x in teacher]
            p_tail, q_tail = max(1.0 - sum(p), 1e-12), max(1.0 - sum(q), 1e-12)
            tail = slope(p_tail, q_tail)
            weight = _importance(row, t, max_ratio)
            lines.append([-p[v] * (slope(p[v], q[v]) - tail) * weight if mask[t] else 0.0 for v in range(len(p))])
        out.append(lines)
    return out


def opd(rows: Sequence[Row], max_ratio: float | None = 2.0) -> Coefficients:
    """The sampled-token reverse-KL form: c = min(rho, max_ratio) (log pi_T - log pi) on every action token."""
    out = []
    for row in rows:
        mask = _mask(row)
        out.append([_importance(row, k, max_ratio) * (t - s) if mask[k] else 0.0
                    for k, (s, t) in enumerate(zip(row["logprobs"], row["teacher_logprobs"]))])
    return out
