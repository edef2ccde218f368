"""SFT, DPO and a Bradley-Terry reward model, written as per-token (or per-row) coefficients.

All three use the library's one loss, ``L = -sum c * x``, with ``c`` held constant:

- **SFT** (maximum likelihood, the methods reference's ``L_SFT``): ``x = log pi`` and ``c = 1`` on every
  action token. The reference writes a plain sum, so ``normalize="sum"`` is the default and puts no
  normalizer in ``c``; ``"token_mean"`` (``1/N``) and ``"sequence_mean"`` (``1/(B T_i)``) are there for
  a trainer tuned for a mean.
- **DPO** (Rafailov et al. 2023, arXiv:2305.18290, Eq. 7): for a pass ``w`` and a fail ``l`` of one
  prompt, ``z = beta [(sum log pi - sum log ref)_w - (sum log pi - sum log ref)_l]`` (sums over action
  tokens) and ``L = -log sigmoid(z)``. Since ``dL/d log pi = -beta sigmoid(-z)`` on every chosen token,
  ``c = +beta sigmoid(-z)`` on the chosen tokens and ``-beta sigmoid(-z)`` on the rejected ones. Pairs
  are summed, not averaged (the paper averages over its batch; divide the learning rate by the number of
  pairs to match it): a sum keeps a split batch's gradients adding up to the whole batch's.
- **RM** (Bradley-Terry, Ouyang et al. 2022, arXiv:2203.02155, Eq. 1): ``L = -log sigmoid(r_w - r_l)``
  on the scalar head's scores. Here ``x`` is the score ``r``, not a log-probability: the coefficient is
  ``c = -dL/dr``, i.e. ``+sigmoid(-(r_w - r_l))`` for the chosen row and ``-sigmoid(-(r_w - r_l))`` for
  the rejected one. It is placed on the **last token** of each row, whoever wrote it (the position a
  transformers sequence-classification head reads: the last non-pad token), and is 0 on every other
  token; a trainer runs ``-sum c * r`` on that position. The action mask does not move it: a row that
  ends on environment tokens is scored, and trained, where the head reads it.

Pairs (DPO, RM): rows that carry ``"pair"`` (any id) and ``"chosen"`` (bool) are paired explicitly, two
rows per id, one chosen. Otherwise rows are paired within a ``task_id``: passes (``reward >=
pass_reward``) against fails, each pass (shortest first) taking the unused fail nearest to it in action
length, as ``select(mode="dpo")`` length-matches. A row left without a partner gets ``c = 0``, is not
admitted, and a note names it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from whileai.errors import BatchError
from whileai.methods.base import Method, Update, knob, plural, trajectory_list
from whileai.rows.batch import Batch


# --------------------------------------------------------------------- shared helpers
def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), computed without overflow for large |x|."""
    return np.exp(-np.logaddexp(0.0, -x))


def log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def mean_ratio(batch: Batch, admitted_B: np.ndarray) -> float:
    """Mean rho over the admitted trajectories' action tokens (all action tokens when none is admitted)."""
    if "behavior_logprobs" not in batch.token_fields:
        return 1.0  # every row on-policy: rho = 1 on every token
    return batch.action_mean(batch.ratio_N, admitted_B if admitted_B.any() else None)


@dataclass(frozen=True)
class Pairs:
    """Chosen/rejected row indices, pair by pair, and the rows left without a partner."""

    chosen: np.ndarray
    rejected: np.ndarray
    unpaired: np.ndarray
    reason: str = ""


def pair_rows(batch: Batch, pass_reward: float, method: str) -> Pairs:
    """Explicit pairs when rows carry 'pair', else passes against fails of one task_id, length matched."""
    if any("pair" in row for row in batch.rows):
        return _explicit_pairs(batch, method)
    task_ids = batch.row_field("task_id", method, "pairs are a pass and a fail of the same prompt (or give "
                               "every row 'pair' and 'chosen')")
    lengths = batch.action_tokens_B
    by_task: dict[Hashable, list[int]] = defaultdict(list)
    for i, task in enumerate(task_ids):
        by_task[task].append(i)
    chosen, rejected, unpaired = [], [], []
    for rows in by_task.values():
        passes = sorted((i for i in rows if batch.rewards_B[i] >= pass_reward), key=lambda i: (lengths[i], i))
        fails = [i for i in rows if batch.rewards_B[i] < pass_reward]
        for w in passes:
            if not fails:
                unpaired.append(w)
                continue
            best = min(fails, key=lambda j: (abs(int(lengths[j]) - int(lengths[w])), j))
            fails.remove(best)
            chosen.append(w)
            rejected.append(best)
        unpaired += fails
    reason = (f"its task has no row on the other side of pass_reward={pass_reward:g}: sample more rollouts per "
              "task so each has a pass and a fail, or give rows explicit 'pair' and 'chosen' fields")
    return Pairs(np.array(chosen, dtype=np.int64), np.array(rejected, dtype=np.int64),
                 np.array(sorted(unpaired), dtype=np.int64), reason)


