"""The group baselines: GRPO (and Dr. GRPO), RLOO, MaxRL, and RAE's per-agent running baseline.

Each computes one advantage A_i per trajectory and then shares one coefficient rule, PPO's clipped
surrogate with a length weight w_i (Schulman et al. 2017, arXiv:1707.06347, Eq. 7):

    L = - sum_i w_i sum_t min(rho_i,t A_i, clip(rho_i,t, 1 - clip, 1 + clip_high) A_i)
    c_i,t = w_i rho_i,t A_i   where the unclipped branch is the minimum (ties included), else 0

``clip_high`` (DAPO's clip-higher, Yu et al. 2025, arXiv:2503.14476, section 3.1) is ``clip`` unless
set. ``dual_clip`` (Ye et al. 2020, arXiv:1912.09729, dual-clip PPO; verl's ``clip_ratio_c``) caps the loss
of a token with A_i < 0 at ``-dual_clip A_i``: for A_i < 0 the per-token loss is
``min(-dual_clip A_i, -min(rho A_i, clip(rho) A_i))``, so such a token with rho > dual_clip carries 0.

Only action tokens count: c = 0 on tokens the environment wrote. B is the number of trajectories
in the batch, T_i the action tokens of trajectory i, N the action tokens of the batch.

Splitting a batch: the advantages depend only on a trajectory's own group (GRPO, RLOO, MaxRL), so a
batch cut along group boundaries gives the same advantages per part; the coefficients then differ
from the whole batch's only by the normalizer (B_part/B for w = 1/(B T_i) and 1/(B max_tokens),
N_part/N for 1/N). RAE's baseline runs in batch order, so updating a batch in two consecutive parts
gives exactly the advantages of one update over the whole.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from whileai.errors import ConfigError
from whileai.methods import losses
from whileai.methods._ops import Groups, agree, far_outside, group_by, group_stats, unclipped_is_min
from whileai.methods.base import SampledPerPrompt, Update, knob, plural, trajectory_list
from whileai.rows.batch import Batch

GROUP_WHY = "rollouts of the same prompt share a task_id and are compared with each other"
ONE_ROLLOUT_FIX = ("with one rollout per prompt use wai.FlashReinforce, wai.SAO, wai.BPCO or wai.RAE, which bring "
                   "their own baseline, or sample several rollouts per prompt (rollouts_per_prompt)")
# GRPO: A = (R - mean) / (std + 1e-6): verl's epsilon (compute_grpo_outcome_advantage). TRL adds 1e-4
# instead; the two differ only when a group's std is near 0, and a unanimous group gets A = 0 here anyway.
STD_EPSILON = 1e-6


# --------------------------------------------------------------------- the shared coefficient rule
@dataclass(frozen=True)
class ClipBand:
    """The clip band [1 - low, 1 + high] and the dual-clip bound for A < 0 (None: no dual clip)."""

    low: float
    high: float
    dual: float | None = None

    def __str__(self) -> str:
        return f"[{1 - self.low:g}, {1 + self.high:g}]"


def band_of(method: Any) -> ClipBand:
    """The band a method's ``clip``, ``clip_high`` (None: = clip) and ``dual_clip`` (None: off) declare."""
    if not hasattr(method, "clip"):
        raise ConfigError(f"{type(method).__name__} has no clip band (no 'clip' field), so its advantages cannot go "
                          "through the clipped surrogate; wrap a grouped method (wai.GRPO(), wai.RLOO(), wai.MaxRL())")
    clip = float(method.clip)
    high = getattr(method, "clip_high", None)
    return ClipBand(clip, clip if high is None else float(high), getattr(method, "dual_clip", None))


@dataclass(frozen=True)
class Surrogate:
    """What the clipped surrogate did on the batch (per token, flat)."""

    coefficients_N: np.ndarray
    advantages_N: np.ndarray
    clipped_N: np.ndarray  # action tokens of admitted rows that carry 0 because a clip binds (A != 0)
    dual_clipped_N: np.ndarray  # those among them with A < 0 and rho > dual_clip


