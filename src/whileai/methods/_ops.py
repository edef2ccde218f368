"""Numeric helpers shared by the grouped and critic methods: groups, the PPO mask, the GAE scan.

Shape suffixes as in ``whileai.rows.batch``: ``_B`` per trajectory, ``_N`` per token of the batch,
``_M`` per action token of the batch (observation tokens removed), ``_G`` per group.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from whileai.errors import BatchError
from whileai.rows.batch import Batch


# --------------------------------------------------------------------- groups
@dataclass(frozen=True)
class Groups:
    """Trajectories grouped by a per-row key (task_id for GRPO-style methods, agent for RAE)."""

    index_B: np.ndarray  # group number of each trajectory, 0..n-1 in order of first appearance
    keys_G: list[Hashable]  # the key of each group

    @property
    def count(self) -> int:
        return len(self.keys_G)

    @property
    def sizes_G(self) -> np.ndarray:
        return np.bincount(self.index_B, minlength=self.count)


def group_by(keys_B: np.ndarray, field: str) -> Groups:
    """Number the distinct keys in order of first appearance; an unhashable key is a ``BatchError``."""
    numbers: dict[Hashable, int] = {}
    index_B = np.empty(len(keys_B), dtype=np.int64)
    for i, key in enumerate(keys_B):
        try:
            index_B[i] = numbers.setdefault(key, len(numbers))
        except TypeError:
            raise BatchError(f"row {i}: field {field!r} is {key!r} ({type(key).__name__}); it must be a string "
                             f"or a number so rows can be grouped by it.") from None
    return Groups(index_B, list(numbers))


@dataclass(frozen=True)
class GroupStats:
    """Per-group statistics over the included trajectories of each group."""

    count_G: np.ndarray  # included trajectories per group
    mean_G: np.ndarray  # 0 for a group with nothing included
    std_G: np.ndarray  # sample std (n - 1); 0 for a group of fewer than two
    unanimous_G: np.ndarray  # every included reward identical (true for groups of 0 or 1)


def group_stats(values_B: np.ndarray, groups: Groups, include_B: np.ndarray) -> GroupStats:
    """Mean, sample standard deviation (n - 1, as TRL and verl) and unanimity per group."""
    g, n = groups.index_B, groups.count
    weight_B = include_B.astype(np.float64)
    count_G = np.bincount(g, weights=weight_B, minlength=n)
    mean_G = np.bincount(g, weights=values_B * weight_B, minlength=n) / np.maximum(count_G, 1.0)
    squares_G = np.bincount(g, weights=weight_B * (values_B - mean_G[g]) ** 2, minlength=n)
    std_G = np.sqrt(np.where(count_G > 1, squares_G / np.maximum(count_G - 1.0, 1.0), 0.0))
    high_G = np.full(n, -np.inf)
    low_G = np.full(n, np.inf)
    np.maximum.at(high_G, g[include_B], values_B[include_B])
    np.minimum.at(low_G, g[include_B], values_B[include_B])
    unanimous_G = (count_G < 2) | (high_G == low_G)
    return GroupStats(count_G, mean_G, std_G, unanimous_G)


# --------------------------------------------------------------------- PPO's clipped surrogate
def unclipped_is_min(ratio_N: np.ndarray, advantage_N: np.ndarray, low: np.ndarray | float,
                     high: np.ndarray | float) -> np.ndarray:
    """True where min(rho*A, clip(rho, low, high)*A) takes the unclipped branch (ties count as unclipped).

    For A > 0 that is rho <= high, for A < 0 rho >= low, and always for A = 0 (both branches are 0).
    There the surrogate's gradient with respect to log pi is rho*A; elsewhere the clipped branch is a
    constant in theta and the token carries 0. ``advantage_N`` may be the advantages or anything with
    their signs.
    """
    clipped_N = (advantage_N > 0) & (ratio_N > high)
    clipped_N |= (advantage_N < 0) & (ratio_N < low)
    return ~clipped_N


# --------------------------------------------------------------------- the GAE scan
def adaptive_lambda(action_tokens_B: np.ndarray, gae_alpha: float) -> np.ndarray:
    """lambda = 1 - 1/(gae_alpha * L), floored at 0 (it is negative only when gae_alpha * L < 1)."""
    return np.maximum(0.0, 1.0 - 1.0 / (gae_alpha * action_tokens_B))


def reverse_scan(delta_M: np.ndarray, lengths_B: np.ndarray, decay_B: np.ndarray) -> np.ndarray:
    """A_k = delta_k + decay * A_{k+1} inside each segment (segments of ``lengths_B`` laid end to end).

    Two exact, vectorised layouts: a padded one in chunks (fast when lengths are alike, as in a batch
    cut at one token budget) and a step-per-depth one that never pads (for ragged batches, and for
    one very long segment among short ones). Both are checked against a per-token loop in the tests.
    """
    if len(lengths_B) == 0 or int(lengths_B.sum()) == 0:
        return np.zeros(0)
    padded = len(lengths_B) * (-(-int(lengths_B.max()) // SCAN_CHUNK) * SCAN_CHUNK)
    if padded <= 1.5 * int(lengths_B.sum()):
        return scan_padded(delta_M, lengths_B, decay_B)
    return scan_by_depth(delta_M, lengths_B, decay_B)


SCAN_CHUNK = 16


def scan_padded(delta_M: np.ndarray, lengths_B: np.ndarray, decay_B: np.ndarray) -> np.ndarray:
    """The scan on a (B, C, K) right-aligned, zero-padded layout: K-token chunks in one batched matmul
    with the matrix of decay powers (decay^(j-k), j >= k; never a negative power, so no overflow),
    then C sequential (B,)-sized steps for the chunks' first values, and one pass carrying each into
    the chunk before it."""
    count, k = len(lengths_B), SCAN_CHUNK
    chunks = -(-int(lengths_B.max()) // k)
    width = chunks * k
    if np.all(lengths_B == width):
        where = None
        grid = delta_M.reshape(count, chunks, k)
    else:  # right-aligned rows: a boolean mask fills row by row, left to right, i.e. in token order
        where = np.arange(width)[None, :] >= (width - lengths_B)[:, None]
        flat = np.zeros((count, width))
        flat[where] = delta_M
        grid = flat.reshape(count, chunks, k)
    j = np.arange(k + 1)
    powers = decay_B.astype(np.float64)[:, None] ** j[None, :]  # (B, K + 1): decay^0 .. decay^K
    gap = j[:k, None] - j[None, :k]  # source j minus target k
    within = powers[:, np.maximum(gap, 0)] * (gap >= 0)  # (B, K, K)
    out = np.matmul(grid, within)  # each chunk's scan as if nothing followed it
    # the true value at each chunk's first token: first_c += decay^K first_{c+1}, one (B,) step per chunk
    first = np.ascontiguousarray(out[:, :, 0].T)  # (C, B)
    step = powers[:, k]
    for c in range(chunks - 2, -1, -1):
        first[c] += step * first[c + 1]
    # every token then gets decay^(K - k) times the true first value of the chunk after it
    carry = powers[:, k - j[:k]]  # (B, K): decay^(K - k)
    out[:, :-1, :] += carry[:, None, :] * first[1:].T[:, :, None]
    return out.reshape(-1) if where is None else out.reshape(count, width)[where]


def scan_by_depth(delta_M: np.ndarray, lengths_B: np.ndarray, decay_B: np.ndarray) -> np.ndarray:
    """The scan with no padding: step d updates, in one numpy call, the token d places before the end
    of every segment longer than d (segments ranked longest first, so those are a prefix of the
    ranking). O(total) work in O(longest) numpy steps; one long segment costs no memory."""
    total = int(lengths_B.sum())
    out = np.empty(total)
    order = np.argsort(-lengths_B, kind="stable")
    sorted_lengths = lengths_B[order]
    # n_D[d]: segments with length > d
    n_D = np.searchsorted(-sorted_lengths, -np.arange(int(sorted_lengths[0])), side="left")
    ends = (np.cumsum(lengths_B) - 1)[order]
    decay = decay_B[order].astype(np.float64)
    out[ends] = delta_M[ends]
    for d in range(1, len(n_D)):
        n = n_D[d]
        at = ends[:n] - d
        out[at] = delta_M[at] + decay[:n] * out[at + 1]
    return out


def gae_advantages(batch: Batch, values_N: np.ndarray, gae_alpha: float) -> np.ndarray:
    """Length-adaptive GAE over each trajectory's action tokens (gamma = 1); 0 on observation tokens.

    With L action tokens in order, r_k = R on the last and 0 before, V_k the row's value at the k-th
    action token and V = 0 past the end: delta_k = r_k + V_{k+1} - V_k and A_k = delta_k + lambda A_{k+1},
    lambda = 1 - 1/(gae_alpha * L). The bootstrap V_{k+1} is the next *action* token, so an observation
    token between two actions is skipped, not scored.
    """
    action_N = batch.action_mask_N
    positions_M = np.flatnonzero(action_N)
    lengths_B = batch.action_tokens_B
    last_M = np.cumsum(lengths_B) - 1  # index of each trajectory's last action token in the _M layout
    value_M = values_N[positions_M]
    next_value_M = np.empty_like(value_M)
    next_value_M[:-1] = value_M[1:]
    next_value_M[last_M] = 0.0
    delta_M = next_value_M - value_M
    delta_M[last_M] += batch.rewards_B
    advantage_M = reverse_scan(delta_M, lengths_B, adaptive_lambda(lengths_B, gae_alpha))
    advantage_N = np.zeros(len(action_N))
    advantage_N[positions_M] = advantage_M
    return advantage_N


def no_behavior_note(batch: Batch, correction: str) -> list[str]:
    """A note when rows carry no ``behavior_logprobs``, so ``correction`` (what acts on the sampler's drift)
    had nothing to act on: such a row counts as on-policy (rho = 1), and a drift of 0 is assumed, not measured."""
    if batch.rows:
        lacking = np.array([i for i, row in enumerate(batch.rows) if "behavior_logprobs" not in row], dtype=np.int64)
    else:
        lacking = np.arange(0 if "behavior_logprobs" in batch.token_fields else batch.size)
    if not lacking.size:
        return []
    fix = ("if they were sampled by older weights or another engine, add the sampler's log-probabilities to every "
           "row as behavior_logprobs")
    if lacking.size == batch.size:
        return [f"no row carries behavior_logprobs, so every token counts as on-policy (rho = 1) and {correction} "
                f"had nothing to act on; {fix}"]
    shown = ", ".join(str(int(i)) for i in lacking[:8]) + (", ..." if lacking.size > 8 else "")
    return [f"{lacking.size} of {batch.size} trajectories ({shown}) carry no behavior_logprobs and count as on-policy "
            f"(rho = 1), so {correction} did not act on them; {fix}"]


def agree(n: int, one: str, many: str) -> str:
    """The verb form for a count: agree(1, "was", "were") -> "was"."""
    return one if n == 1 else many


def far_outside(ratio: np.ndarray, low: np.ndarray | float, high: np.ndarray | float) -> tuple[int, float]:
    """Among ratios outside [low, high], the index of the furthest (in log distance) and that factor."""
    low_arr = np.broadcast_to(np.asarray(low, dtype=np.float64), ratio.shape)
    high_arr = np.broadcast_to(np.asarray(high, dtype=np.float64), ratio.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        below = np.where(ratio < low_arr, low_arr / np.maximum(ratio, 1e-300), 1.0)
        above = np.where(ratio > high_arr, ratio / np.maximum(high_arr, 1e-300), 1.0)
    factor = np.maximum(below, above)
    k = int(np.argmax(factor))
    return k, float(factor[k])
