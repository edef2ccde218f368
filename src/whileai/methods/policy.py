"""The service page's algorithms (spec 004, "More algorithms") as methods that run an engine loss.

PPO, CISPO, GSPO, DPPO and SAPO share one advantage, Dr. GRPO's ``A_i = R_i - mean_group(R)`` with no
std and no length (``length="none"``), sent on every completion token; only the engine loss differs::

    ppo    -min(r A, clip(r, 1 - clip, 1 + clip_high) A)        Schulman et al. 2017, Eq. 7
    cispo  -sg(clip(r, 1 - clip, 1 + clip_high)) log p A         MiniMax-M1, arXiv:2506.13585
    gspo   -min(s_t A, clip(s_t, ...) A), s the sequence ratio   Zheng et al. 2025, arXiv:2507.18071
    dppo   -r A m, m = 0 where the token left the trust region   arXiv:2602.04879
    sapo   -sigmoid(tau (r - 1)) 4/tau A                        arXiv:2511.20347

No critic: plain ``ppo`` reads the same tensors as ``importance_sampling`` (the spec settles it). DAPO is
GRPO with clip-higher, the token-level 1/N, overlong filtering and dynamic sampling, its resampling a
``RunSpec.plan`` the loop follows; REINFORCE++ puts a K2 penalty to a frozen reference into the advantage.
Every one is ``update(batch) -> Update`` like any method: ``Update.advantages`` is what the step sends,
``Update.coefficients`` the loss's gradient at the rows' logprobs (``whileai.methods.losses``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from whileai.methods import losses
from whileai.methods._ops import Groups, group_by, group_stats
from whileai.methods.base import SampledPerPrompt, Update, knob, plural
from whileai.methods.grouped import GROUP_WHY, GRPO, DrGRPO, base_stats, key_list
from whileai.methods.shaping import SamplingPlan
from whileai.rows.batch import Batch


@dataclass(frozen=True)
class PPO(DrGRPO):
    """PPO's clipped surrogate on group-relative advantages, in the engine (the service page's ppo.py).

    ``A_i = R_i - mean_group(R)`` on every token of the completion (no std, no length, truncated rows kept),
    loss ``ppo`` with the bounds ``1 - clip`` and ``1 + clip_high`` (0.8 / 1.2 by default). No critic.
    """

    name = "ppo"


@dataclass(frozen=True)
class CISPO(PPO):
    """CISPO (MiniMax-M1, arXiv:2506.13585, Eq. 4-5): the clipped ratio held constant, times log p and A.

    PPO's datums with loss ``cispo``; every token keeps a gradient. Default bounds 1 - 1.0 = 0 and
    1 + 3.0 = 4 (one-sided, Tinker tutorial 202): ``clip`` / ``clip_high`` as everywhere.
    """

    name = "cispo"


@dataclass(frozen=True)
class GSPO(PPO):
    """GSPO-token (Zheng et al. 2025, arXiv:2507.18071, Eq. 5-7): PPO's clip on the sequence ratio
    ``s = exp(mean_t log r)`` over the completion. PPO's datums with loss ``gspo``; the paper's band is
    tiny (clip 3e-4, clip_high 4e-4), ours PPO's 0.2."""

    name = "gspo"


@dataclass(frozen=True)
class DPPO(PPO):
    """DPPO (arXiv:2602.04879): a binary trust-region mask on probability moved instead of PPO's clip.

    PPO's datums with loss ``dppo``: a token whose probability rose more than ``delta_high`` (A > 0) or
    fell more than ``delta_low`` (A < 0) carries nothing; ``divergence`` picks total variation or the
    binary KL. ``clip`` is not read.
    """

    name = "dppo"

    delta_low: float = knob()
    delta_high: float = knob()
    divergence: str = knob()

    def loss_config(self) -> dict[str, Any]:
        return {"delta_low": self.delta_low, "delta_high": self.delta_high, "dppo_type": self.divergence}