def clipped_surrogate(batch: Batch, advantage_B: np.ndarray, weight_B: np.ndarray, admitted_B: np.ndarray,
                      band: ClipBand | float) -> Surrogate:
    """c = w_i rho A_i where no clip binds, else 0; 0 off action tokens and off admitted rows.

    ``band``: a ``ClipBand``, or one number for the symmetric band [1 - clip, 1 + clip] without dual clip.
    """
    band = band if isinstance(band, ClipBand) else ClipBand(band, band)
    live_B = admitted_B & (advantage_B != 0)
    # per row, A_i's sign says which side of the band clips: above 1 + high for A > 0, below 1 - low for A < 0
    sign_N = batch.spread(np.where(live_B, np.sign(advantage_B), 0.0).astype(np.int8))
    ratio_N = batch.ratio_N
    clipped_N = ~unclipped_is_min(ratio_N, sign_N, 1.0 - band.low, 1.0 + band.high)
    clipped_N &= batch.action_mask_N
    dual_clipped_N = np.zeros_like(clipped_N)
    if band.dual is not None:  # A < 0: the loss is capped at -dual A, constant (so c = 0) where rho > dual
        dual_clipped_N = (sign_N < 0) & (ratio_N > band.dual) & batch.action_mask_N
        clipped_N |= dual_clipped_N
    coefficients_N = batch.spread(np.where(live_B, weight_B * advantage_B, 0.0))
    coefficients_N *= ratio_N
    coefficients_N *= batch.action_weight_N
    coefficients_N[clipped_N] = 0.0
    advantages_N = batch.spread(advantage_B)
    advantages_N *= batch.action_weight_N
    return Surrogate(coefficients_N, advantages_N, clipped_N, dual_clipped_N)


def base_stats(batch: Batch, admitted_B: np.ndarray) -> dict[str, float]:
    """batch_mean_reward, admitted_share and mean_ratio (over the admitted trajectories' action tokens)."""
    return {
        "batch_mean_reward": float(batch.rewards_B.mean()),
        "admitted_share": float(admitted_B.mean()),
        "mean_ratio": batch.action_mean(batch.ratio_N, admitted_B if admitted_B.any() else None),
    }


def clip_note(batch: Batch, surrogate: Surrogate, band: ClipBand) -> list[str]:
    """One note for tokens past the band, one for tokens the dual clip zeroed."""
    notes = []
    ratio_N = batch.ratio_N
    dual = band.dual is not None and bool(surrogate.dual_clipped_N.any())
    outside_N = surrogate.clipped_N & ~surrogate.dual_clipped_N if dual else surrogate.clipped_N
    if outside_N.any():
        rows = np.unique(batch.row_index_N[outside_N])
        where = np.flatnonzero(outside_N)
        k, factor = far_outside(ratio_N[where], 1.0 - band.low, 1.0 + band.high)
        token = int(where[k])
        row = int(batch.row_index_N[token])
        count = int(outside_N.sum())
        notes.append(
            f"{plural(count, 'action token')} in {plural(rows.size, 'trajectory', 'trajectories')} "
            f"{trajectory_list(rows)} sat past the clip band {band} on the side "
            f"{agree(count, 'its', 'their')} advantage pushes and {agree(count, 'carries', 'carry')} 0 (furthest: "
            f"ratio {ratio_N[token]:.3g} at token {token - int(batch.offsets[row])} of trajectory {row}, "
            f"{factor:.3g}x past the band); the rollouts are staler than clip allows: sample fresher rollouts (lower "
            "off_policy_steps in wai.Async) or raise clip (clip_high for the upper end alone)")
    if dual:
        where = np.flatnonzero(surrogate.dual_clipped_N)
        rows = np.unique(batch.row_index_N[where])
        count = where.size
        notes.append(
            f"{plural(count, 'action token')} with a negative advantage in "
            f"{plural(rows.size, 'trajectory', 'trajectories')} {trajectory_list(rows)} had a ratio above "
            f"dual_clip={band.dual:g} (largest {ratio_N[where].max():.3g}) and {agree(count, 'carries', 'carry')} 0: "
            "the dual clip caps such a token's loss at -dual_clip * A; sample fresher rollouts, or raise dual_clip "
            "(None turns it off)")
    return notes


def key_list(keys: list[Hashable]) -> str:
    shown = ", ".join(repr(k) for k in keys[:5])
    return f"({shown}{', ...' if len(keys) > 5 else ''})"


