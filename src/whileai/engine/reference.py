"""The reference policy: the model as it was before training, for KL terms and ref_logprobs.

    reference = ReferencePolicy(model)      # decide once, at construction, before the first step
    ref_BT = reference.logprobs(input_ids_BT, targets_BT)

Under LoRA (a PEFT model) the reference is the same model with its adapters switched off
(``model.disable_adapter()``): the frozen base weights are the pre-training policy, so it costs no
second copy of anything. For full fine-tuning there is no untouched copy left in the model, so the
reference is a frozen deep copy made at construction (build it before training starts); ``reset_to(model)``
re-takes it from the policy later (``wai train`` does after its supervised warm start), and ``save`` / ``load``
keep it with a checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from whileai.engine.logprobs import hidden_states, token_logprobs
from whileai.errors import BatchError, ConfigError


def has_adapters(model: Any) -> bool:
    """True for a PEFT model, whose base weights stay frozen and can be reached with adapters off."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """``model`` in eval mode (no dropout) inside the block, back in the mode it had after it."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _ids(name: str, value: Any) -> torch.Tensor:
    try:
        return torch.as_tensor(value, dtype=torch.long)
    except (TypeError, ValueError, RuntimeError) as err:
        raise BatchError(f"{name} is not a rectangular array of integer token ids ({err}); give (B, T) or "
                         "(T,) ids") from None


def _check_inputs(input_ids: Any, targets: Any, attention_mask: Any) -> tuple[torch.Tensor, ...]:
    input_ids_BT = _ids("input_ids", input_ids)
    targets_BT = _ids("targets", targets)
    if input_ids_BT.dim() == 1:
        input_ids_BT, targets_BT = input_ids_BT.unsqueeze(0), targets_BT.unsqueeze(0)
        attention_mask = None if attention_mask is None else torch.as_tensor(attention_mask).unsqueeze(0)
    if input_ids_BT.shape != targets_BT.shape or input_ids_BT.dim() != 2:
        raise BatchError(f"input_ids {tuple(input_ids_BT.shape)} and targets {tuple(targets_BT.shape)} must have "
                         "the same shape (B, T) or (T,): position i's target is the token that follows it")
    mask_BT = None if attention_mask is None else _ids("attention_mask", attention_mask)
    if mask_BT is not None and mask_BT.shape != input_ids_BT.shape:
        raise BatchError(f"attention_mask {tuple(mask_BT.shape)} must have the shape of input_ids "
                         f"{tuple(input_ids_BT.shape)}")
    return input_ids_BT, targets_BT, mask_BT


def model_logprobs(model: Any, input_ids: Any, targets: Any, attention_mask: Any = None) -> torch.Tensor:
    """``log pi(targets | prefix)`` per position ``(B, T)`` (or ``(T,)``) of ``model`` as it is, no grad.

    Positions where ``attention_mask`` is 0 are returned as 0.0.
    """
    one_sequence = _ids("input_ids", input_ids).dim() == 1
    input_ids_BT, targets_BT, mask_BT = _check_inputs(input_ids, targets, attention_mask)
    device = next(model.parameters()).device
    input_ids_BT, targets_BT = input_ids_BT.to(device), targets_BT.to(device)
    mask_BT = None if mask_BT is None else mask_BT.to(device)
    with torch.no_grad(), eval_mode(model):
        hidden_BTH = hidden_states(model, input_ids_BT, mask_BT)
        positions = None if mask_BT is None else mask_BT.reshape(-1).bool()
        flat = token_logprobs(model, hidden_BTH.reshape(-1, hidden_BTH.shape[-1]), targets_BT.reshape(-1), positions)
    logprobs_BT = flat.reshape(targets_BT.shape)
    return logprobs_BT[0] if one_sequence else logprobs_BT


def reference_logprobs(model: Any, input_ids: Any, targets: Any, attention_mask: Any = None) -> torch.Tensor:
    """Reference log-probabilities: a PEFT model with its adapters disabled; any other model as it is.

    For a full fine-tune, pass the frozen copy (or use :class:`ReferencePolicy`, which keeps one).
    """
    if has_adapters(model):
        with model.disable_adapter():
            return model_logprobs(model, input_ids, targets, attention_mask)
    return model_logprobs(model, input_ids, targets, attention_mask)


class ReferencePolicy:
    """The pre-training policy, decided at construction from the kind of model.

    - PEFT model: shares the model and runs it with adapters disabled (``shares_weights`` is True).
    - Anything else: a deep copy, frozen (``requires_grad=False``) and in eval mode, made now.
    """

    def __init__(self, model: Any) -> None:
        self.shares_weights = has_adapters(model)
        if self.shares_weights:
            self.model = model
        else:
            self.model = copy.deepcopy(model).eval()
            self.model.requires_grad_(False)

    def reset_to(self, model: Any) -> None:
        """Make the frozen copy equal to ``model``'s weights now (e.g. the policy after a supervised warm start).
        Refused under LoRA: there the reference is the adapter-free base, which has no other weights to take."""
        if self.shares_weights:
            raise ConfigError("the reference of a LoRA model is the model with its adapters switched off, so it "
                              "cannot be re-taken from the trained weights; train every weight (lora_rank 0) to "
                              "make the reference the policy at a later point")
        with torch.no_grad():
            self.model.load_state_dict(model.state_dict())

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the frozen copy's weights to ``path`` (atomically: a temporary file, then a rename)."""
        target = Path(path)
        partial = target.with_name(target.name + ".partial")
        torch.save(self.model.state_dict(), partial)
        os.replace(partial, target)

    def load(self, path: str | os.PathLike[str]) -> None:
        """Read weights written by :meth:`save` into the frozen copy."""
        with torch.no_grad():
            self.model.load_state_dict(torch.load(path, map_location=next(self.model.parameters()).device,
                                                  weights_only=True))

    def logprobs(self, input_ids: Any, targets: Any, attention_mask: Any = None) -> torch.Tensor:
        """Per-position reference log-probabilities (see :func:`model_logprobs`)."""
        return reference_logprobs(self.model, input_ids, targets, attention_mask)

    def extra_parameter_bytes(self, policy: Any) -> int:
        """Bytes of parameter storage the reference holds that ``policy`` does not (0 under LoRA)."""
        policy_storages = {p.untyped_storage().data_ptr() for p in policy.parameters()}
        seen: set[int] = set()
        extra = 0
        for parameter in self.model.parameters():
            storage = parameter.untyped_storage()
            if storage.data_ptr() not in policy_storages and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                extra += storage.nbytes()
        return extra
