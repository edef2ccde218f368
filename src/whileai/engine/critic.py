"""A value head on the policy's final hidden states, with its own AdamW optimizer.

    critic = Critic.for_model(model, learning_rate=1e-5, reward_range=(0.0, 1.0))   # BPCO's bounded head
    hidden_BTH = hidden_states(model, input_ids_BT)            # the policy's forward (whileai.engine.logprobs)
    values_BT = critic.values(hidden_BTH)                       # predictions, no gradient
    loss = critic.train_step(hidden_BTH, targets_BT, mask_BT)   # one AdamW step on the head only

Design choice: the critic shares the policy's trunk and reads its final hidden states **detached**.
It costs one linear layer per position, no second forward and no second copy of the weights, and
its loss never moves the policy. The price is capacity: the critic is a linear probe on features the
policy keeps changing, so it chases a moving target. SAO and BPCO only need a baseline that tracks
the reward; a separate critic model is the step up if that ever falls short (docs/engine-sampling.md).

Bounded output (BPCO, Eq. 9): ``V = R_min + (R_max - R_min) * (1/2 + arctan(z) / pi)`` with ``z``
the head's raw output, so V stays strictly inside the reward range whatever z is.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any, overload

import torch
from torch import nn

from whileai.errors import BatchError, ConfigError


def _check_range(reward_range: Sequence[float]) -> tuple[float, float]:
    try:
        r_min, r_max = (float(r) for r in reward_range)
    except (TypeError, ValueError):
        raise ConfigError(f"reward_range={reward_range!r} must be a pair (R_min, R_max) of numbers") from None
    if not (math.isfinite(r_min) and math.isfinite(r_max) and r_min < r_max):
        raise ConfigError(f"reward_range={reward_range!r} must be finite with R_min < R_max, e.g. (0.0, 1.0)")
    return r_min, r_max


@overload
def bound(z: float, reward_range: Sequence[float]) -> float: ...
@overload
def bound(z: torch.Tensor, reward_range: Sequence[float]) -> torch.Tensor: ...
def bound(z: Any, reward_range: Sequence[float]) -> Any:
    """BPCO's bounded value (Eq. 9): ``R_min + (R_max - R_min) * (1/2 + arctan(z) / pi)``.

    ``z`` is a float or a tensor (elementwise). z = 0 gives the midpoint; z -> +-inf approaches the
    ends without reaching them.
    """
    r_min, r_max = _check_range(reward_range)
    atan = torch.atan(z) if isinstance(z, torch.Tensor) else math.atan(z)
    return r_min + (r_max - r_min) * (0.5 + atan / math.pi)


class ValueHead(nn.Module):
    """Linear map from a hidden state to one scalar per position; optionally bounded (BPCO Eq. 9).

    Initialised to zero, so the first predictions are 0 (unbounded) or the middle of the reward range.
    """

    def __init__(self, hidden_size: int, reward_range: Sequence[float] | None = None) -> None:
        super().__init__()
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1:
            raise ConfigError(f"hidden_size={hidden_size!r} must be a positive integer: the model's "
                              "config.hidden_size (Critic.for_model(model, ...) reads it)")
        self.reward_range = None if reward_range is None else _check_range(reward_range)
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``(..., H) -> (...)`` values, float32."""
        raw = self.linear(hidden_states.to(self.linear.weight.dtype)).squeeze(-1)
        return raw if self.reward_range is None else bound(raw, self.reward_range)