def group_notes(groups: Groups, unanimous_G: np.ndarray, rewards_B: np.ndarray, rollouts_per_prompt: int) -> list[str]:
    """Groups of one (point to the single-rollout methods) and unanimous groups (point to select)."""
    notes = []
    sizes_G = groups.sizes_G
    single = np.flatnonzero(sizes_G == 1)
    if single.size == groups.count:
        notes.append(f"every group has a single rollout ({plural(groups.count, 'task_id')}), so every advantage is "
                     f"0 and the update is empty; {ONE_ROLLOUT_FIX}")
        return notes
    if single.size:
        notes.append(f"{plural(single.size, 'group')} {key_list([groups.keys_G[g] for g in single])} "
                     f"{'has' if single.size == 1 else 'have'} a single rollout, so A = 0 there; {ONE_ROLLOUT_FIX}")
    same = np.flatnonzero(unanimous_G & (sizes_G > 1))
    if same.size:
        rows = int(sizes_G[same].sum())
        first = rewards_B[groups.index_B == same[0]][0]
        notes.append(f"{plural(same.size, 'group')} {key_list([groups.keys_G[g] for g in same])} scored the same on "
                     f"every rollout (first: R = {first:g}), so {plural(rows, 'trajectory', 'trajectories')} carry "
                     "A = 0: drop unanimous groups before the update with wai.select(rows, mode='rl'), or raise "
                     "rollouts_per_prompt so a hard prompt shows a pass")
    short = np.flatnonzero((sizes_G > 1) & (sizes_G < rollouts_per_prompt))
    if short.size:
        notes.append(f"{plural(short.size, 'group')} {key_list([groups.keys_G[g] for g in short])} "
                     f"{'has' if short.size == 1 else 'have'} fewer rollouts than rollouts_per_prompt={rollouts_per_prompt} "
                     f"(smallest: {int(sizes_G[short].min())}), so {'its' if short.size == 1 else 'their'} baseline "
                     "is noisier: check no rollouts were lost, or set rollouts_per_prompt to what the sampler drew")
    return notes


def zero_advantage_share(advantage_B: np.ndarray, admitted_B: np.ndarray) -> float:
    return float((advantage_B[admitted_B] == 0).mean()) if admitted_B.any() else 1.0


# --------------------------------------------------------------------- the engine-loss form
def loss_config_of(method: Any) -> dict[str, float]:
    """The loss config a grouped method's ``loss`` takes: the clip band as absolute bounds for ppo / cispo /
    gspo (1 - clip, 1 + clip_high), nothing for importance_sampling and cross_entropy."""
    return losses.clip_config(method.clip, method.clip_high) if method.loss in losses.CLIPPED else {}


def loss_problems(method: Any) -> list[str]:
    """What a grouped method's other knobs cannot mean under a named loss (the engine has no dual clip)."""
    name, loss = type(method).__name__, method.loss
    if loss == "cross_entropy":
        return []
    problems = []
    if getattr(method, "dual_clip", None) is not None:
        problems.append(f"{name}.dual_clip={method.dual_clip!r} is invalid with loss={loss!r}: the engine's losses "
                        "have no dual clip; set dual_clip=None, or loss='cross_entropy'")
    if loss in losses.CLIPPED and method.clip > 1.0:
        problems.append(f"{name}.clip={method.clip!r} is invalid with loss={loss!r}: the lower ratio bound 1 - clip "
                        "would be negative; use clip <= 1")
    return problems


def named_loss_update(batch: Batch, method: Any, advantage_N: np.ndarray, admitted_B: np.ndarray,
                      notes: list[str]) -> Update:
    """The Update of a grouped method under a named loss: the per-token advantages it sends, and the
    loss's coefficient view at the rows' logprobs (whileai.methods.losses)."""
    coefficients_N = losses.coefficients(method.loss, batch, advantage_N, method.loss_config())
    stats = base_stats(batch, admitted_B)
    stats["clipped_token_share"] = losses.clipped_share(method.loss, batch, advantage_N, coefficients_N)
    advantage_B = batch.per_row_sum(np.abs(advantage_N))
    stats["zero_advantage_share"] = zero_advantage_share(advantage_B, admitted_B)
    return Update(method.name, batch.split(coefficients_N), batch.split(advantage_N), admitted_B, stats, notes)


