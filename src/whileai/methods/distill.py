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

No normalizer (the reference's ``L_OPD`` is a plain sum), no reward, no group. Environment tokens get 0.
Differs from the papers: OPD papers (Agarwal et al. 2023, arXiv:2306.13649; Li et al. 2026,
arXiv:2604.13016) average over tokens; divide the learning rate by the token count to match them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import numpy as np

from whileai.errors import ConfigError
from whileai.methods.base import Method, Update, knob
from whileai.methods.supervised import mean_ratio
from whileai.rows.batch import TOPK_FIELDS, Batch

# What the top-k form reads from every row, each of shape (tokens, K) (validated by the batch contract).
TOPK_NEEDS: dict[str, str] = {
    "teacher_topk_tokens": "the top-k form trains on the teacher's top-k token ids (or drop every top-k field to "
                           "use the sampled-token form with 'teacher_logprobs')",
    "teacher_topk_logprobs": "the teacher's log-probability of each of its top-k tokens",
    "topk_logprobs": "the student's log-probability of each of the teacher's top-k tokens (or drop every top-k "
                     "field to use the sampled-token form with 'teacher_logprobs')",
}


# --------------------------------------------------------------------- the teacher endpoint
@dataclass(frozen=True)
class Endpoint:
    """A teacher served over an OpenAI-compatible API (it scores the student's tokens)."""

    base_url: str
    model: str = ""
    vocab_size: int | None = None
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        problems = []
        parsed = urlparse(self.base_url) if isinstance(self.base_url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
            problems.append(f"Endpoint.base_url={self.base_url!r} is invalid: it must be an http(s) URL with a "
                            "host, e.g. 'http://127.0.0.1:8000/v1'")
        if not isinstance(self.model, str):
            problems.append(f"Endpoint.model={self.model!r} is invalid: it must be the served model's name (str)")
        if self.vocab_size is not None and (isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int)
                                            or self.vocab_size < 1):
            problems.append(f"Endpoint.vocab_size={self.vocab_size!r} is invalid: it must be None or an integer "
                            ">= 1 (the teacher tokenizer's len(tokenizer))")
        if self.api_key_env is not None and (not isinstance(self.api_key_env, str) or not self.api_key_env):
            problems.append(f"Endpoint.api_key_env={self.api_key_env!r} is invalid: it must be None or the name "
                            "of an environment variable holding the key")
        if problems:
            raise ConfigError("; ".join(problems))


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
class _Distill(Method):
    """Shared update of OPD and OPSD (fields top_k and divergence come from the subclass)."""

    def _update(self, batch: Batch) -> Update:
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

    @property
    def _divergence(self) -> str:
        return str(getattr(self, "divergence"))  # noqa: B009 - declared by the subclass

    @property
    def _top_k(self) -> int:
        return int(getattr(self, "top_k"))  # noqa: B009 - declared by the subclass


# --------------------------------------------------------------------- OPD
@dataclass(frozen=True)
class OPD(_Distill):
    """On-policy distillation from a frozen teacher (Agarwal et al. 2023, arXiv:2306.13649; Thinking
    Machines 2025; top-k reverse KL: Li et al. 2026, arXiv:2604.13016, Fu et al. 2026, arXiv:2603.25562).

    ``teacher`` is the ``Endpoint`` the loop asks for the teacher's log-probabilities; the update itself
    reads them from the rows (``teacher_logprobs`` or the top-k fields). Coefficients: module docstring.
    """

    name = "opd"

    teacher: Endpoint | None = None
    top_k: int = knob("opd", "top_k")
    samples: int = knob("opd", "samples")
    divergence: str = knob("opd", "divergence")
    temperature: float = knob("opd", "temperature")
    max_tokens: int = knob("opd", "max_tokens")

    def _check(self) -> list[str]:
        if self.teacher is not None and not isinstance(self.teacher, Endpoint):
            return [f"OPD.teacher={self.teacher!r} is invalid: it must be a wai.Endpoint(base_url=...) or None"]
        return []


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
class TeacherSpec:
    """What teacher the loop must build for OPSD: which weights, which context, which divergence."""

    weights: str          # "ema", "initial" or "live"
    ema_rate: float | None
    privileged: str       # what is appended to the teacher's context
    divergence: str
    top_k: int
    temperature: float

    def describe(self) -> str:
        if self.weights == "ema":
            weights = (f"a moving average of the student's weights, theta_bar <- (1 - {self.ema_rate:g}) theta_bar "
                       f"+ {self.ema_rate:g} theta after every optimizer step")
        elif self.weights == "initial":
            weights = "the student's starting weights, frozen"
        else:
            weights = "the student's current weights (no anchor)"
        return (f"teacher = {weights}, shown the prompt plus the row's privileged {self.privileged!r} text that "
                f"the student never sees; it scores the student's tokens (top {self.top_k}, temperature "
                f"{self.temperature:g}) and the update applies {self.divergence}")


@dataclass(frozen=True)
class OPSD(_Distill):
    """On-policy self-distillation: the student's own weights, shown privileged context, as the teacher.

    SDFT (Shenfeld et al. 2026, arXiv:2601.19897: a demonstration in context, EMA teacher), SDPO
    (Huebotter et al. 2026, arXiv:2601.20802: the environment's feedback), Zhao et al. 2026
    (arXiv:2601.18734: the reference answer, a frozen initial teacher, forward KL). The update is OPD's;
    ``teacher_spec()`` says which teacher the loop must build. Differs from the papers: one divergence
    default (reverse KL) for every ``privileged`` choice; Zhao et al. use forward KL with ``"initial"``.
    """

    name = "opsd"

    privileged: str = knob("opsd", "privileged")
    anchor: str = knob("opsd", "anchor")
    top_k: int = knob("opsd", "top_k")
    samples: int = knob("opsd", "samples")
    divergence: str = knob("opsd", "divergence")
    temperature: float = knob("opsd", "temperature")
    max_tokens: int = knob("opsd", "max_tokens")

    def _check(self) -> list[str]:
        if parse_anchor(self.anchor) is None:
            return [f"OPSD.anchor={self.anchor!r} is invalid: it must be 'ema:<rate>' with 0 < rate <= 1 (e.g. "
                    "'ema:0.01'), 'initial' (frozen starting weights) or 'live' (the current student)"]
        return []

    def teacher_spec(self) -> TeacherSpec:
        weights, rate = parse_anchor(self.anchor) or ("live", None)
        return TeacherSpec(weights, rate, self.privileged, self.divergence, self.top_k, self.temperature)
