"""How a method must be run: the one typed answer a loop, the service and the prime-rl writer read.

``method.run_spec()`` returns a frozen ``RunSpec``. Nothing above ``whileai.methods`` reads a method's
attributes by name: the group size, sampling temperature, generation cap, the lag the method is built
for, the row fields a loop must fill in, the critic's settings and whether the method carries state
across updates all come from here. Wrappers (``Async``, ``GroupwiseGrading``) delegate explicitly.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Row fields a loop can be asked to fill in, and what fills each one.
FILLABLE: dict[str, str] = {
    "values": "the critic's value at every token (a value head on the policy)",
    "ref_logprobs": "the frozen reference policy's log-probability of every token",
    "teacher_logprobs": "a teacher model's log-probability of every token",
    "teacher_topk": "a teacher model's top-k tokens and log-probabilities at every position",
}

# Where a teacher's weights come from: a separate model the run names, or the student's own weights.
TEACHER_WEIGHTS: dict[str, str] = {
    "model": "a separate frozen model the run names (wai train --teacher builtin:NAME | PATH)",
    "ema": "a moving average of the student's weights, updated after every optimizer step",
    "initial": "the student's starting weights, frozen (the reference policy)",
    "live": "the student's current weights",
}


@dataclass(frozen=True)
class TeacherSpec:
    """The teacher a loop must build to fill ``teacher_logprobs`` (and the top-k fields)."""

    weights: str
    """a key of ``TEACHER_WEIGHTS``"""
    ema_rate: float | None = None
    """'ema' only: theta_bar <- (1 - rate) theta_bar + rate theta after every optimizer step"""
    privileged: str | None = None
    """what the teacher sees after the prompt that the student never does ('reference', 'demonstration',
    'hint', 'feedback'); None: the same prompt as the student"""
    top_k: int = 0
    """the teacher's top-k tokens per position the loop also fills (0: only the sampled token's)"""

    def describe(self) -> str:
        """One sentence: which weights, which context, how many slots."""
        if self.weights == "ema":
            weights = (f"a moving average of the student's weights, theta_bar <- (1 - {self.ema_rate:g}) theta_bar "
                       f"+ {self.ema_rate:g} theta after every optimizer step")
        else:
            weights = TEACHER_WEIGHTS[self.weights]
        context = (f"shown the prompt plus the privileged {self.privileged!r} text the student never sees"
                   if self.privileged else "shown the student's prompt")
        slots = f"; top {self.top_k} tokens per position" if self.top_k else ""
        return f"teacher = {weights}, {context}{slots}"


@dataclass(frozen=True)
class CriticSpec:
    """A value head's training settings."""

    learning_rate: float
    """the critic's own AdamW learning rate"""
    steps: int = 1
    """critic updates per policy update"""
    warmup: int = 0
    """critic-only updates before the policy moves"""
    reward_range: tuple[float, float] | None = None
    """a bounded head's (R_min, R_max); None: an unbounded linear head"""


@dataclass(frozen=True)
class RunSpec:
    """How a method must be run. Every field has the value a loop should use unless told otherwise."""

    rollouts_per_prompt: int = 1
    """trajectories sampled per prompt (the group size of group methods; 1 for one-rollout methods)"""
    temperature: float = 1.0
    """sampling temperature; the trainer scores tokens under the same temperature"""
    max_tokens: int | None = None
    """generation cap per trajectory (None: the loop's or the taskset's)"""
    max_lag: int | None = 0
    """the largest sampler lag, in optimizer steps, the method is built to correct (None: no bound)"""
    min_rollouts_per_prompt: int = 1
    """fewest rollouts per prompt the update can learn from (2 for a baseline taken over a prompt's group)"""
    needs: tuple[str, ...] = ()
    """per-token row fields the loop must fill in before the update (keys of ``FILLABLE``)"""
    critic: CriticSpec | None = None
    """a value head and its settings, for methods whose advantages come from a critic"""
    learning_rate: float | None = None
    """the policy learning rate the method's paper declares (None: the loop's)"""
    stateful: bool = False
    """the update carries state across calls (``update(batch, state=...)``, ``Update.state``)"""
    source: str = "rollouts"
    """'rollouts': the loop samples and grades; 'rows': the method trains on rows as pushed (SFT, DPO, RM)"""
    head: str = "policy"
    """'policy': the coefficients weight log-probabilities; 'score': a scalar head's output (RM)"""
    teacher: TeacherSpec | None = None
    """the teacher that fills ``teacher_logprobs`` / ``teacher_topk`` (None: the method needs none)"""
    loss: str = "cross_entropy"
    """the engine loss the step runs: 'cross_entropy' takes ``Update.coefficients`` as its weights; a named loss
    (ppo, cispo, gspo, dppo, sapo, dro, importance_sampling) takes ``Update.advantages`` per token, with the rows'
    ``behavior_logprobs`` as the sampler's log-probabilities, and computes the live ratio inside the graph"""
    loss_config: tuple[tuple[str, float | str], ...] = ()
    """the named loss's config (Tinker's ``loss_fn_config``) as sorted (key, value) pairs; () for cross_entropy.
    Clip bounds are absolute ratios here (``clip_low_threshold = 1 - clip``, ``clip_high_threshold = 1 +
    clip_high``), converted from the method's relative ``clip`` / ``clip_high``; a provider that takes them per
    token (Tinker Cloud) gets the same numbers as ``loss_fn_inputs``"""
    plan: Callable[[Iterable[Mapping[str, Any]], Iterable[Hashable]], Any] | None = None
    """adaptive sampling: ``plan(rows_so_far, task_ids)`` returns an object whose ``resample`` maps
    task_id -> more rollouts to draw (empty when done); None: one round of ``rollouts_per_prompt``"""

    def describe(self) -> str:
        """One line per setting, for a run's log."""
        if self.source != "rollouts":
            return "; ".join([f"trains on {self.source} as pushed", *(["rows need " + ", ".join(self.needs)]
                                                                      if self.needs else [])]
                             + ([f"trains a scalar {self.head} head"] if self.head != "policy" else []))
        parts = [f"{self.rollouts_per_prompt} rollout{'s' if self.rollouts_per_prompt != 1 else ''} per prompt",
                 f"temperature {self.temperature:g}"]
        if self.max_tokens is not None:
            parts.append(f"max_tokens {self.max_tokens}")
        parts.append("any lag" if self.max_lag is None else f"lag up to {self.max_lag}")
        if self.needs:
            parts.append("rows need " + ", ".join(self.needs))
        if self.critic is not None:
            parts.append(f"critic lr {self.critic.learning_rate:g}, {self.critic.steps} step(s), warm-up "
                         f"{self.critic.warmup}")
        if self.teacher is not None:
            parts.append(self.teacher.describe())
        if self.stateful:
            parts.append("carries state across updates")
        return "; ".join(parts)