# --------------------------------------------------------------------- GRPO
@dataclass(frozen=True)
class GRPO(SampledPerPrompt):
    """GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, Eq. 3-4), with Dr. GRPO and BNPO weights.

    Rows sharing a ``task_id`` form a group; over the rows of a group that count (see ``truncated``)::

        A_i = (R_i - mean) / (std + 1e-6)     sample std (n - 1), as TRL and verl; verl's epsilon
        A_i = 0                                when every counted reward of the group is equal
        c_i,t = w_i rho A_i                    where no clip binds (module docstring), else 0
        c_i,t -= beta w_i (1 - exp(ref - log pi))   the k3 KL's gradient (Eq. 4), when beta > 0

    The KL term applies to every admitted action token, so with beta > 0 a zero-advantage group still
    gets a (small) coefficient pulling it toward the reference.

    ``loss_type`` picks w_i: ``"grpo"`` 1/(B T_i) (Eq. 3: each sequence's token mean, then the mean over
    sequences), ``"bnpo"`` 1/N (the token mean over the batch, DAPO's token-level loss; N counts the
    action tokens of admitted rows only, the tokens that can carry gradient, as TRL and verl count
    them), ``"dr_grpo"`` 1/(B max_tokens) and no std division (Liu et al. 2025, arXiv:2503.20783).
    ``truncated="mask"``: a row with ``truncated`` true gets c = 0 and is left out of its group's mean
    and std (and of bnpo's N); ``"zero"`` counts its reward as 0; ``"keep"`` trains it like any other.

    ``loss`` (default ``"cross_entropy"``: the coefficients above) names an engine loss instead
    (``importance_sampling``, ``ppo``, ``cispo``, ``gspo``): the step then sends the per-token advantage
    ``a_i,t = l_i A_i`` and the engine computes the ratio; ``l_i`` is the methods reference's length weight,
    1/T_i, 1/N or 1/max_tokens (the engine sums over datums, so no 1/B), and the clip band goes as the
    absolute bounds 1 - clip, 1 + clip_high (``whileai.methods.losses``). With ``importance_sampling`` this is
    the service page's length-normalized GRPO (``grpo_len_norm``). beta > 0 and dual_clip need cross_entropy.

    Where we differ from the paper: the paper's std has no epsilon and its population/sample choice is
    unstated; we use the sample std (TRL and verl) + 1e-6 (verl's epsilon; TRL's is 1e-4). Defaults
    differ in k (8, not 64) and beta (0, not 0.04): see ``GRPO.knobs()[...].why``. A group of one, or
    a unanimous group, gets A = 0 exactly.
    """

    name = "grpo"

    clip: float = knob()
    clip_high: float | None = knob()
    dual_clip: float | None = knob()
    beta: float = knob()
    loss_type: str = knob()
    truncated: str = knob()
    loss: str = knob()

    run_settings = {"max_lag": None, "min_rollouts_per_prompt": 2}

    def _run_spec(self) -> dict[str, Any]:
        return {"needs": ("ref_logprobs",) if self.beta > 0 else ()}

    def loss_config(self) -> dict[str, Any]:
        """The config ``loss`` is sent with (``RunSpec.loss_config``)."""
        return loss_config_of(self)

    def _check(self) -> list[str]:
        problems = loss_problems(self)
        if self.loss != "cross_entropy" and self.beta > 0:
            problems.append(f"{type(self).__name__}.beta={self.beta!r} is invalid with loss={self.loss!r}: the KL "
                            "term is a coefficient of its own; set beta=0, or loss='cross_entropy'")
        return problems

    def _admit(self, batch: Batch, groups: Groups, rewards_B: np.ndarray,
               admitted_B: np.ndarray) -> tuple[np.ndarray, list[str], dict[str, float]]:
        """The rows that count, after ``truncated``; DAPO drops more (short and unanimous groups)."""
        return admitted_B, [], {}

    def _update(self, batch: Batch) -> Update:
        groups = group_by(batch.row_field("task_id", self.name, GROUP_WHY), "task_id")
        rewards_B = batch.rewards_B.copy()
        truncated_B = batch.truncated_B
        if self.truncated == "zero":
            rewards_B[truncated_B] = 0.0
        admitted_B = ~truncated_B if self.truncated == "mask" else np.ones(batch.size, dtype=bool)
        admitted_B, admit_notes, admit_stats = self._admit(batch, groups, rewards_B, admitted_B)
        stats_G = group_stats(rewards_B, groups, admitted_B)
        g = groups.index_B
        centered_B = rewards_B - stats_G.mean_G[g]
        if self.loss_type == "dr_grpo":
            advantage_B = centered_B
        else:
            advantage_B = centered_B / (stats_G.std_G[g] + STD_EPSILON)
        advantage_B = np.where(stats_G.unanimous_G[g] | ~admitted_B, 0.0, advantage_B)
        notes = group_notes(groups, stats_G.unanimous_G, rewards_B, self.rollouts_per_prompt)
        notes += self._truncation_notes(batch) + admit_notes
        if self.loss != "cross_entropy":
            advantage_N = batch.spread(advantage_B * self._length_weights(batch, admitted_B))
            advantage_N *= batch.action_weight_N
            update = named_loss_update(batch, self, advantage_N, admitted_B, notes)
            update.stats.update(admit_stats)
            return update
        weight_B = self._weights(batch, admitted_B)
        band = band_of(self)
        surrogate = clipped_surrogate(batch, advantage_B, weight_B, admitted_B, band)
        coefficients_N = surrogate.coefficients_N
        stats = base_stats(batch, admitted_B)
        if self.beta > 0:
            kl_coefficients_N, stats["mean_kl"] = self._kl_term(batch, weight_B, admitted_B)
            coefficients_N = coefficients_N + kl_coefficients_N
        stats["clipped_token_share"] = float(surrogate.clipped_N.sum() / max(int(batch.action_mask_N.sum()), 1))
        stats["zero_advantage_share"] = zero_advantage_share(advantage_B, admitted_B)
        stats.update(admit_stats)
        notes += clip_note(batch, surrogate, band)
        return Update(self.name, batch.split(coefficients_N), batch.split(surrogate.advantages_N), admitted_B,
                      stats, notes)

    def _kl_term(self, batch: Batch, weight_B: np.ndarray, admitted_B: np.ndarray) -> tuple[np.ndarray, float]:
        """-beta w_i d(k3)/d(log pi) = -beta w_i (1 - exp(ref - log pi)) per live token, and the mean k3."""
        ref_N = batch.require("ref_logprobs", self.name, f"beta={self.beta:g} adds a KL to the reference policy; "
                              "or set beta=0")
        live_N = batch.action_mask_N & batch.spread(admitted_B)
        log_ref_over_pi_N = ref_N - batch.logprobs_N
        kl_gradient_N = 1.0 - np.exp(log_ref_over_pi_N)
        coefficients_N = np.where(live_N, -self.beta * batch.spread(weight_B) * kl_gradient_N, 0.0)
        k3_N = np.expm1(log_ref_over_pi_N) - log_ref_over_pi_N
        return coefficients_N, float(k3_N[live_N].mean()) if live_N.any() else 0.0

    @property
    def _length(self) -> str:
        """Dr. GRPO's one length ('max_tokens', 'own' or 'none'); GRPO's dr_grpo weight is 'max_tokens'."""
        return str(getattr(self, "length", "max_tokens"))

    def _weights(self, batch: Batch, admitted_B: np.ndarray) -> np.ndarray:
        """w_i for ``loss_type``: 1/(B T_i), 1/N (N: action tokens of admitted rows) or 1/(B max_tokens)."""
        tokens_B = batch.action_tokens_B.astype(np.float64)
        if self.loss_type == "bnpo":
            return np.full(batch.size, 1.0 / max(tokens_B[admitted_B].sum(), 1.0))
        if self.loss_type == "dr_grpo" and self._length != "own":
            return np.full(batch.size, 1.0 / (batch.size * (self.max_tokens if self._length == "max_tokens" else 1)))
        return 1.0 / (batch.size * tokens_B)

    def _length_weights(self, batch: Batch, admitted_B: np.ndarray) -> np.ndarray:
        """l_i of a named loss: w_i without the 1/B (the engine sums over datums)."""
        weight_B = self._weights(batch, admitted_B)
        return weight_B if self.loss_type == "bnpo" else weight_B * batch.size

    def _truncation_notes(self, batch: Batch) -> list[str]:
        cut = np.flatnonzero(batch.truncated_B)
        if not cut.size or self.truncated == "keep":
            return []
        who = f"{plural(cut.size, 'truncated trajectory', 'truncated trajectories')} {trajectory_list(cut)}"
        if self.truncated == "mask":
            return [f"{who} got c = 0 and {agree(cut.size, 'was', 'were')} left out of "
                    f"{agree(cut.size, 'its', 'their')} group's mean and std (truncated='mask'); raise max_tokens so fewer replies are cut, or set "
                    "truncated='zero' to score them 0"]
        return [f"{who} scored R = 0 (truncated='zero'), so a cut reply is pushed down like a failure; raise "
                "max_tokens, or set truncated='mask' to leave cut replies out"]