def _explicit_pairs(batch: Batch, method: str) -> Pairs:
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, row in enumerate(batch.rows):
        if "pair" not in row or not isinstance(row.get("chosen"), bool):
            raise BatchError(f"row {i}: {method} found 'pair' on other rows, so every row needs 'pair' (an id "
                             "shared by two rows) and 'chosen' (true or false); got "
                             f"pair={row.get('pair')!r}, chosen={row.get('chosen')!r}.")
        members[row["pair"]].append(i)
    chosen, rejected = [], []
    for pair, rows in members.items():
        flags = [batch.rows[i]["chosen"] for i in rows]
        if len(rows) != 2 or flags.count(True) != 1:
            raise BatchError(f"row {rows[0]}: pair {pair!r} has {len(rows)} rows with chosen={flags}; a pair is "
                             "exactly two rows, one with chosen=true and one with chosen=false.")
        chosen.append(rows[flags.index(True)])
        rejected.append(rows[flags.index(False)])
    empty = np.zeros(0, dtype=np.int64)
    return Pairs(np.array(chosen, dtype=np.int64), np.array(rejected, dtype=np.int64), empty)


def pair_notes(pairs: Pairs, size: int) -> list[str]:
    if not pairs.unpaired.size:
        return []
    n = pairs.unpaired.size
    return [f"{plural(n, 'trajectory', 'trajectories')} {trajectory_list(pairs.unpaired)} of {size} "
            f"left unpaired, c = 0: {pairs.reason}"]


def pair_stats(batch: Batch, admitted_B: np.ndarray, margin_P: np.ndarray) -> dict[str, float]:
    """The common stats plus pairs, mean margin, preference accuracy and mean loss."""
    has = margin_P.size > 0
    return {
        "batch_mean_reward": float(batch.rewards_B.mean()),
        "admitted_share": float(admitted_B.mean()),
        "mean_ratio": mean_ratio(batch, admitted_B),
        "pairs": float(margin_P.size),
        "mean_margin": float(margin_P.mean()) if has else 0.0,
        "preference_accuracy": float((margin_P > 0).mean()) if has else 0.0,
        "mean_loss": float(-log_sigmoid(margin_P).mean()) if has else 0.0,
    }


# --------------------------------------------------------------------- SFT
@dataclass(frozen=True)
class SFT(Method):
    """Maximum likelihood on the rows as given: c = 1 on every action token (methods reference, L_SFT).

    The trainer does not filter on reward: pass only the rows to imitate (for example the passes).
    """

    name = "sft"

    normalize: str = knob()

    run_settings = {"source": "rows"}

    def _update(self, batch: Batch) -> Update:
        if self.normalize == "token_mean":
            scale_B = np.full(batch.size, 1.0 / batch.action_tokens_B.sum())
        elif self.normalize == "sequence_mean":
            scale_B = 1.0 / (batch.action_tokens_B * batch.size)
        else:
            scale_B = np.ones(batch.size)
        coefficients_N = batch.spread(scale_B)
        coefficients_N *= batch.action_weight_N
        admitted_B = np.ones(batch.size, dtype=bool)
        stats = {
            "batch_mean_reward": float(batch.rewards_B.mean()),
            "admitted_share": 1.0,
            "mean_ratio": mean_ratio(batch, admitted_B),
            "action_tokens": float(batch.action_count),
        }
        return Update(self.name, batch.split(coefficients_N), batch.split(batch.action_weight_N.copy()),
                      admitted_B, stats, self._notes(batch))

    def _notes(self, batch: Batch) -> list[str]:
        if np.ptp(batch.rewards_B) == 0:
            return []
        low = np.flatnonzero(batch.rewards_B < batch.rewards_B.max())
        return [f"{plural(low.size, 'trajectory', 'trajectories')} {trajectory_list(low)} scored below the batch's "
                f"best ({batch.rewards_B.max():g}) and are imitated all the same: SFT does not filter on reward, "
                "so pass only the rows to copy (e.g. the passes)"]