def value_loss(
    values: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    value_clip: float | None = None,
    old_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean over masked positions of the squared error, with PPO's value clip when ``value_clip`` is set.

    ``loss = sum(mask * e) / sum(mask)`` where ``e = (V - R)^2``, or with a clip
    ``e = max((V - R)^2, (V_old + clamp(V - V_old, -clip, clip) - R)^2)``. No factor 1/2.
    """
    squared = (values - targets) ** 2
    if value_clip is not None:
        if old_values is None:
            raise BatchError(f"old_values=None with value_clip={value_clip!r}: the clip needs the critic's "
                             "predictions from when the data was collected; pass old_values, or value_clip=None")
        clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        squared = torch.maximum(squared, (clipped - targets) ** 2)
    return (squared * mask).sum() / mask.sum()


def _positive(name: str, value: Any, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}={value!r} must be a finite number > 0; {fix}")


def _as_float(name: str, data: Any, shape: torch.Size, device: torch.device) -> torch.Tensor:
    try:
        tensor = torch.as_tensor(data, dtype=torch.float32, device=device)
    except (TypeError, ValueError, RuntimeError) as err:
        raise BatchError(f"{name} is not an array of numbers ({err}); give one number per position") from None
    if tensor.shape != shape:
        raise BatchError(f"{name} has shape {tuple(tensor.shape)} but the values have shape {tuple(shape)}; "
                         "give one number per position")
    bad = (~torch.isfinite(tensor)).nonzero()
    if len(bad):
        index = tuple(bad[0].tolist())
        raise BatchError(f"{name}{list(index)} = {tensor[index].item()} is not finite; every entry must be a number")
    return tensor


class Critic:
    """A :class:`ValueHead` plus its own AdamW optimizer and learning rate.

    The policy's optimizer never sees these parameters and this optimizer never sees the policy's.
    ``learning_rate`` has no default here: the method that uses the critic declares it (e.g. SAO's
    ``critic_learning_rate``, BPCO's ``critic_lr``).
    """

    def __init__(
        self,
        hidden_size: int,
        *,
        learning_rate: float,
        reward_range: Sequence[float] | None = None,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        device: str | torch.device = "cpu",
    ) -> None:
        _positive("learning_rate", learning_rate, "the method that uses the critic declares one (e.g. 1e-5)")
        self.head = ValueHead(hidden_size, reward_range).to(device)
        try:
            self.optimizer = torch.optim.AdamW(
                self.head.parameters(), lr=learning_rate, betas=betas, eps=eps, weight_decay=weight_decay
            )
        except (TypeError, ValueError) as err:  # torch's own checks of betas / eps / weight_decay
            raise ConfigError(f"critic optimizer setting rejected: {err} (betas={betas!r}, eps={eps!r}, "
                              f"weight_decay={weight_decay!r}); use betas in [0, 1), eps > 0, "
                              "weight_decay >= 0") from None

    @classmethod
    def for_model(cls, model: Any, *, learning_rate: float, **options: Any) -> Critic:
        """A critic sized for ``model`` (its ``config.hidden_size``) on the model's device."""
        device = next(model.parameters()).device
        return cls(model.config.hidden_size, learning_rate=learning_rate, device=device, **options)

    @property
    def reward_range(self) -> tuple[float, float] | None:
        return self.head.reward_range

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        _positive("learning_rate", value, "e.g. 1e-5")
        for group in self.optimizer.param_groups:
            group["lr"] = value

    def values(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Predicted values ``(...)`` for hidden states ``(..., H)``; no gradient anywhere."""
        with torch.no_grad():
            return self.head(hidden_states.detach())

    def loss(
        self,
        hidden_states: torch.Tensor,
        targets: Any,
        mask: Any = None,
        value_clip: float | None = None,
        old_values: Any = None,
    ) -> torch.Tensor:
        """The critic's loss (see :func:`value_loss`) with a graph into the head only.

        ``mask`` (default all ones) weights positions, e.g. 1 on action tokens and 0 elsewhere.
        """
        values = self.head(hidden_states.detach())
        device = values.device
        targets = _as_float("targets", targets, values.shape, device)
        self._check_targets_in_range(targets)
        mask = torch.ones_like(values) if mask is None else _as_float("mask", mask, values.shape, device)
        if (mask < 0).any() or not mask.sum() > 0:
            raise BatchError("mask must be >= 0 with at least one positive entry (the positions to fit); "
                             "give 1 on the positions the critic should fit and 0 elsewhere")
        if value_clip is not None:
            _positive("value_clip", value_clip, "or None for no clip")
            if old_values is None:
                raise BatchError(f"old_values=None with value_clip={value_clip!r}: the clip needs the critic's "
                             "predictions from when the data was collected; pass old_values, or value_clip=None")
            old_values = _as_float("old_values", old_values, values.shape, device)
        return value_loss(values, targets, mask, value_clip, old_values)

    def train_step(self, *loss_args: Any, **loss_kwargs: Any) -> float:
        """One AdamW step of the head on ``self.loss(...)`` of the same arguments; returns the loss before the step."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(*loss_args, **loss_kwargs)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def _check_targets_in_range(self, targets: torch.Tensor) -> None:
        if self.reward_range is None:
            return
        r_min, r_max = self.reward_range
        outside = ((targets < r_min) | (targets > r_max)).nonzero()
        if len(outside):
            index = tuple(outside[0].tolist())
            raise BatchError(
                f"targets{list(index)} = {targets[index].item()} is outside the bounded critic's reward_range "
                f"({r_min}, {r_max}); the head can never predict it. Widen reward_range or rescale rewards"
            )

    def state_dict(self) -> dict[str, Any]:
        """A copy of the head weights, optimizer state and reward range, for save_state."""
        return copy.deepcopy({"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(),
                              "reward_range": self.reward_range})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("reward_range") != self.reward_range:
            raise ConfigError(f"saved critic has reward_range {state.get('reward_range')} but this one has "
                             f"{self.reward_range}; build the critic with the saved range")
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