@dataclass(frozen=True)
class DrGRPO(GRPO):
    """Dr. GRPO (Liu et al. 2025, arXiv:2503.20783): GRPO with ``loss_type="dr_grpo"``.

    A_i = R_i - mean (no std division) and w_i = 1/(B max_tokens), one constant length for every
    trajectory, which removes GRPO's bias toward long wrong answers. ``length`` names that length:
    ``"max_tokens"`` (the paper), ``"own"`` each trajectory's T_i (the service page's drgrpo.py, which
    composes grpo_nostd and grpo_len_norm) or ``"none"`` 1 (its grpo_nostd.py: the group-centred reward as
    it is). ``DrGRPO(length="none", loss="importance_sampling", truncated="keep")`` is the service page's
    GRPO without the standard deviation (the registry's ``grpo_nostd``).
    """

    name = "dr_grpo"

    length: str = knob()


# --------------------------------------------------------------------- RLOO and MaxRL
AdvantageRule = Callable[[np.ndarray, Groups, np.ndarray], "tuple[np.ndarray, list[str]]"]


def baseline_update(batch: Batch, method: Any, rule: AdvantageRule) -> Update:
    """A grouped advantage (one per trajectory, 0 in unanimous groups) under GRPO's surrogate, w_i = 1/(B T_i);
    under a named loss, the advantage itself on every action token (the engine sums)."""
    name, band, rollouts_per_prompt = method.name, band_of(method), method.rollouts_per_prompt
    groups = group_by(batch.row_field("task_id", name, GROUP_WHY), "task_id")
    rewards_B = batch.rewards_B
    admitted_B = np.ones(batch.size, dtype=bool)
    unanimous_G = group_stats(rewards_B, groups, admitted_B).unanimous_G
    advantage_B, rule_notes = rule(rewards_B, groups, unanimous_G)
    advantage_B = np.where(unanimous_G[groups.index_B], 0.0, advantage_B)
    if method.loss != "cross_entropy":
        notes = group_notes(groups, unanimous_G, rewards_B, rollouts_per_prompt) + rule_notes
        return named_loss_update(batch, method, batch.spread(advantage_B) * batch.action_weight_N, admitted_B, notes)
    weight_B = 1.0 / (batch.size * batch.action_tokens_B.astype(np.float64))
    surrogate = clipped_surrogate(batch, advantage_B, weight_B, admitted_B, band)
    stats = base_stats(batch, admitted_B)
    stats["clipped_token_share"] = float(surrogate.clipped_N.sum() / max(int(batch.action_mask_N.sum()), 1))
    stats["zero_advantage_share"] = zero_advantage_share(advantage_B, admitted_B)
    notes = group_notes(groups, unanimous_G, rewards_B, rollouts_per_prompt)
    notes += rule_notes + clip_note(batch, surrogate, band)
    return Update(name, batch.split(surrogate.coefficients_N), batch.split(surrogate.advantages_N),
                  admitted_B, stats, notes)