@dataclass(frozen=True)
class SAPO(PPO):
    """SAPO (arXiv:2511.20347): a soft, temperature-controlled gate on the ratio instead of a hard clip.

    PPO's datums with loss ``sapo``: ``-sigmoid(tau (r - 1)) 4/tau A``, tau = ``tau_pos`` where A > 0,
    ``tau_neg`` otherwise. A provider that does not advertise ``sapo`` must refuse it (no substitute).
    """

    name = "sapo"

    tau_pos: float = knob()
    tau_neg: float = knob()

    def loss_config(self) -> dict[str, Any]:
        return {"tau_pos": self.tau_pos, "tau_neg": self.tau_neg}


# --------------------------------------------------------------------- DAPO
@dataclass(frozen=True)
class DAPO(GRPO):
    """DAPO (Yu et al. 2025, arXiv:2503.14476): GRPO with clip-higher, token-level normalization, overlong
    filtering and dynamic sampling; loss ``ppo`` with the bounds 1 - 0.2 and 1 + 0.28.

    Per group: a truncated row is filtered out (``truncated="mask"``); while fewer than ``min_retained``
    untruncated rows remain, ``run_spec().plan`` asks the loop for ``rollouts_per_prompt`` more from the same weights,
    at most ``max_rounds`` times; a group still short is not admitted; with ``dynamic_sampling`` a group
    whose kept rewards are all equal is not admitted either. Of a group, the first
    ``max(rollouts_per_prompt, min_retained)`` untruncated rows count. Then GRPO's sample-std advantage over the
    kept rows, divided by N, the action tokens of every admitted row (``loss_type="bnpo"``, Eq. 8). No
    provider exposes the paper's dual clip: this is PPO's clip with asymmetric bounds.
    """

    name = "dapo"

    min_retained: int = knob()
    max_rounds: int = knob()
    dynamic_sampling: bool = knob()

    def _run_spec(self) -> dict[str, Any]:
        return {**super()._run_spec(), "plan": self.plan}

    def plan(self, rows: Iterable[Mapping[str, Any]], tasks: Iterable[Hashable] = ()) -> SamplingPlan:
        """Resample ``rollouts_per_prompt`` more for a prompt with fewer than ``min_retained`` untruncated rows, until
        it has them or has had ``max_rounds`` extra rounds (``tasks``: prompts that may have no rows yet)."""
        drawn: dict[Hashable, int] = dict.fromkeys(tasks, 0)
        kept: dict[Hashable, int] = dict.fromkeys(tasks, 0)
        for row in rows:
            task = row.get("task_id")
            drawn[task] = drawn.get(task, 0) + 1
            kept[task] = kept.get(task, 0) + (0 if row.get("truncated") else 1)
        resample, done, exhausted = {}, [], []
        for task, n in drawn.items():
            rounds = max(n - self.rollouts_per_prompt, 0) // self.rollouts_per_prompt
            if kept[task] >= self.min_retained:
                done.append(task)
            elif rounds < self.max_rounds or n == 0:
                resample[task] = self.rollouts_per_prompt
            else:
                exhausted.append(task)
        return SamplingPlan(resample, tuple(done), tuple(exhausted))

    def _admit(self, batch: Batch, groups: Groups, rewards_B: np.ndarray,
               admitted_B: np.ndarray) -> tuple[np.ndarray, list[str], dict[str, float]]:
        g = groups.index_B
        admitted_B = admitted_B.copy()
        rank_B = np.zeros(batch.size, dtype=np.int64)  # order among its group's untruncated rows
        seen = np.zeros(groups.count, dtype=np.int64)
        for i in np.flatnonzero(admitted_B):
            rank_B[i], seen[g[i]] = seen[g[i]], seen[g[i]] + 1
        admitted_B &= rank_B < max(self.rollouts_per_prompt, self.min_retained)
        count_G = np.bincount(g, weights=admitted_B, minlength=groups.count)
        short_G = count_G < self.min_retained
        uniform_G = ~short_G & group_stats(rewards_B, groups, admitted_B).unanimous_G & self.dynamic_sampling
        admitted_B &= ~(short_G | uniform_G)[g]
        stats = {"groups_short": float(short_G.sum()), "groups_uniform": float(uniform_G.sum()),
                 "groups_kept": float(groups.count - short_G.sum() - uniform_G.sum())}
        notes = []
        if short_G.any():
            notes.append(f"{plural(int(short_G.sum()), 'group')} {key_list([groups.keys_G[k] for k in np.flatnonzero(short_G)])} "
                         f"kept fewer than min_retained={self.min_retained} untruncated rollouts and carry nothing: "
                         "raise max_tokens or max_rounds")
        if uniform_G.any():
            notes.append(f"{plural(int(uniform_G.sum()), 'group')} had equal rewards and carry nothing (dynamic "
                         "sampling); their tokens leave the 1/N normalizer")
        return admitted_B, notes, stats


