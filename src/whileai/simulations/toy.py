"""A toy policy to prove the update rules on: a table of logits, softmax per state, no network.

A *state* is (task, position). Every trajectory has the same layout of positions: action tokens the
policy writes and environment tokens (tool output) the world writes, e.g. ``"aaeaea"``. The policy's
table gives a distribution over a small vocabulary at every state, environment positions included (a
language model scores tool output too), but only action tokens are drawn from it. The reward is the
share of action tokens equal to the task's target token at that position, so the expected reward of a
table is exact: the mean over tasks and action positions of the probability of the target.

The sampler lags the policy: step ``s`` samples from the table of step ``s - off_policy_steps``, so
``behavior_logprobs`` (the sampler's) and ``logprobs`` (the current table's) differ as in an async
trainer. A tabular critic (one value per state, trained toward the Monte Carlo return) supplies
``values`` for SAO and BPCO; the initial table is the reference; a teacher table that favours the
targets supplies ``teacher_logprobs`` and, when asked, a top-k.

``train(method, steps)`` samples rows, calls ``method.update(rows)`` and applies the coefficients as one
gradient-ascent step on ``sum c * log pi``: for a token ``a`` at state ``s`` the gradient of ``log pi(a|s)``
with respect to the logits of ``s`` is ``onehot(a) - pi(.|s)``, exact in numpy. A top-k coefficient array
``(T, K)`` applies the same rule to each slot's target token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from whileai.methods.base import Method, Update

Row = dict[str, Any]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@dataclass
class ToyWorld:
    """Tasks, the trajectory layout, targets and the environment's tokens; fixed for a run."""

    tasks: int = 4
    vocab: int = 4
    layout: str = "aaeaea"  # 'a' action token, 'e' environment token
    seed: int = 0
    targets: np.ndarray = field(init=False)  # (tasks, positions): the rewarded token at action positions
    env_tokens: np.ndarray = field(init=False)  # (tasks, positions): what the environment writes

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        self.targets = rng.integers(0, self.vocab, size=(self.tasks, len(self.layout)))
        self.env_tokens = rng.integers(0, self.vocab, size=(self.tasks, len(self.layout)))

    @property
    def action_mask(self) -> np.ndarray:
        return np.array([c == "a" for c in self.layout])

    def reward(self, task: int, tokens: np.ndarray) -> float:
        mask = self.action_mask
        return float((tokens[mask] == self.targets[task, mask]).mean())

    def expected_reward(self, logits: np.ndarray) -> float:
        """Exact E[R] under a table: mean probability of the target over tasks and action positions."""
        probs = np.exp(log_softmax(logits))
        mask = self.action_mask
        hit = np.take_along_axis(probs, self.targets[:, :, None], axis=2)[:, :, 0]
        return float(hit[:, mask].mean())

    def teacher_logits(self, strength: float = 3.0) -> np.ndarray:
        """A better policy: logit ``strength`` on each target token, 0 elsewhere."""
        logits = np.zeros((self.tasks, len(self.layout), self.vocab))
        np.put_along_axis(logits, self.targets[:, :, None], strength, axis=2)
        return logits


@dataclass
class TrainResult:
    """Expected reward before every step and after the last; every update and the rows it was given."""

    rewards: list[float]
    updates: list[Update]
    batches: list[list[Row]]
    logits: np.ndarray
    initial_logits: np.ndarray


def sample_rows(world: ToyWorld, sampler_logits: np.ndarray, logits: np.ndarray, rng: np.random.Generator,
                samples_per_task: int, *, values: np.ndarray | None = None, reference: np.ndarray | None = None,
                teacher: np.ndarray | None = None, top_k: int = 0) -> list[Row]:
    """Draw ``samples_per_task`` trajectories per task from the sampler's table; score them."""
    sampler_lp, policy_lp = log_softmax(sampler_logits), log_softmax(logits)
    mask = world.action_mask
    positions = np.arange(len(world.layout))
    rows: list[Row] = []
    for task in range(world.tasks):
        probs = np.exp(sampler_lp[task])
        for _ in range(samples_per_task):
            drawn = (rng.random((len(positions), 1)) > np.cumsum(probs, axis=1)).sum(axis=1)
            tokens = np.where(mask, np.minimum(drawn, world.vocab - 1), world.env_tokens[task])
            row: Row = {
                "reward": world.reward(task, tokens),
                "tokens": tokens.tolist(),
                "logprobs": policy_lp[task, positions, tokens].tolist(),
                "behavior_logprobs": sampler_lp[task, positions, tokens].tolist(),
                "action_mask": mask.tolist(),
                "task_id": f"t{task}",
                "agent": f"agent{task % 2}",
            }
            if values is not None:
                row["values"] = values[task].tolist()
            if reference is not None:
                row["ref_logprobs"] = log_softmax(reference)[task, positions, tokens].tolist()
            if teacher is not None:
                teacher_lp = log_softmax(teacher)[task]
                row["teacher_logprobs"] = teacher_lp[positions, tokens].tolist()
                if top_k:
                    slots = np.argsort(-teacher_lp, axis=1, kind="stable")[:, :top_k]
                    row["teacher_topk_tokens"] = slots.tolist()
                    row["teacher_topk_logprobs"] = np.take_along_axis(teacher_lp, slots, axis=1).tolist()
                    row["topk_logprobs"] = np.take_along_axis(policy_lp[task], slots, axis=1).tolist()
            rows.append(row)
    return rows