def leave_one_out(rewards_B: np.ndarray, groups: Groups, unanimous_G: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """A_i = R_i - mean of the other rollouts of its group; 0 for a group of one."""
    g = groups.index_B
    size_B = groups.sizes_G[g].astype(np.float64)
    total_B = np.bincount(g, weights=rewards_B, minlength=groups.count)[g]
    others_mean_B = (total_B - rewards_B) / np.maximum(size_B - 1.0, 1.0)
    return np.where(size_B > 1, rewards_B - others_mean_B, 0.0), []


def beat_the_best(rewards_B: np.ndarray, groups: Groups, unanimous_G: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """A_i = R_i - the best reward among the other rollouts of its group; 0 for a group of one."""
    g, n = groups.index_B, groups.count
    best_G = np.full(n, -np.inf)
    np.maximum.at(best_G, g, rewards_B)
    is_best_B = rewards_B == best_G[g]
    second_G = np.full(n, -np.inf)
    np.maximum.at(second_G, g[~is_best_B], rewards_B[~is_best_B])
    alone_B = is_best_B & (np.bincount(g, weights=is_best_B, minlength=n)[g] == 1)  # the one best of its group
    others_best_B = np.where(alone_B, second_G[g], best_G[g])
    return np.where(groups.sizes_G[g] > 1, rewards_B - others_best_B, 0.0), []


def mean_normalized(rewards_B: np.ndarray, groups: Groups, unanimous_G: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """A_i = (R_i - mean) / mean over its group; 0 where the mean is <= 0."""
    g = groups.index_B
    mean_G = np.bincount(g, weights=rewards_B, minlength=groups.count) / groups.sizes_G
    positive_B = mean_G[g] > 0
    advantage_B = np.where(positive_B, (rewards_B - mean_G[g]) / np.where(positive_B, mean_G[g], 1.0), 0.0)
    lost = np.flatnonzero((mean_G <= 0) & ~unanimous_G)
    if not lost.size:
        return advantage_B, []
    return advantage_B, [
        f"{plural(lost.size, 'group')} {key_list([groups.keys_G[k] for k in lost])} "
        f"{'has' if lost.size == 1 else 'have'} mixed rewards but a mean <= 0, so MaxRL's division by the mean is "
        "undefined and they carry 0: MaxRL expects rewards >= 0 (a pass rate); shift the rewards into [0, 1], or "
        "use GRPO"
    ]


@dataclass(frozen=True)
class GroupBaseline(SampledPerPrompt):
    """RLOO's and MaxRL's shared machinery: a group of ``rollouts_per_prompt``, any lag, the method's loss, and
    ``baseline_update`` with the subclass's advantage rule. The knobs are declared here with RLOO's row;
    each subclass's own row gives their defaults (``Method``)."""

    knob_row: ClassVar[str] = "rloo"
    clip: float = knob()
    clip_high: float | None = knob()
    dual_clip: float | None = knob()
    loss: str = knob()

    run_settings = {"max_lag": None, "min_rollouts_per_prompt": 2}

    def loss_config(self) -> dict[str, Any]:
        return loss_config_of(self)

    def _check(self) -> list[str]:
        return loss_problems(self)

    def _update(self, batch: Batch) -> Update:
        return baseline_update(batch, self, self._rule())

    def _rule(self) -> AdvantageRule:
        raise NotImplementedError


@dataclass(frozen=True)
class RLOO(GroupBaseline):
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740): leave-one-out baseline.

    A_i = R_i - (sum_j R_j - R_i) / (n - 1) over the n rollouts sharing trajectory i's ``task_id``
    (0 for a group of one, and exactly 0 for a unanimous group), then GRPO's surrogate with
    w_i = 1/(B T_i). Where we differ from the paper: the paper trains on-policy REINFORCE with no clip;
    we keep PPO's clip so stale rollouts are treated as GRPO treats them (``clip`` = 0.2). ``loss`` names an
    engine loss instead (GRPO's ``loss``): the step sends A_i on every action token and the engine sums;
    ``RLOO(loss="importance_sampling")`` is the service page's rloo.py.
    """

    name = "rloo"

    def _rule(self) -> AdvantageRule:
        return leave_one_out


@dataclass(frozen=True)
class MaxRL(GroupBaseline):
    """MaxRL (arXiv:2602.02710): the group-centred reward divided by the group mean.

    A_i = (R_i - mean) / mean over the rollouts sharing trajectory i's ``task_id``, and 0 when the
    mean is <= 0 (a group that never passed carries nothing); then GRPO's surrogate with
    w_i = 1/(B T_i). Dividing by the pass rate p weights a rarely solved prompt by about 1/p, which
    makes the gradient the maximum-likelihood one. As prime-rl's ``max_rl``, plus PPO's clip.
    ``estimator="beat_the_best"`` is the service page's maxrl.py reading instead: A_i = R_i minus the best
    other reward of the group. ``loss`` as RLOO's: ``MaxRL(loss="importance_sampling")`` is maxrl.py.
    """

    name = "max_rl"

    estimator: str = knob()

    def _rule(self) -> AdvantageRule:
        return mean_normalized if self.estimator == "mean" else beat_the_best


# --------------------------------------------------------------------- RAE
@dataclass(frozen=True)
class RAE(SampledPerPrompt):
    """RAE (SPIRAL, Liu et al. 2025, arXiv:2506.24119): a running reward baseline per agent.

    In batch order, for each trajectory i of agent a (the row's ``agent``; one shared agent when no
    row has one)::

        A_i = R_i - b_a        then        b_a <- decay b_a + (1 - decay) R_i

    then GRPO's surrogate with w_i = 1/(B T_i). The baselines persist across updates on the object
    (``baselines``, ``state_dict()``, ``load_state_dict()``; from the shell ``wai update --state FILE``)
    and start at 0 for an agent never seen.
    It is the one group baseline that works at one rollout per prompt. Where we differ from prime-rl:
    prime-rl keeps the baseline in memory only; here it can be saved. ``replace(...)`` returns an object
    with fresh (empty) baselines.
    """

    name = "rae"

    decay: float = knob()
    clip: float = knob()
    clip_high: float | None = knob()
    dual_clip: float | None = knob()
    _baselines: dict[Any, float] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def baselines(self) -> dict[Any, float]:
        """A copy of the running baseline per agent."""
        return dict(self._baselines)

    def state_dict(self) -> dict[str, Any]:
        """The state to save between updates (plain floats; JSON-ready when agents are strings)."""
        return {"baselines": dict(self._baselines)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore baselines saved by ``state_dict()``; a non-finite or missing value is a ``ConfigError``."""
        if not isinstance(state, Mapping) or not isinstance(state.get("baselines"), Mapping):
            raise ConfigError("RAE.load_state_dict expects {'baselines': {agent: float}}, as state_dict() returns; "
                              f"got {state!r}")
        restored = {}
        for agent, value in state["baselines"].items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"RAE.load_state_dict: baseline for agent {agent!r} is {value!r}; it must be a "
                                  "finite number")
            restored[agent] = float(value)
        self._baselines.clear()
        self._baselines.update(restored)

    run_settings = {"max_lag": None, "stateful": True}

    def initial_state(self) -> dict[str, Any]:
        return {"baselines": {}}

    def _update(self, batch: Batch) -> Update:
        return self._update_baselines(batch, self._baselines)

    def _update_with_state(self, batch: Batch, state: Mapping[str, Any]) -> Update:
        """The loop-owned form: start from ``state`` (as ``initial_state()`` / ``state_dict()`` give it), leave
        it unchanged, and return the state after this update as ``Update.state``."""
        probe = RAE(decay=self.decay)
        probe.load_state_dict(state)  # validates
        baselines = dict(probe._baselines)
        update = self._update_baselines(batch, baselines)
        update.state = {"baselines": baselines}
        return update

    def _update_baselines(self, batch: Batch, baselines: dict[Any, float]) -> Update:
        """The update, moving ``baselines`` (changed in place) through the batch in order."""
        if "agent" in batch.row_fields:
            agents_B = batch.row_field("agent", self.name, "RAE keeps one running baseline per agent, so a batch "
                                       "cannot mix rows with and without an agent")
        else:
            agents_B = np.full(batch.size, None, dtype=object)
        group_by(agents_B, "agent")  # refuses an unhashable agent, naming the row
        new_agents = [a for a in dict.fromkeys(agents_B.tolist()) if a not in baselines]
        advantage_B = np.empty(batch.size)
        for i, (agent, reward) in enumerate(zip(agents_B.tolist(), batch.rewards_B.tolist())):
            baseline = baselines.get(agent, 0.0)
            advantage_B[i] = reward - baseline
            baselines[agent] = self.decay * baseline + (1.0 - self.decay) * reward
        admitted_B = np.ones(batch.size, dtype=bool)
        weight_B = 1.0 / (batch.size * batch.action_tokens_B.astype(np.float64))
        surrogate = clipped_surrogate(batch, advantage_B, weight_B, admitted_B, band_of(self))
        stats = base_stats(batch, admitted_B)
        stats["mean_baseline"] = float(np.mean(list(baselines.values())))
        stats["clipped_token_share"] = float(surrogate.clipped_N.sum() / max(int(batch.action_mask_N.sum()), 1))
        notes = clip_note(batch, surrogate, band_of(self))
        if new_agents:
            named = key_list(new_agents) if new_agents != [None] else "(the one shared agent)"
            notes.append(f"{plural(len(new_agents), 'agent')} {named} had no baseline yet, so it started at 0 and "
                         "the first rows' advantages are their raw rewards: carry baselines across runs with "
                         "`wai update --state FILE` or state_dict() / load_state_dict(), or lower decay so the "
                         "baseline catches up faster")
        return Update(self.name, batch.split(surrogate.coefficients_N), batch.split(surrogate.advantages_N),
                      admitted_B, stats, notes)