# --------------------------------------------------------------------- REINFORCE++
K2_WHY = "REINFORCE++'s K2 penalty 1/2 (log pi - log pi_ref)^2 reads the frozen reference's log-probabilities"
RETURN_EPSILON = 1e-8  # OpenRLHF's epsilon in the batch normalization


@dataclass(frozen=True)
class ReinforcePP(SampledPerPrompt):
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): REINFORCE with a per-token K2 penalty to a frozen reference.

    ``k2_t = 1/2 (log mu_t - log pi_ref,t)^2`` at each action token, ``mu`` the sampler's log-probability
    (``behavior_logprobs``; the rows' ``logprobs`` when absent) and ``ref_logprobs`` the reference's.

    ``kl_in="return"`` (the paper, OpenRLHF's ``reinforce``): ``G_t = R - beta sum_{s >= t} k2_s`` over the
    row's action tokens, then ``a = (G - mean) / (std + 1e-8)`` over every action token of the batch
    (population std). ``kl_in="token"`` (the service page's reinforce_pp.py):
    ``a_t = (R_i - mean_group(R)) - beta k2_t``. Loss ``importance_sampling``.
    """

    name = "reinforce_pp"
    requires = {"ref_logprobs": K2_WHY}

    kl_coef: float = knob()
    kl_in: str = knob()
    loss: ClassVar[str] = "importance_sampling"

    run_settings = {"max_lag": None, "needs": ("ref_logprobs",)}

    def _update(self, batch: Batch) -> Update:
        mask_N = batch.action_weight_N
        k2_N = 0.5 * (batch.behavior_logprobs_N - batch.token_fields["ref_logprobs"]) ** 2 * mask_N
        if self.kl_in == "token":
            groups = group_by(batch.row_field("task_id", self.name, GROUP_WHY), "task_id")
            mean_G = group_stats(batch.rewards_B, groups, np.ones(batch.size, dtype=bool)).mean_G
            advantage_N = (batch.spread(batch.rewards_B - mean_G[groups.index_B]) - self.kl_coef * k2_N) * mask_N
        else:
            advantage_N = self._normalized_returns(batch, k2_N)
        coefficients_N = losses.coefficients(self.loss, batch, advantage_N, {})
        admitted_B = np.ones(batch.size, dtype=bool)
        stats = base_stats(batch, admitted_B)
        stats["mean_k2"] = float(k2_N.sum() / max(batch.action_count, 1))
        return Update(self.name, batch.split(coefficients_N), batch.split(advantage_N), admitted_B, stats)

    def _normalized_returns(self, batch: Batch, k2_N: np.ndarray) -> np.ndarray:
        """R - beta * (the penalty from this token to the row's end), z-scored over the batch's action tokens."""
        inclusive_N = np.cumsum(k2_N)
        before_row_B = np.concatenate([[0.0], inclusive_N])[batch.offsets[:-1]]
        to_end_N = batch.spread(batch.per_row_sum(k2_N) + before_row_B) - inclusive_N + k2_N
        returns_N = batch.spread(batch.rewards_B) - self.kl_coef * to_end_N
        action = batch.action_mask_N
        mean, std = returns_N[action].mean(), returns_N[action].std()
        return np.where(action, (returns_N - mean) / (std + RETURN_EPSILON), 0.0)
