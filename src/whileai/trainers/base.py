"""The ``Trainer`` protocol: what the loop drives and ``wai serve`` serves, and the types of its operations.

A trainer has Tinker's operations (with the engine's ``sampling_params=`` for scoring) and owns its checkpoints:
``save(folder)`` writes one (the weights themselves, or a pointer to a state its server keeps), ``load(folder)``
reads it back, ``export(path)`` writes the final weights, ``close()`` lets its server go. ``Needs`` is what a run
asks of a server trainer; ``refusals`` names each need a server's capabilities cannot meet, before anything is
allocated there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Union, runtime_checkable

if TYPE_CHECKING:
    import torch

    from whileai.engine.sampling import SamplingParams
    from whileai.engine.training import AdamParams

Scoring = Union["SamplingParams", Mapping[str, object], None]
"""The one sampling-parameters type, for sampling and for scoring: the engine's ``SamplingParams``, or its fields
as a dict (the JSON wire form; a logged trace's own settings); None: the model's own distribution."""
Adam = Union["AdamParams", Mapping[str, float], None]
"""A step's optimizer settings: the engine's ``AdamParams`` or its fields (``{"learning_rate": ...}``)."""
LogprobsFor = str | Sequence[int]
"""Which positions' log-probabilities a forward returns (engine.training.LOGPROBS_FOR): "every", "scored" or, per
datum, its last n positions."""
Datum = Mapping[str, Any]
"""One datum: ``model_input`` tokens and ``loss_fn_inputs`` arrays (``whileai.engine.make_datum``)."""
CustomLoss = Callable[[Sequence[Datum], list["torch.Tensor"]], tuple["torch.Tensor", dict[str, float]]]
"""``loss_fn(data, logprobs) -> (loss, metrics)``: each datum's log-probabilities as a tensor, the loss a scalar
tensor (``forward_backward_custom``)."""


class Tokenizer(Protocol):
    """What the loop reads of a tokenizer (transformers' or the built-in byte tokenizer)."""

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...

    def __len__(self) -> int:
        """the vocabulary size, added tokens included"""
        ...


def load_tokenizer(base_model: str) -> Tokenizer:
    """The tokenizer of a built-in model (the byte tokenizer) or of a local / hub model, loaded without the engine
    (what a server trainer and the loop's checks read on this side)."""
    if base_model.startswith("builtin:"):
        from whileai.engine.models import byte_tokenizer

        tokenizer: Tokenizer = byte_tokenizer()
        return tokenizer
    from transformers import AutoTokenizer

    loaded: Tokenizer = AutoTokenizer.from_pretrained(base_model)
    return loaded


class LossOutput(Protocol):
    """What ``forward`` / ``forward_backward`` return: per-datum outputs (``logprobs``, ``values``) and metrics."""

    @property
    def loss_fn_outputs(self) -> Sequence[Mapping[str, Any]]: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...

    def to_dict(self) -> dict[str, Any]:
        """the outputs as plain lists (JSON)"""
        ...


class OptimOutput(Protocol):
    """What ``optim_step`` returns: the gradient norm before clipping, and the step's metrics."""

    @property
    def grad_norm(self) -> float: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...


@runtime_checkable
class Trainer(Protocol):
    """A policy being trained, wherever it runs (``whileai.trainers``: the engine, a ``wai serve``, Tinker)."""

    @property
    def where(self) -> str:
        """how a run names it: 'in-process engine', 'service at URL', 'Tinker API at URL'"""
        ...

    @property
    def url(self) -> str | None:
        """the server it trains on; None in-process"""
        ...

    @property
    def capabilities(self) -> Mapping[str, Any] | None:
        """the server's capabilities answer (what ``refusals`` read); None in-process"""
        ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def step(self) -> int:
        """optimizer steps taken (a checkpoint's name and a teacher's snapshot read it)"""
        ...

    def forward(self, data: Sequence[Datum], loss_fn: str = "cross_entropy",
                loss_fn_config: Mapping[str, Any] | None = None, *, sampling_params: Scoring = None,
                reference: bool = False, logprobs_for: LogprobsFor = "every") -> LossOutput: ...

    def forward_backward(self, data: Sequence[Datum], loss_fn: str, loss_fn_config: Mapping[str, Any] | None = None,
                         *, sampling_params: Scoring = None, logprobs_for: LogprobsFor = "every") -> LossOutput: ...

    def forward_backward_custom(self, data: Sequence[Datum], loss_fn: CustomLoss, *, sampling_params: Scoring = None,
                                logprobs_for: LogprobsFor = "every") -> LossOutput: ...

    def optim_step(self, adam_params: Adam = None) -> OptimOutput: ...

    def sample(self, prompt_tokens: Sequence[Any], num_samples: int, sampling_params: Scoring, *,
               version: int | None = None) -> list[Any]:
        """One prompt (token ids) -> its samples (``tokens``, ``logprobs``, ``stop_reason``); a list of prompts ->
        one list per prompt."""
        ...

    def save_weights_for_sampler(self) -> int:
        """Keep the current weights as version ``step`` for ``sample(..., version=)``; returns the version."""
        ...

    def compute_logprobs(self, tokens: Sequence[int], top_k: int = 0, *, reference: bool = False,
                         sampling_params: Scoring = None) -> dict[str, Any]: ...

    def add_critic(self, learning_rate: float, *, reward_range: Sequence[float] | None = None) -> object:
        """Attach a value head (critic methods); a trainer without one refuses, naming the alternative."""
        ...

    def save(self, folder: Path) -> str:
        """An atomic checkpoint in ``folder`` (weights, optimizer, step); returns where the weights are."""
        ...

    def load(self, folder: Path, *, optimizer: bool = True) -> None:
        """Restore the checkpoint ``save`` wrote in ``folder`` (``optimizer=False``: Adam starts from zero)."""
        ...

    def export(self, path: str, merged: bool = False) -> str:
        """The weights as a new folder at ``path`` (an adapter, or ``merged``, the whole model); returns it."""
        ...

    def close(self) -> None:
        """Let the server's run go (in-process: nothing)."""
        ...


@dataclass(frozen=True)
class Needs:
    """What a run asks of its trainer, read from the method's run spec and the config."""

    loss: str = "cross_entropy"
    reference: bool = False
    critic: tuple[float, tuple[float, float] | None] | None = None
    """(learning rate, reward range) of a value head, or None"""
    policy_teacher: str | None = None
    """a teacher made of the student's own weights ('live', 'initial', 'ema'), or None"""
    retake_reference: bool = False
    """the reference is re-taken after a warm start (full fine-tuning)"""
    export: bool = False
    """the final weights are written to RUN_DIR/final"""
    own_distribution: bool = True
    """every token is scored under the model's own distribution (temperature 1, no top-k / top-p)"""
    loss_config: tuple[str, ...] = ()
    """the config keys the run spec sends with its loss"""


def add_critic(trainer: Trainer, critic: tuple[float, tuple[float, float] | None]) -> None:
    """A value head of (learning rate, reward range) on ``trainer`` (no range: the head's own default)."""
    rate, reward_range = critic
    if reward_range is None:
        trainer.add_critic(rate)
    else:
        trainer.add_critic(rate, reward_range=reward_range)


def refusals(capabilities: Mapping[str, Any], model: str, needs: Needs) -> list[str]:
    """Each need the server's capabilities cannot meet, with the alternative."""
    problems = []
    models = capabilities.get("models")
    if models is not None and model not in models:
        problems.append(f"it does not serve model {model!r} (it serves {', '.join(models)}): start it with "
                        f"`wai serve --model {model}`, or pick one of those with --model")
    operations = capabilities.get("operations", [])
    losses = capabilities.get("losses", {})
    if needs.loss not in losses:
        problems.append(f"the method runs the engine loss {needs.loss!r}, which it does not advertise (it takes "
                        f"{', '.join(losses) or 'none'}): pick a method whose run spec loss is one of those")
    unknown = sorted(set(needs.loss_config) - set(losses.get(needs.loss, {}).get("config", {}))) \
        if needs.loss in losses else []
    if unknown:
        taken = ", ".join(losses[needs.loss].get("config", {})) or "none"
        problems.append(f"the method sends loss {needs.loss!r} the config keys {unknown}, which the server does not "
                        f"take for it (it takes: {taken}): pick a method whose loss it takes with those keys, or "
                        "train on a wai serve (every loss and key)")
    if needs.critic is not None and "add_critic" not in operations:
        problems.append("the method needs a value head and the server cannot attach one (no add_critic): run it "
                        "in-process (drop --url) or pick a method without a critic (grpo, flash_reinforce)")
    if needs.policy_teacher is not None:
        problems.append(f"the method's teacher is the student's own weights ({needs.policy_teacher!r}), which the "
                        "loop reads from an in-process engine only: drop --url, or use a method whose teacher is a "
                        "separate model (opd --teacher MODEL)")
    if capabilities.get("provider") == "tinker" and not (needs.own_distribution and not needs.reference):
        what = "a reference policy" if needs.reference else "tokens sampled at another temperature"
        problems.append(f"the method needs {what} scored, and a Tinker-API server scores under the policy's own "
                        "distribution only: set --set temperature=1 (and beta=0), or train on the local engine "
                        "(a wai serve without --tinker-url, or drop --url)")
    if needs.export and "export_lora" not in operations:
        problems.append("the run writes its final weights to RUN_DIR/final and the server cannot export them (no "
                        "export_lora): add --no-export (the weights stay on the server's side)")
    if needs.retake_reference:
        problems.append("the method's reference policy would be re-taken after the warm start, which a server run "
                        "cannot do (its reference is the model as created): set --warm-start-steps 0, or drop --url")
    return problems