def policy_gradient(world: ToyWorld, logits: np.ndarray, rows: Sequence[Mapping[str, Any]],
                    coefficients: Sequence[np.ndarray]) -> np.ndarray:
    """d/dlogits of sum c * log pi over every row, token and slot (exact)."""
    probs = np.exp(log_softmax(logits))
    grad = np.zeros_like(logits)
    for row, c in zip(rows, coefficients):
        task = int(str(row["task_id"])[1:])
        targets = np.asarray(row["teacher_topk_tokens"] if c.ndim == 2 else row["tokens"])
        weights = c if c.ndim == 2 else c[:, None]
        targets = targets if targets.ndim == 2 else targets[:, None]
        for pos in range(len(world.layout)):
            for target, weight in zip(targets[pos], weights[pos]):
                if weight != 0.0:
                    grad[task, pos] -= weight * probs[task, pos]
                    grad[task, pos, target] += weight
    return grad


def train(method: Method, steps: int = 40, *, lr: float = 1.0, samples_per_task: int = 4,
          off_policy_steps: int = 0, world: ToyWorld | None = None, seed: int = 0,
          row_filter: Callable[[Row], bool] | None = None, critic_lr: float = 0.5, teacher: bool = False,
          top_k: int = 0, reference: bool = False, init_scale: float = 0.0) -> TrainResult:
    """Train the toy policy with ``method`` for ``steps`` updates; return the expected reward per step.

    ``row_filter`` keeps only some rows (SFT on passes); ``teacher`` adds teacher log-probabilities
    (``top_k`` > 0 also the teacher's top-k); ``reference`` adds the initial table's log-probabilities.
    """
    world = world or ToyWorld(seed=seed)
    rng = np.random.default_rng(seed + 1)
    shape = (world.tasks, len(world.layout), world.vocab)
    logits = init_scale * rng.standard_normal(shape)
    initial = logits.copy()
    teacher_logits = world.teacher_logits() if teacher else None
    values = np.full((world.tasks, len(world.layout)), 0.5)
    history = [logits.copy()]
    rewards, updates, batches = [world.expected_reward(logits)], [], []
    for step in range(steps):
        sampler = history[max(0, step - off_policy_steps)]
        rows = sample_rows(world, sampler, logits, rng, samples_per_task, values=values,
                           reference=initial if reference else None, teacher=teacher_logits, top_k=top_k)
        if row_filter is not None:
            rows = [r for r in rows if row_filter(r)]
        if not rows:
            rewards.append(rewards[-1])
            history.append(logits.copy())
            continue
        update = method.update(rows)
        logits = logits + lr * policy_gradient(world, logits, rows, update.coefficients)
        values = train_critic(world, values, rows, update, critic_lr)
        updates.append(update)
        batches.append(rows)
        history.append(logits.copy())
        rewards.append(world.expected_reward(logits))
    return TrainResult(rewards, updates, batches, logits, initial)


def train_critic(world: ToyWorld, values: np.ndarray, rows: Sequence[Mapping[str, Any]], update: Update,
                 critic_lr: float) -> np.ndarray:
    """Move each state's value toward its regression target (the update's, else R), mean over rows."""
    total = np.zeros_like(values)
    count = np.zeros_like(values)
    targets = update.value_targets
    for i, row in enumerate(rows):
        task = int(str(row["task_id"])[1:])
        target = np.asarray(targets[i]) if targets is not None else np.full(len(world.layout), row["reward"])
        total[task] += target
        count[task] += 1
    seen = count > 0
    out = values.copy()
    out[seen] += critic_lr * (total[seen] / count[seen] - values[seen])
    return out
