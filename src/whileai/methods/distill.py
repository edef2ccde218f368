"""On-policy distillation (OPD) and on-policy self-distillation (OPSD) as per-token coefficients.

The student samples its own reply; a teacher scores each of its tokens. Two forms, chosen by the rows:

**Sampled-token form** (rows carry ``teacher_logprobs``, one per token). With ``l = log pi_theta`` and
``t = log pi_T`` at the sampled token, ``c`` is the single-sample policy-gradient estimate of the
divergence's gradient (``E_{v ~ pi_theta}[c_v grad l_v] = -grad D``):

    reverse_kl   c = t - l                          (the methods reference; Thinking Machines 2025)
    forward_kl   c = exp(t - l)                     (importance weight pi_T / pi_theta)
    jsd          c = 0.5 log(m / p),  m = (p + q)/2,  p = e^l, q = e^t

**Top-k form** (rows carry ``teacher_topk_tokens`` and ``teacher_topk_logprobs``, each ``(T_i, K)``, and
``topk_logprobs``, the student's log-probabilities of those same K tokens). Per position the categories
are the teacher's top-k slots v plus one *tail*, the mass outside them (``p_tail = 1 - sum_v p_v``,
``q_tail = 1 - sum_v q_v``). The loss is the divergence over these k + 1 categories,
``L = sum_v f(p_v, q_v) + f(p_tail, q_tail)``, and ``c`` is exactly ``-dL/d log pi_theta(v)``, one
coefficient per slot. With ``g = df/dp``, ``c_v = -p_v (g(p_v, q_v) - g(p_tail, q_tail))``:

    reverse_kl   f = p log(p/q)         c_v = p_v (t_v - l_v + log p_tail - log q_tail)
    forward_kl   f = q log(q/p)         c_v = q_v - p_v q_tail / p_tail
    jsd          f = (q log(q/m) + p log(p/m)) / 2      c_v = p_v (log(m_v/p_v) - log(m_tail/p_tail)) / 2

``Update.coefficients[i]`` then has shape ``(T_i, K)`` and its targets are the row's
``teacher_topk_tokens``. When the slots cover the vocabulary both tails are 0 (floored at 1e-12) and
this is the full divergence. Where we differ from the methods reference: its ``L_OPD`` sums only the
top-k terms; that sum is smallest at ``pi_theta = pi_T / e`` on the slots (it rewards moving mass off
the teacher's top-k), and on the toy policy it stalled at reward 0.33 where the tail form reaches 0.85
(docs/decisions.md). The tail term makes it a proper divergence with its minimum at ``pi_theta = pi_T``.
Where a row carries more than ``top_k`` slots, the ``top_k`` with the highest teacher log-probability
are kept and the rest get ``c = 0`` (their mass joins the tail).

**A stale sampler** (rows carry ``behavior_logprobs`` from older weights): the rules above are the
gradient at the current policy for tokens the current policy drew. Tokens drawn by the sampler are
re-weighted by the importance ratio ``rho = exp(logprobs - behavior_logprobs)``, capped: every c of a
position (each slot in the top-k form) is multiplied by ``min(rho, max_ratio)`` (``max_ratio=None``: by
``rho`` uncapped). This is TRL's self-distillation rule (SDFT / SDPO: the per-token loss times
``min(rho, distillation_is_clip = 2)``, the ratio held constant). tinker-cookbook's on-policy distillation
trains with ``importance_sampling``, rho uncapped, on the advantage ``t - behavior_logprobs``; with
``max_ratio=None`` ours is that loss with the advantage read at the current policy (``t - l``), the
same number at lag 0. With no ``behavior_logprobs`` (or equal ones) rho = 1 and nothing changes.

No normalizer (the reference's ``L_OPD`` is a plain sum), no reward, no group. Environment tokens get 0.
Differs from the papers: OPD papers (Agarwal et al. 2023, arXiv:2306.13649; Li et al. 2026,
arXiv:2604.13016) average over tokens; divide the learning rate by the token count to match them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from whileai.endpoints import Endpoint
from whileai.errors import BatchError
from whileai.methods._ops import agree
from whileai.methods.base import SampledPerPrompt, Update, knob, plural, trajectory_list
from whileai.methods.run_spec import TeacherSpec
from whileai.methods.supervised import mean_ratio
from whileai.rows.batch import TOPK_FIELDS, Batch

# What a loop fills for both methods: the teacher's score of each sampled token (the gap the stats report) and
# its top-k slots with the student's log-probabilities on them (the top-k form the update then uses).
TEACHER_NEEDS = ("teacher_logprobs", "teacher_topk")

# What the top-k form reads from every row, each of shape (tokens, K) (validated by the batch contract).
TOPK_NEEDS: dict[str, str] = {
    "teacher_topk_tokens": "the top-k form trains on the teacher's top-k token ids (or drop every top-k field to "
                           "use the sampled-token form with 'teacher_logprobs')",
    "teacher_topk_logprobs": "the teacher's log-probability of each of its top-k tokens",
    "topk_logprobs": "the student's log-probability of each of the teacher's top-k tokens (or drop every top-k "
                     "field to use the sampled-token form with 'teacher_logprobs')",
}


# --------------------------------------------------------------------- coefficient rules
def sampled_coefficients(divergence: str, student_N: np.ndarray, teacher_N: np.ndarray) -> np.ndarray:
    """Single-sample c at the sampled token (see the module docstring)."""
    gap = teacher_N - student_N
    if divergence == "reverse_kl":
        return gap
    if divergence == "forward_kl":
        return np.exp(gap)
    return 0.5 * (np.logaddexp(0.0, gap) - np.log(2.0))  # log(m/p) = log((1 + q/p) / 2)


TAIL_FLOOR = 1e-12  # a tail mass below this (on either side) counts as this: the slots cover the vocabulary


def _category_loss(divergence: str, log_p: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    """f(p, q) of one category: the divergence is the sum of f over the slots and the tail."""
    p, q = np.exp(log_p), np.exp(log_q)
    if divergence == "reverse_kl":
        return p * (log_p - log_q)
    if divergence == "forward_kl":
        return q * (log_q - log_p)
    log_m = np.logaddexp(log_p, log_q) - np.log(2.0)
    return 0.5 * (q * (log_q - log_m) + p * (log_p - log_m))


def _category_slope(divergence: str, log_p: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    """g = df/dp of one category."""
    if divergence == "reverse_kl":
        return log_p - log_q + 1.0
    if divergence == "forward_kl":
        return -np.exp(log_q - log_p)
    return 0.5 * (log_p - (np.logaddexp(log_p, log_q) - np.log(2.0)))


def topk_coefficients(divergence: str, student_NK: np.ndarray, teacher_NK: np.ndarray,
                      keep_NK: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-slot c = -dL/d log pi(v) over the kept slots plus the tail, and the per-position divergence.

    Categories are the kept slots and one tail (the mass outside them, 1 - sum p and 1 - sum q).
    With g = df/dp per category, c_v = -p_v (g_v - g_tail); 0 on slots not kept.
    """
    tail_p = np.log(np.maximum(1.0 - np.where(keep_NK, np.exp(student_NK), 0.0).sum(axis=1), TAIL_FLOOR))
    tail_q = np.log(np.maximum(1.0 - np.where(keep_NK, np.exp(teacher_NK), 0.0).sum(axis=1), TAIL_FLOOR))
    slope_NK = _category_slope(divergence, student_NK, teacher_NK)
    tail_slope_N = _category_slope(divergence, tail_p, tail_q)
    coefficients_NK = np.where(keep_NK, -np.exp(student_NK) * (slope_NK - tail_slope_N[:, None]), 0.0)
    loss_N = np.where(keep_NK, _category_loss(divergence, student_NK, teacher_NK), 0.0).sum(axis=1)
    return coefficients_NK, loss_N + _category_loss(divergence, tail_p, tail_q)