# --------------------------------------------------------------------- DPO
@dataclass(frozen=True)
class DPO(Method):
    """Direct preference optimization on pass/fail pairs (Rafailov et al. 2023, arXiv:2305.18290, Eq. 7).

    ``c = +beta sigmoid(-z)`` on the chosen row's action tokens, ``-beta sigmoid(-z)`` on the rejected
    row's, with ``z`` the policy-minus-reference margin times ``beta``. Pairs are summed (the paper
    averages over a batch). Differs from the paper: nothing else; pairs are formed from graded rows
    (a pass and a fail of one task_id, length matched) rather than from human labels.
    """

    name = "dpo"
    requires = {"ref_logprobs": "z is the policy's log-ratio to the frozen reference, summed over each row"}

    beta: float = knob()
    pass_reward: float = knob()

    run_settings = {"needs": ("ref_logprobs",), "source": "rows"}

    def _update(self, batch: Batch) -> Update:
        pairs = pair_rows(batch, self.pass_reward, self.name)
        policy_minus_ref_N = np.subtract(batch.logprobs_N, batch.token_fields["ref_logprobs"])
        policy_minus_ref_N *= batch.action_weight_N
        log_ratio_B = batch.per_row_sum(policy_minus_ref_N)
        margin_P = self.beta * (log_ratio_B[pairs.chosen] - log_ratio_B[pairs.rejected])
        weight_P = self.beta * sigmoid(-margin_P)
        scale_B = np.zeros(batch.size)
        scale_B[pairs.chosen] = weight_P
        scale_B[pairs.rejected] = -weight_P
        admitted_B = np.zeros(batch.size, dtype=bool)
        admitted_B[pairs.chosen] = admitted_B[pairs.rejected] = True
        coefficients_N = batch.spread(scale_B)
        coefficients_N *= batch.action_weight_N
        return Update(self.name, batch.split(coefficients_N), batch.split(coefficients_N.copy()), admitted_B,
                      pair_stats(batch, admitted_B, margin_P), pair_notes(pairs, batch.size))


# --------------------------------------------------------------------- RM
@dataclass(frozen=True)
class RM(Method):
    """A Bradley-Terry reward model on scalar scores (Ouyang et al. 2022, arXiv:2203.02155, Eq. 1).

    Every row carries ``score``, the head's output r for that trajectory. The coefficient is
    ``-dL/dr``, ``+sigmoid(-(r_w - r_l))`` on the chosen row and its negative on the rejected row,
    placed on the row's last token (the position a transformers classification head reads, the last
    non-pad token, even when the environment wrote it) and 0 elsewhere; the trainer runs ``-sum c * r``
    there, and ``score`` must be the head's output at that same position. Differs from the paper:
    InstructGPT ranks K responses per prompt and averages the C(K, 2) pairs; we train on disjoint
    pass/fail pairs, summed.
    """

    name = "rm"

    pass_reward: float = knob()

    run_settings = {"source": "rows", "head": "score"}

    def _update(self, batch: Batch) -> Update:
        scores_B = _scores(batch, self.name)
        pairs = pair_rows(batch, self.pass_reward, self.name)
        margin_P = scores_B[pairs.chosen] - scores_B[pairs.rejected]
        weight_P = sigmoid(-margin_P)
        scale_B = np.zeros(batch.size)
        scale_B[pairs.chosen] = weight_P
        scale_B[pairs.rejected] = -weight_P
        admitted_B = np.zeros(batch.size, dtype=bool)
        admitted_B[pairs.chosen] = admitted_B[pairs.rejected] = True
        coefficients_N = np.zeros(len(batch.logprobs_N))
        coefficients_N[batch.offsets[1:] - 1] = scale_B  # each row's last token: where the head reads r
        return Update(self.name, batch.split(coefficients_N), batch.split(coefficients_N.copy()), admitted_B,
                      pair_stats(batch, admitted_B, margin_P), pair_notes(pairs, batch.size))


def _scores(batch: Batch, method: str) -> np.ndarray:
    scores = []
    for i, row in enumerate(batch.rows):
        score = row.get("score")
        if "score" not in row:
            lacking = sum("score" not in r for r in batch.rows)
            raise BatchError(f"row {i}: field 'score' is missing ({lacking} of {len(batch.rows)} rows lack it); "
                             f"{method} needs the reward head's scalar output for each trajectory. Score every row "
                             "with the head first and add it as 'score'.")
        if isinstance(score, bool) or not isinstance(score, (int, float, np.integer, np.floating)) \
                or not np.isfinite(float(score)):
            raise BatchError(f"row {i}: field 'score' is {score!r}; {method} needs a finite number per row, the "
                             "reward head's scalar output for that trajectory. Score every row with the head first.")
        scores.append(float(score))
    return np.asarray(scores)
