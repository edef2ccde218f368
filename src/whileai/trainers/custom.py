"""``forward_backward_custom`` on the client side, as the Tinker SDK does it (reference/tinker.md 1.7).

The server's ``forward`` gives every datum's log-probabilities; the user's loss runs here on torch
tensors; its gradient with respect to each scored log-probability, negated, becomes that position's
``cross_entropy`` weight. The kernel is ``-sum w * log p``, so its gradient in ``log p`` is ``-w`` =
``dloss/dlogp``: the server applies exactly the gradient of the user's loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from whileai.errors import BatchError, ConfigError


def _scored(datum: Mapping[str, Any], index: int) -> tuple[np.ndarray, np.ndarray]:
    """The datum's targets and the positions with a nonzero weight (where the engine scores it)."""
    inputs = datum.get("loss_fn_inputs") or {}
    if "weights" not in inputs or "target_tokens" not in inputs:
        raise BatchError(f"datum {index}: forward_backward_custom needs loss_fn_inputs 'target_tokens' and "
                         "'weights' (nonzero on the positions your loss reads)")
    targets = np.asarray(inputs["target_tokens"])
    weights = np.asarray(inputs["weights"], dtype=np.float64)
    mask = (weights != 0).reshape(targets.shape[0], -1).any(axis=1)
    return targets, mask


def custom_weights(data: Sequence[Mapping[str, Any]], outputs: Sequence[Mapping[str, Any]],
                   loss_fn: Callable[..., Any]) -> tuple[list[dict[str, Any]], float, dict[str, float]]:
    """The ``cross_entropy`` datums whose gradient is the user's loss's, the loss's value, its metrics."""
    import torch

    logps, masks, shapes = [], [], []
    for i, (datum, out) in enumerate(zip(data, outputs)):
        targets, mask = _scored(datum, i)
        full = np.asarray(out["logprobs"], dtype=np.float64)
        logps.append(torch.tensor(full[mask], dtype=torch.float64, requires_grad=True))
        masks.append(mask)
        shapes.append(targets.shape)
    result = loss_fn(list(data), logps)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.Tensor)
            and result[0].dim() == 0):
        raise ConfigError("forward_backward_custom: loss_fn must return (a scalar tensor, a dict of floats)")
    loss, metrics = result
    if not bool(torch.isfinite(loss)):
        raise BatchError(f"forward_backward_custom: the loss is {float(loss.detach())}; nothing was sent")
    grads = torch.autograd.grad(loss, logps, allow_unused=True) if loss.requires_grad else [None] * len(logps)
    weighted = []
    for datum, mask, shape, grad in zip(data, masks, shapes, grads):
        weights = np.zeros(shape, dtype=np.float64)
        if grad is not None:
            weights[mask] = -grad.numpy()
        inputs = datum["loss_fn_inputs"]
        weighted.append({"model_input": datum["model_input"],
                         "loss_fn_inputs": {"target_tokens": inputs["target_tokens"], "weights": weights.tolist()}})
    return weighted, float(loss.detach()), {k: float(v) for k, v in dict(metrics).items()}