def keep_top(teacher_NK: np.ndarray, top_k: int) -> np.ndarray:
    """Bool (N, K): the top_k slots of each position by teacher log-probability (all when K <= top_k)."""
    n, k = teacher_NK.shape
    if k <= top_k:
        return np.ones((n, k), dtype=bool)
    order = np.argsort(-teacher_NK, axis=1, kind="stable")[:, :top_k]
    keep = np.zeros((n, k), dtype=bool)
    np.put_along_axis(keep, order, True, axis=1)
    return keep


# --------------------------------------------------------------------- the shared update
@dataclass(frozen=True)
class _Distill(SampledPerPrompt):
    """Shared update of OPD and OPSD (fields top_k and divergence come from the subclass)."""

    run_settings = {"max_lag": None}

    def _update(self, batch: Batch) -> Update:
        if self._loss != "cross_entropy":
            return self._named_update(batch)
        update = self._divergence_update(batch)
        if self._kl_coef != 1.0:
            update.coefficients = [c * self._kl_coef for c in update.coefficients]
        if "behavior_logprobs" not in batch.token_fields:
            return update  # on-policy rows: rho = 1 on every token
        weight_N, capped_N = self._importance_weights(batch)
        update.coefficients = [c * w.reshape(w.shape + (1,) * (c.ndim - 1))
                               for c, w in zip(update.coefficients, batch.split(weight_N))]
        update.stats["capped_token_share"] = float(np.count_nonzero(capped_N) / batch.action_count)
        update.notes += self._capped_note(batch, capped_N)
        return update

    def _importance_weights(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """min(rho, max_ratio) per token (rho when max_ratio is None), and the action tokens the cap bound."""
        ratio_N = batch.ratio_N
        cap = self._max_ratio
        if cap is None:
            return ratio_N, np.zeros(len(ratio_N), dtype=bool)
        return np.minimum(ratio_N, cap), batch.action_mask_N & (ratio_N > cap)

    def _capped_note(self, batch: Batch, capped_N: np.ndarray) -> list[str]:
        if not capped_N.any():
            return []
        where = np.flatnonzero(capped_N)
        rows = np.unique(batch.row_index_N[where])
        return [f"{plural(where.size, 'action token')} in {plural(rows.size, 'trajectory', 'trajectories')} "
                f"{trajectory_list(rows)} had a ratio above max_ratio={self._max_ratio:g} (largest "
                f"{batch.ratio_N[where].max():.3g}) and {agree(where.size, 'was', 'were')} weighted "
                f"{self._max_ratio:g}: the sampler lags the student; sample fresher rollouts, or raise max_ratio"]

    def _divergence_update(self, batch: Batch) -> Update:
        """The on-policy coefficients (module docstring), before the importance weight."""
        mask = batch.action_mask_N
        admitted_B = np.ones(batch.size, dtype=bool)
        stats = {"batch_mean_reward": float(batch.rewards_B.mean()), "admitted_share": 1.0,
                 "mean_ratio": mean_ratio(batch, admitted_B)}
        if "teacher_logprobs" in batch.token_fields:
            gap_N = np.subtract(batch.token_fields["teacher_logprobs"], batch.logprobs_N)
            gap_N *= batch.action_weight_N
            stats["mean_teacher_gap"] = float(gap_N.sum() / batch.action_count)
        if any(batch.has(name) for name in TOPK_FIELDS):
            return self._topk_update(batch, admitted_B, stats)
        batch.require("teacher_logprobs", self.name, "the teacher's log-probability of each sampled token (or "
                      "give teacher_topk_tokens, teacher_topk_logprobs and topk_logprobs)")
        if self._divergence == "reverse_kl":
            coefficients_N = gap_N  # c = log pi_T - log pi, already 0 off action tokens
        else:
            coefficients_N = np.where(mask, sampled_coefficients(self._divergence, batch.logprobs_N,
                                                                 batch.token_fields["teacher_logprobs"]), 0.0)
        notes = [] if mask.all() else [f"{int((~mask).sum())} environment tokens carry c = 0 (action_mask false)"]
        return Update(self.name, batch.split(coefficients_N), batch.split(gap_N), admitted_B, stats, notes)

    def _topk_update(self, batch: Batch, admitted_B: np.ndarray, stats: dict[str, float]) -> Update:
        for name, why in TOPK_NEEDS.items():
            batch.require(name, self.name, why)
        teacher_NK = batch.topk_fields["teacher_topk_logprobs"]
        student_NK = batch.topk_fields["topk_logprobs"]
        keep_NK = keep_top(teacher_NK, self._top_k) & batch.action_mask_N[:, None]
        coefficients_NK, divergence_N = topk_coefficients(self._divergence, student_NK, teacher_NK, keep_NK)
        stats["mean_divergence"] = float(divergence_N[batch.action_mask_N].mean())
        note = (f"top-k form: {teacher_NK.shape[1]} teacher slots per position ({min(teacher_NK.shape[1], self._top_k)}"
                " kept); coefficients are (tokens, K) and their targets are the rows' teacher_topk_tokens")
        return Update(self.name, batch.split(coefficients_NK), batch.split(-divergence_N * batch.action_mask_N),
                      admitted_B, stats, [note])

    def _named_update(self, batch: Batch) -> Update:
        """The service form (tinker-cookbook's on-policy distillation): a = kl_coef (teacher - behavior_logprobs)
        on every action token through ``importance_sampling``; c = rho a, rho uncapped."""
        if any(batch.has(name) for name in TOPK_FIELDS):
            raise BatchError(f"{self.name} with loss={self._loss!r} sends one advantage per sampled token, and the "
                             "rows carry top-k fields; drop them, or use loss='cross_entropy' for the top-k form")
        teacher_N = batch.require("teacher_logprobs", self.name, "the teacher's log-probability of each sampled token")
        gap_N = np.subtract(teacher_N, batch.behavior_logprobs_N) * batch.action_weight_N
        advantage_N = self._kl_coef * gap_N
        admitted_B = np.ones(batch.size, dtype=bool)
        stats = {"batch_mean_reward": float(batch.rewards_B.mean()), "admitted_share": 1.0,
                 "mean_ratio": mean_ratio(batch, admitted_B),
                 "mean_teacher_gap": float(gap_N.sum() / batch.action_count)}
        coefficients_N = batch.ratio_N * advantage_N
        return Update(self.name, batch.split(coefficients_N), batch.split(advantage_N), admitted_B, stats)

    def _check(self) -> list[str]:
        if self._loss == "cross_entropy":
            return []
        problems = []
        if self._divergence != "reverse_kl":
            problems.append(f"{type(self).__name__}.divergence={self._divergence!r} is invalid with loss="
                            f"{self._loss!r}: the advantage kl_coef (teacher - sampler) is the reverse KL's; set "
                            "divergence='reverse_kl', or loss='cross_entropy'")
        if self._max_ratio is not None:
            problems.append(f"{type(self).__name__}.max_ratio={self._max_ratio!r} is invalid with loss="
                            f"{self._loss!r}: the engine's importance ratio is uncapped; set max_ratio=None, or "
                            "loss='cross_entropy'")
        return problems

    @property
    def _loss(self) -> str:
        return str(getattr(self, "loss"))  # noqa: B009 - declared by the subclass

    @property
    def _kl_coef(self) -> float:
        return float(getattr(self, "kl_coef"))  # noqa: B009 - declared by the subclass

    @property
    def _divergence(self) -> str:
        return str(getattr(self, "divergence"))  # noqa: B009 - declared by the subclass

    @property
    def _needs(self) -> tuple[str, ...]:
        """What the loop fills: the teacher's score of each sampled token, and its top-k slots (cross_entropy)."""
        return TEACHER_NEEDS if self._loss == "cross_entropy" else ("teacher_logprobs",)

    @property
    def _spec_top_k(self) -> int:
        return self._top_k if self._loss == "cross_entropy" else 0

    @property
    def _top_k(self) -> int:
        return int(getattr(self, "top_k"))  # noqa: B009 - declared by the subclass

    @property
    def _max_ratio(self) -> float | None:
        cap = getattr(self, "max_ratio")  # noqa: B009 - declared by the subclass
        return None if cap is None else float(cap)


# --------------------------------------------------------------------- OPD
@dataclass(frozen=True)
class OPD(_Distill):
    """On-policy distillation from a frozen teacher (Agarwal et al. 2023, arXiv:2306.13649; Thinking
    Machines 2025; top-k reverse KL: Li et al. 2026, arXiv:2604.13016, Fu et al. 2026, arXiv:2603.25562).

    ``teacher`` is the served ``Endpoint`` that ``prime_rl_config`` writes into its config; ``wai train``
    loads its teacher from its own ``teacher`` setting (``--teacher``), the model ``run_spec().teacher``
    asks for. The update itself reads the teacher's scores from the rows (``teacher_logprobs`` or the
    top-k fields). Coefficients: module docstring.
    """

    name = "opd"

    teacher: Endpoint | None = None
    top_k: int = knob()
    divergence: str = knob()
    max_ratio: float | None = knob()
    loss: str = knob()
    kl_coef: float = knob()

    def _run_spec(self) -> dict[str, Any]:
        return {"needs": self._needs, "teacher": TeacherSpec("model", top_k=self._spec_top_k)}

    def _check(self) -> list[str]:
        problems = super()._check()
        if self.teacher is not None and not isinstance(self.teacher, Endpoint):
            problems.append(f"OPD.teacher={self.teacher!r} is invalid: it must be a wai.Endpoint(base_url=...) or None")
        return problems


# --------------------------------------------------------------------- OPSD
def parse_anchor(anchor: Any) -> tuple[str, float | None] | None:
    """('ema', rate) / ('initial', None) / ('live', None), or None when the anchor is not valid."""
    if anchor in ("initial", "live"):
        return str(anchor), None
    if isinstance(anchor, str) and anchor.startswith("ema:"):
        try:
            rate = float(anchor[4:])
        except ValueError:
            return None
        if np.isfinite(rate) and 0.0 < rate <= 1.0:
            return "ema", rate
    return None


@dataclass(frozen=True)
class OPSD(_Distill):
    """On-policy self-distillation: the student's own weights, shown privileged context, as the teacher.

    SDFT (Shenfeld et al. 2026, arXiv:2601.19897: a demonstration in context, EMA teacher), SDPO
    (Huebotter et al. 2026, arXiv:2601.20802: the environment's feedback), Zhao et al. 2026
    (arXiv:2601.18734: the reference answer, a frozen initial teacher, forward KL). The update is OPD's;
    ``run_spec().teacher`` says which teacher the loop must build (weights per ``anchor``, context per
    ``privileged``). Differs from the papers: one divergence
    default (reverse KL) for every ``privileged`` choice; Zhao et al. use forward KL with ``"initial"``.
    """

    name = "opsd"

    privileged: str = knob()
    anchor: str = knob()
    top_k: int = knob()
    divergence: str = knob()
    max_ratio: float | None = knob()
    loss: str = knob()
    kl_coef: float = knob()

    def _run_spec(self) -> dict[str, Any]:
        weights, rate = parse_anchor(self.anchor) or ("live", None)
        return {"needs": self._needs, "teacher": TeacherSpec(weights, rate, self.privileged, self._spec_top_k)}

    def _check(self) -> list[str]:
        problems = super()._check()
        if parse_anchor(self.anchor) is None:
            problems.append(f"OPSD.anchor={self.anchor!r} is invalid: it must be 'ema:<rate>' with 0 < rate <= 1 "
                            "(e.g. 'ema:0.01'), 'initial' (frozen starting weights) or 'live' (the current student)")
        return problems
