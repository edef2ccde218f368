"""``TrainingEngine``: everything that touches the weights, in the shape of the Tinker training API.

    engine = TrainingEngine("builtin:tiny", lora_rank=8)
    out = engine.forward_backward([datum, ...], "cross_entropy")     # gradients accumulate
    engine.optim_step(AdamParams(learning_rate=1e-3))                 # AdamW, returns the grad norm

Every loss is summed over tokens and datums, so splitting a batch across calls never changes a
gradient. The engine knows no methods: the one training step (score -> ``method.update()`` ->
``forward_backward`` -> ``optim_step``) is ``whileai.loop.step.train_step``, written with these operations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

import whileai.activation_checkpointing as activations
from whileai.engine import state as state_io
from whileai.engine.datums import Prepared, check_tokens, prepare
from whileai.engine.logprobs import (
    DEFAULT_CHUNK,
    Distribution,
    first_impossible,
    hidden_states,
    scoring,
    select_logprobs,
    topk_logprobs,
)
from whileai.engine.losses import LOSSES, LossSpec, loss_spec, per_token_loss, resolve_config
from whileai.engine.models import LoadedModel, adapted_modules, load_model
from whileai.errors import BatchError, ConfigError, WhileaiError
from whileai.knobs import Knob, number

TINKER_ADAM = "Tinker AdamParams (src/tinker/types/optim_step_request.py; reference/tinker.md 1.5)"

# Every AdamParams field, declared once: value, doc, rule, source (the way method knobs are declared).
ADAM_KNOBS: dict[str, Knob] = {
    "learning_rate": Knob(1e-4, "Step size.", number(0.0), TINKER_ADAM),
    "beta1": Knob(0.9, "Decay of the first-moment (mean) estimate.", number(0.0, 1.0, open_high=True), TINKER_ADAM),
    "beta2": Knob(0.95, "Decay of the second-moment (variance) estimate.", number(0.0, 1.0, open_high=True),
                  TINKER_ADAM),
    "eps": Knob(1e-12, "Added to the root of the second moment; must be > 0: a weight whose gradient is 0 would "
                "become NaN (0 / (sqrt(0) + 0)).", number(0.0, open_low=True), TINKER_ADAM,
                why="the Tinker cookbook passes 1e-8; we keep the API's default"),
    "weight_decay": Knob(0.0, "Decoupled weight decay: each step multiplies the weights by "
                         "1 - learning_rate * weight_decay.", number(0.0), TINKER_ADAM),
    "grad_clip_norm": Knob(0.0, "Clip the global gradient norm to this; 0 = no clipping.", number(0.0), TINKER_ADAM),
}


def _adam(name: str) -> Any:
    spec = ADAM_KNOBS[name]
    return field(default=spec.value, metadata={"knob": spec})


@dataclass(frozen=True)
class AdamParams:
    """AdamW settings of one ``optim_step`` (defaults as Tinker's ``AdamParams``; see ``ADAM_KNOBS``)."""

    learning_rate: float = _adam("learning_rate")
    """Step size."""
    beta1: float = _adam("beta1")
    """Decay of the first-moment (mean) estimate."""
    beta2: float = _adam("beta2")
    """Decay of the second-moment (variance) estimate."""
    eps: float = _adam("eps")
    """Added to the root of the second moment (the Tinker cookbook passes 1e-8)."""
    weight_decay: float = _adam("weight_decay")
    """Decoupled weight decay: each step multiplies the weights by 1 - learning_rate * weight_decay."""
    grad_clip_norm: float = _adam("grad_clip_norm")
    """Clip the global gradient norm to this; 0 = no clipping."""

    def __post_init__(self) -> None:
        for name, spec in ADAM_KNOBS.items():
            value = getattr(self, name)
            if name == "eps" and value == 0 and not isinstance(value, bool):
                raise ConfigError("AdamParams.eps=0 must be > 0: a weight whose gradient is 0 would become NaN "
                                  "(0 / (sqrt(0) + 0)); Tinker's default is 1e-12, its cookbook passes 1e-8")
            if (rule := spec.check(value)) is not None:
                raise ConfigError(f"AdamParams.{name}={value!r} must be {rule} (default {spec.value!r})")

    @classmethod
    def knobs(cls) -> dict[str, Knob]:
        """Every field's ``Knob`` (value, doc, rule, source): what CLI help and capabilities read."""
        return dict(ADAM_KNOBS)


if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from whileai.engine.sampling import SamplingParams

P = TypeVar("P", bound="DataclassInstance")


def as_params(cls: type[P], value: object, what: str) -> P:
    """``value`` as a ``cls`` (``AdamParams``/``SamplingParams``): an instance, or a dict of its fields
    (the JSON wire form); anything else, or an unknown field, raises ``ConfigError`` naming the fields."""
    if isinstance(value, cls):
        return value
    fields = list(cls.__dataclass_fields__)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{what} must be a {cls.__name__} or a dict of its fields {fields}, "
                          f"got {type(value).__name__}")
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ConfigError(f"{what} has unknown fields {unknown}; {cls.__name__} has {fields}")
    missing = [name for name, f in cls.__dataclass_fields__.items() if name not in value
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{what} lacks {missing}, which {cls.__name__} requires (it has no default); give "
                          f"{', '.join(f'{m}=...' for m in missing)}")
    return cls(**value)


@dataclass
class ForwardBackwardOutput:
    """Per-datum outputs (``logprobs``, or ``values`` for a value loss) and ``name:reduction`` metrics."""

    loss_fn_outputs: list[dict[str, np.ndarray]]
    metrics: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """Plain lists (JSON): a position whose log-probability was not asked for (NaN) is None."""
        return {"loss_fn_outputs": [{k: _plain(v) for k, v in out.items()} for out in self.loss_fn_outputs],
                "metrics": dict(self.metrics)}


def _plain(values: np.ndarray) -> list[Any]:
    missing = np.isnan(values)
    if not missing.any():
        return list(values.tolist())
    out = values.astype(object)
    out[missing] = None
    return list(out.tolist())


@dataclass
class OptimStepOutput:
    """The global gradient norm before clipping, and the step's metrics."""

    grad_norm: float
    metrics: dict[str, float]

    def __float__(self) -> float:
        return self.grad_norm


@dataclass(frozen=True)
class _Scorer:
    """What a scoring pass runs: the model (the policy, or the reference) and the distribution."""

    model: Any
    distribution: Distribution


class TrainingEngine:
    """A model, its optimizer, and the operations of the training API.

    ``model``: a ``LoadedModel`` or a name for ``load_model`` (then ``load_kwargs`` go there).
    ``reference``: keep a reference policy for ``compute_logprobs(..., reference=True)`` and for
    methods that need ``ref_logprobs``; None = only when it is free (under LoRA).
    ``micro_batch_tokens``: padded tokens per forward pass; splitting never changes a gradient.
    ``activation_checkpointing``: 'auto' (None), 'on' (True) or 'off' (False): keep only each decoder layer's input
    in a backward pass and recompute the rest (less memory, about a third more compute; the same gradients); auto:
    the rule of ``whileai.activation_checkpointing`` (on for >= 1B parameters on a GPU).
    """

    def __init__(self, model: LoadedModel | str = "builtin:tiny", *, reference: bool | None = None,
                 micro_batch_tokens: int = 8192, logprob_chunk: int = DEFAULT_CHUNK,
                 keep_sampler_versions: int = 8, activation_checkpointing: bool | str | None = None,
                 **load_kwargs: Any) -> None:
        for name, value in (("micro_batch_tokens", micro_batch_tokens), ("logprob_chunk", logprob_chunk),
                            ("keep_sampler_versions", keep_sampler_versions)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"TrainingEngine {name}={value!r} must be an integer >= 1; leave it out for the "
                                  "default")
        self.loaded = model if isinstance(model, LoadedModel) else load_model(model, **load_kwargs)
        self.model = self.loaded.model
        self.activation_checkpointing = _checkpointing(self.model, self.loaded.device, activation_checkpointing)
        self.tokenizer = self.loaded.tokenizer
        self.device = self.loaded.device
        self.micro_batch_tokens = micro_batch_tokens
        self.logprob_chunk = logprob_chunk
        self.keep_sampler_versions = keep_sampler_versions
        self.named_params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        defaults = AdamParams()
        self.optimizer = torch.optim.AdamW(list(self.named_params.values()), lr=defaults.learning_rate,
                                           betas=(defaults.beta1, defaults.beta2), eps=defaults.eps,
                                           weight_decay=defaults.weight_decay)
        self.step = 0
        self.critic: Any = None
        self.reference: Any = None
        self.sampler_weights: dict[int, dict[str, torch.Tensor]] = {}
        if reference or (reference is None and self.loaded.lora is not None):
            from whileai.engine.reference import ReferencePolicy

            self.reference = ReferencePolicy(self.model)

    # ------------------------------------------------------------------ info
    @property
    def vocab_size(self) -> int:
        return self.loaded.vocab_size

    @property
    def max_context(self) -> int:
        return self.loaded.max_context

    def info(self) -> dict[str, Any]:
        """Model name, LoRA settings and the layers it adapts, sizes, the weights version (= optimizer
        steps taken), and notes on the setup (e.g. an adapter on the output layer only)."""
        return {"model_name": self.loaded.name, "is_lora": self.loaded.lora is not None,
                "lora": self.loaded.lora, "vocab_size": self.vocab_size, "max_context": self.max_context,
                "adapted_modules": adapted_modules(self.model) if self.loaded.lora is not None else None,
                "notes": list(self.loaded.notes),
                "trainable_parameters": sum(p.numel() for p in self.named_params.values()),
                "activation_checkpointing": self.activation_checkpointing,
                "step": self.step, "device": str(self.device), "dtype": str(self.loaded.dtype),
                "autocast": None if self.loaded.autocast is None else str(self.loaded.autocast),
                "losses": list(LOSSES), "has_critic": self.critic is not None,
                "has_reference": self.reference is not None}

    # ------------------------------------------------------------------ forward passes
    def _microbatches(self, items: Sequence[Any], length_of: Any) -> Iterator[list[Any]]:
        batch: list[Any] = []
        longest = 0
        for item in items:
            grown = max(longest, length_of(item))
            if batch and grown * (len(batch) + 1) > self.micro_batch_tokens:
                yield batch
                batch, grown = [], length_of(item)
            batch.append(item)
            longest = grown
        if batch:
            yield batch

    def _hidden(self, items: Sequence[Prepared], model: Any = None) -> torch.Tensor:
        """Last hidden states ``(B, T, H)`` of right-padded inputs (padding never affects real positions)."""
        longest = max(it.length for it in items)
        ids = torch.zeros(len(items), longest, dtype=torch.long)
        mask = torch.zeros(len(items), longest, dtype=torch.long)
        for b, it in enumerate(items):
            ids[b, :it.length] = torch.from_numpy(it.input_ids)
            mask[b, :it.length] = 1
        attention = None if bool(mask.all()) else mask.to(self.device)
        return hidden_states(self.model if model is None else model, ids.to(self.device), attention)

    def _logprobs_at(self, item: Prepared, hidden_TH: torch.Tensor, where: np.ndarray,
                     scorer: _Scorer) -> torch.Tensor:
        """``logprobs_P[K]`` of the datum's targets at the positions ``where`` is true, float32, differentiable
        (-inf where a truncated distribution gives a target probability 0)."""
        index = torch.from_numpy(np.flatnonzero(where)).to(self.device)
        targets = torch.from_numpy(item.targets).to(self.device)
        targets_PK = targets[index] if targets.dim() == 2 else targets[index][:, None]
        logp = select_logprobs(scorer.model, hidden_TH[index], targets_PK, chunk_size=self.logprob_chunk,
                               distribution=scorer.distribution)
        return logp.squeeze(-1) if item.targets.ndim == 1 else logp

    def _datum_loss(self, spec: LossSpec, config: dict[str, Any], item: Prepared, hidden_TH: torch.Tensor,
                    want: np.ndarray, backward: bool, scorer: _Scorer) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
        """The datum's summed loss over its scored positions, and its output at the scored positions and those
        in ``want`` (``_wanted``): ``logprobs`` (NaN at the positions not asked for, which are never projected;
        in a backward the unscored ones are computed without a gradient), or the critic's ``values`` (likewise
        NaN where not asked for, never computed; in a backward only at the scored positions): the value head, like
        the output layer, reads only the positions whose output is used."""
        where = item.scored if backward else item.scored | want
        if spec.on_values:
            index = torch.from_numpy(np.flatnonzero(where)).to(self.device)
            x_all = self.critic.head(hidden_TH[index].detach())
            name, shape = "values", (item.length,)
        else:
            x_all = self._logprobs_at(item, hidden_TH, where, scorer)
            name, shape = "logprobs", item.targets.shape
        x = x_all[torch.from_numpy(item.scored[where]).to(self.device)]
        _refuse_impossible(x, item, np.flatnonzero(item.scored), f"datum {item.index}", scorer)
        inputs = {k: torch.from_numpy(v[item.scored]).to(self.device) for k, v in item.inputs.items()}
        loss = per_token_loss(spec, x.double(), inputs, config).sum()
        full = np.full(shape, np.nan, dtype=np.float32)
        full[where] = x_all.detach().float().cpu().numpy()
        if name == "logprobs" and backward:
            self._fill_unscored(full, item, hidden_TH, want, scorer)
        return loss, {name: full}

    def _batch_logprobs(self, batch: list[Prepared], hidden_BTH: torch.Tensor, masks: list[np.ndarray],
                        scorer: _Scorer) -> torch.Tensor | None:
        """The log-probabilities of every datum's targets at its ``masks`` positions, concatenated in datum
        order (``(P,)``, or ``(P, K)`` for K targets a position): one gather of the hidden states and one chunked
        projection for the whole micro-batch, not one per datum. None when the datums' target shapes differ."""
        if len({item.targets.shape[1:] for item in batch}) != 1:
            return None
        rows = np.concatenate([np.full(int(m.sum()), b) for b, m in enumerate(masks)])
        columns = np.concatenate([np.flatnonzero(m) for m in masks])
        targets = np.concatenate([item.targets[m] for item, m in zip(batch, masks)])
        hidden_PH = hidden_BTH[torch.from_numpy(rows).to(self.device), torch.from_numpy(columns).to(self.device)]
        targets_PK = torch.from_numpy(targets).to(self.device)
        flat = targets_PK.dim() == 1
        if flat:
            targets_PK = targets_PK[:, None]
        # projected datum by datum (a chunk never spans two): each position's log-probability comes out of the same
        # matrix product, bit for bit, as when each datum was scored alone
        counts = [int(m.sum()) for m in masks]
        logp = torch.cat([select_logprobs(scorer.model, h, t, chunk_size=self.logprob_chunk,
                                          distribution=scorer.distribution)
                          for h, t in zip(hidden_PH.split(counts), targets_PK.split(counts))])
        return logp.squeeze(-1) if flat else logp

    def _batch_loss(self, spec: LossSpec, config: dict[str, Any], batch: list[Prepared], hidden_BTH: torch.Tensor,
                    wants: list[np.ndarray], outputs: list[dict[str, np.ndarray]], backward: bool,
                    scorer: _Scorer) -> torch.Tensor | None:
        """``_datum_loss`` for a whole micro-batch of log-probability losses with the per-datum work batched:
        one projection (``_batch_logprobs``), one copy of the inputs to the device and one of the outputs back,
        one check for impossible targets; the loss itself per datum (a sequence loss reads its own datum).
        None where the datums differ in target shape or inputs (then ``_datum_loss`` runs per datum)."""
        if len({tuple(sorted(item.inputs)) for item in batch}) != 1:
            return None
        where = [item.scored if backward else item.scored | wants[item.index] for item in batch]
        x_all = self._batch_logprobs(batch, hidden_BTH, where, scorer)
        if x_all is None:
            return None
        scored_in_where = np.concatenate([item.scored[w] for item, w in zip(batch, where)])
        x = x_all if scored_in_where.all() else x_all[torch.from_numpy(scored_in_where).to(self.device)]
        counts = [int(item.scored.sum()) for item in batch]
        first = first_impossible(x)
        if first is not None:
            b = int(np.searchsorted(np.cumsum(counts), first, side="right"))
            item = batch[b]
            _refuse_impossible(x.split(counts)[b], item, np.flatnonzero(item.scored), f"datum {item.index}", scorer)
        inputs = {k: torch.from_numpy(np.concatenate([item.inputs[k][item.scored] for item in batch])).to(self.device)
                  .split(counts) for k in batch[0].inputs}
        x_parts = x.double().split(counts)
        losses = [per_token_loss(spec, x_parts[b], {k: v[b] for k, v in inputs.items()}, config).sum()
                  for b in range(len(batch))]
        values = x_all.detach().float().cpu().numpy()
        rest = [wants[item.index] & ~item.scored if backward else np.zeros(item.length, bool) for item in batch]
        filled = None
        if any(r.any() for r in rest):  # asked for, outside the loss: without a gradient
            with torch.no_grad():
                filled = self._batch_logprobs(batch, hidden_BTH.detach(), rest, scorer)
        filled_values = None if filled is None else filled.float().cpu().numpy()
        start = start_rest = 0
        for item, w, r in zip(batch, where, rest):
            full = np.full(item.targets.shape, np.nan, dtype=np.float32)
            n = int(w.sum())
            full[w] = values[start:start + n]
            start += n
            if filled_values is not None:
                full[r] = filled_values[start_rest:start_rest + int(r.sum())]
                start_rest += int(r.sum())
            outputs[item.index] = {"logprobs": full}
        return torch.stack(losses).sum()

    def _fill_unscored(self, full: np.ndarray, item: Prepared, hidden_TH: torch.Tensor, want: np.ndarray,
                       scorer: _Scorer) -> None:
        """``full`` at the positions asked for that the loss does not read: their log-probabilities, outside the
        graph."""
        rest = want & ~item.scored
        if rest.any():
            with torch.no_grad():
                full[rest] = self._logprobs_at(item, hidden_TH.detach(), rest, scorer).float().cpu().numpy()

    @contextlib.contextmanager
    def _mode(self, train: bool) -> Iterator[None]:
        was = self.model.training
        self.model.train(train)
        try:
            yield
        finally:
            self.model.train(was)

    def _run(self, data: Sequence[Any], loss_fn: str, loss_fn_config: Mapping[str, Any] | None,
             backward: bool, sampling_params: object = None, reference: bool = False,
             logprobs_for: Any = "every") -> ForwardBackwardOutput:
        spec = loss_spec(loss_fn)
        config = resolve_config(loss_fn, loss_fn_config)
        distribution = scoring(sampling_params)
        if spec.on_values:
            self._check_value_loss(loss_fn, sampling_params, reference)
        items = prepare(data, spec, self.vocab_size, self.max_context)
        wants = _wanted(items, logprobs_for)
        outputs: list[dict[str, np.ndarray]] = [{} for _ in items]
        total = 0.0
        with self._mode(backward), self._policy(reference) as model:
            scorer = _Scorer(model, distribution)
            for done, batch in enumerate(self._microbatches(items, lambda it: it.length)):
                try:
                    total += self._run_batch(spec, config, batch, wants, outputs, backward, scorer)
                except WhileaiError as err:
                    if not (backward and done):
                        raise
                    raise type(err)(f"{err}. The gradients of the {done} micro-batch(es) before it (datums "
                                    f"0..{batch[0].index - 1}) were already added to the accumulated ones: call "
                                    "engine.zero_grad() before retrying the batch") from err
        tokens = sum(int(it.scored.sum()) for it in items)
        metrics = {"loss:sum": total, "num_tokens:sum": float(tokens), "num_datums:sum": float(len(items))}
        return ForwardBackwardOutput(outputs, metrics)

    def _check_value_loss(self, loss_fn: str, sampling_params: object, reference: bool) -> None:
        if self.critic is None:
            raise ConfigError(f"loss {loss_fn!r} trains the critic, and this engine has none: call "
                              "engine.add_critic(learning_rate=...) first")
        if sampling_params is not None or reference:
            raise ConfigError(f"loss {loss_fn!r} fits the critic's values, which no sampling distribution or "
                              f"reference policy changes; drop sampling_params={sampling_params!r} and "
                              f"reference={reference!r}")

    def _run_batch(self, spec: LossSpec, config: dict[str, Any], batch: list[Prepared], wants: list[np.ndarray],
                   outputs: list[dict[str, np.ndarray]], backward: bool, scorer: _Scorer) -> float:
        """One micro-batch: forward (under the model's autocast), the summed loss, its backward."""
        with self.loaded.precision():
            with torch.set_grad_enabled(backward and not spec.on_values):  # a value loss trains the head only
                hidden = self._hidden(batch, scorer.model)
            with torch.set_grad_enabled(backward):
                batched = None if spec.on_values else self._batch_loss(spec, config, batch, hidden, wants, outputs,
                                                                       backward, scorer)
                if batched is not None:
                    loss_sum = batched
                else:
                    losses = []
                    for b, item in enumerate(batch):
                        loss, outputs[item.index] = self._datum_loss(spec, config, item, hidden[b, :item.length],
                                                                     wants[item.index], backward, scorer)
                        losses.append(loss)
                    loss_sum = torch.stack(losses).sum()
        _check_finite_loss(loss_sum, spec.name, batch)
        if backward and loss_sum.requires_grad:
            loss_sum.backward()
        return float(loss_sum.detach())

    def forward_backward(self, data: Sequence[Any], loss_fn: str, loss_fn_config: Mapping[str, Any] | None = None,
                         *, sampling_params: object = None, logprobs_for: Any = "every") -> ForwardBackwardOutput:
        """Compute the summed loss of ``data`` and add its gradient to the accumulated one.

        ``sampling_params`` (a ``SamplingParams`` or a dict of its fields; None = the model's own
        distribution): score, and differentiate, the log-probabilities of the distribution the sampler
        draws from with those settings (logits / temperature, then top-k / top-p renormalised). A scored
        target that truncation removes has probability 0 and raises ``BatchError``; temperature 0 is refused.
        ``logprobs_for``: the positions whose log-probabilities come back (``LOGPROBS_FOR``); only those
        and the loss's are projected through the output layer.
        """
        return self._run(data, loss_fn, loss_fn_config, backward=True, sampling_params=sampling_params,
                         logprobs_for=logprobs_for)

    def forward_backward_custom(self, data: Sequence[Any], loss_fn: Any, *, sampling_params: object = None,
                                logprobs_for: Any = "every") -> ForwardBackwardOutput:
        """One forward with gradients over all of ``data``, a loss of your own, one backward (Tinker's op).

        ``loss_fn(data, logprobs) -> (loss, metrics)`` gets, per datum, a tensor of the log-probabilities of
        its scored target tokens (positions with nonzero weight; float64, with gradient) and returns a scalar
        tensor to minimise and a dict of floats. Unlike ``forward_backward`` the whole batch is one forward
        (memory grows with the batch, not the micro-batch): it is the single pass that both scores the tokens
        and trains on them, for a batch that fits. ``sampling_params`` and ``logprobs_for`` as in
        ``forward_backward``.
        """
        items = prepare(data, LOSSES["cross_entropy"], self.vocab_size, self.max_context)
        if not items:
            raise BatchError("forward_backward_custom needs at least one datum")
        wants = _wanted(items, logprobs_for)
        scorer = _Scorer(self.model, scoring(sampling_params))
        counts = [int(item.scored.sum()) for item in items]
        with self._mode(True), self.loaded.precision():
            hidden = self._hidden(items, scorer.model)
            joined = self._batch_logprobs(items, hidden, [item.scored for item in items], scorer)
            parts = (joined.split(counts) if joined is not None else
                     [self._logprobs_at(item, hidden[b, :item.length], item.scored, scorer)
                      for b, item in enumerate(items)])
            for item, logp in zip(items, parts):
                if first_impossible(logp) is not None:
                    _refuse_impossible(logp, item, np.flatnonzero(item.scored), f"datum {item.index}", scorer)
            logps = [logp.double() for logp in parts]
            result = loss_fn(list(data), logps)
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.Tensor)
                and result[0].dim() == 0):
            raise ConfigError("forward_backward_custom: loss_fn must return (a scalar tensor, a dict of floats)")
        loss, metrics = result
        _check_finite_loss(loss, "custom", items)
        if loss.requires_grad:
            loss.backward()
        outputs = []
        values = torch.cat([logp.detach().float() for logp in parts]).cpu().numpy()  # one copy back
        rest = [want & ~item.scored for item, want in zip(items, wants)]
        filled = None
        if any(r.any() for r in rest):
            with torch.no_grad():
                filled = self._batch_logprobs(items, hidden.detach(), rest, scorer)
        filled_values = None if filled is None else filled.float().cpu().numpy()
        start = start_rest = 0
        for b, (item, n) in enumerate(zip(items, counts)):
            full = np.full(item.targets.shape, np.nan, dtype=np.float32)
            full[item.scored] = values[start:start + n]
            start += n
            if filled_values is not None:
                full[rest[b]] = filled_values[start_rest:start_rest + int(rest[b].sum())]
                start_rest += int(rest[b].sum())
            else:
                self._fill_unscored(full, item, hidden[b, :item.length], wants[b], scorer)
            outputs.append({"logprobs": full})
        return ForwardBackwardOutput(outputs, {"loss:sum": float(loss.detach()), **{k: float(v) for k, v in
                                                                                  dict(metrics).items()}})

    def forward(self, data: Sequence[Any], loss_fn: str = "cross_entropy",
                loss_fn_config: Mapping[str, Any] | None = None, *, sampling_params: object = None,
                reference: bool = False, logprobs_for: Any = "every") -> ForwardBackwardOutput:
        """The same loss and metrics as ``forward_backward``, without gradients (eval mode).

        Like ``forward_backward`` (and Tinker's ``forward``), by default it returns the learner's
        log-probabilities at **every** position (weights 0 included): ``forward(data_with_zero_weights)`` gives
        the log-probabilities a client-side custom loss needs. ``logprobs_for=[n, ...]`` asks for each
        datum's last n positions only (a completion of n tokens after a long prompt costs what the completion
        costs), ``"scored"`` for the loss's (``LOGPROBS_FOR``). ``sampling_params`` as in ``forward_backward``
        (an unscored position whose target truncation removed reads -inf); ``reference=True`` scores under the
        reference policy (a whole batch of ``ref_logprobs``).
        """
        with torch.no_grad():
            return self._run(data, loss_fn, loss_fn_config, backward=False, sampling_params=sampling_params,
                             reference=reference, logprobs_for=logprobs_for)

    # ------------------------------------------------------------------ optimizer
    def optim_step(self, adam_params: AdamParams | Mapping[str, float] | None = None) -> OptimStepOutput:
        """One AdamW step on the accumulated gradients, then clear them. Returns the norm before clipping.

        A critic with accumulated gradients (from ``ppo_critic``) takes a step of its own optimizer.
        A non-finite gradient norm raises and clears the gradients without touching the weights.
        """
        adam = AdamParams() if adam_params is None else as_params(AdamParams, adam_params, "adam_params")
        params = list(self.named_params.values())
        for group in self.optimizer.param_groups:
            group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                         weight_decay=adam.weight_decay)
        max_norm = adam.grad_clip_norm if adam.grad_clip_norm > 0 else math.inf
        grads = [p for p in params if p.grad is not None]
        norm = float(torch.nn.utils.clip_grad_norm_(grads, max_norm)) if grads else 0.0
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise WhileaiError(f"the gradient norm is {norm}; the step was skipped and the gradients cleared. "
                               "Check the weights/advantages for huge values or lower the learning rate")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        metrics = {"grad_norm": norm, "learning_rate": adam.learning_rate}
        if self.critic is not None and any(p.grad is not None for p in self.critic.head.parameters()):
            self.critic.optimizer.step()
            self.critic.optimizer.zero_grad(set_to_none=True)
            metrics["critic_learning_rate"] = self.critic.learning_rate
        self.step += 1
        metrics["step"] = float(self.step)
        return OptimStepOutput(norm, metrics)

    def zero_grad(self) -> None:
        """Drop the accumulated gradients without stepping."""
        self.optimizer.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------ log-probabilities
    def _check_sequence(self, tokens: Any, what: str) -> np.ndarray:
        ids = np.asarray(tokens)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise BatchError(f"{what} must be a non-empty flat list of token ids, got {tokens!r:.80}")
        if ids.size - 1 > self.max_context:
            raise BatchError(f"{what} has {ids.size} tokens; the model's context is {self.max_context}, so "
                             f"position {self.max_context} is past it. Shorten the sequence")
        check_tokens(ids, self.vocab_size, what)
        return ids.astype(np.int64)

    @contextlib.contextmanager
    def _policy(self, reference: bool) -> Iterator[Any]:
        if not reference:
            yield self.model
            return
        if self.reference is None:
            raise ConfigError("this engine keeps no reference policy: build it with TrainingEngine(..., "
                              "reference=True) (free under LoRA, a frozen copy otherwise)")
        if self.reference.shares_weights:
            with self.model.disable_adapter():
                yield self.model
        else:
            yield self.reference.model

    @torch.no_grad()
    def compute_logprobs(self, tokens: Sequence[int], top_k: int = 0, *, reference: bool = False,
                         sampling_params: object = None) -> dict[str, Any]:
        """Per-token log-probabilities of a sequence (``None`` for the first token, which has no context).

        ``top_k > 0`` also returns, at every position, the ``top_k`` most likely tokens as
        ``(token, logprob)`` pairs. ``reference=True`` scores under the reference policy.
        ``sampling_params`` scores under the sampler's distribution with those settings (see
        ``forward_backward``); a token that top-k / top-p removes reads -inf (probability 0).
        """
        ids = self._check_sequence(tokens, "tokens")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k <= self.vocab_size:
            raise ConfigError(f"top_k={top_k!r} must be an integer in [0, {self.vocab_size}]")
        distribution = scoring(sampling_params)
        result: dict[str, Any] = {"logprobs": [None], "topk": [None] if top_k else None, "version": self.step}
        if ids.size < 2:
            return result
        inputs = torch.from_numpy(ids[:-1]).to(self.device)[None]
        targets = torch.from_numpy(ids[1:]).to(self.device)[:, None]
        with self._mode(False), self._policy(reference) as model, self.loaded.precision():
            hidden = hidden_states(model, inputs)[0]
            logp = select_logprobs(model, hidden, targets, chunk_size=self.logprob_chunk, distribution=distribution)
            result["logprobs"] += logp.squeeze(-1).tolist()
            if top_k:
                top_ids, top_lp = topk_logprobs(model, hidden, top_k, chunk_size=self.logprob_chunk,
                                                distribution=distribution)
                result["topk"] += [list(zip(i, v)) for i, v in zip(top_ids.tolist(), top_lp.tolist())]
        return result

    # ------------------------------------------------------------------ sampling
    def save_weights_for_sampler(self) -> int:
        """Snapshot the trainable weights as version ``step``; ``sample(..., version=v)`` uses it later.

        The ``keep_sampler_versions`` most recent snapshots are kept (in memory).
        """
        self.sampler_weights[self.step] = {n: p.detach().clone() for n, p in self.named_params.items()}
        for old in sorted(self.sampler_weights)[:-self.keep_sampler_versions]:
            del self.sampler_weights[old]
        return self.step

    @contextlib.contextmanager
    def weights(self, version: int | None) -> Iterator[None]:
        """Run a block with the weights of a saved sampler version (None: the current weights)."""
        if version is None or (version == self.step and version not in self.sampler_weights):
            yield
            return
        if version not in self.sampler_weights:
            raise ConfigError(f"no sampler weights of version {version}; saved versions: "
                              f"{sorted(self.sampler_weights)}. Call save_weights_for_sampler() at that step")
        current = {n: p.detach().clone() for n, p in self.named_params.items()}
        with torch.no_grad():
            for n, p in self.named_params.items():
                p.copy_(self.sampler_weights[version][n])
        try:
            yield
        finally:
            with torch.no_grad():
                for n, p in self.named_params.items():
                    p.copy_(current[n])

    def sample(self, prompt_tokens: Sequence[Any], num_samples: int,
               sampling_params: SamplingParams | Mapping[str, object] | None, *,
               version: int | None = None) -> list[Any]:
        """Sample continuations (KV cache, batched). One prompt -> a list of ``SampledSequence``;
        a list of prompts -> one such list per prompt. ``sampling_params`` is a ``SamplingParams`` or a
        dict of its fields (``max_tokens`` has no default on purpose). ``version`` picks saved sampler weights."""
        from whileai.engine.generation import sample
        from whileai.engine.sampling import SamplingParams
        from whileai.engine.stops import eos_ids

        sampling_params = as_params(SamplingParams, sampling_params, "sampling_params")
        single = len(prompt_tokens) > 0 and isinstance(prompt_tokens[0], (int, np.integer))
        prompts = [prompt_tokens] if single else prompt_tokens
        with self.weights(version), self.loaded.precision():
            out = sample(self.model, prompts, num_samples, sampling_params,
                         eos_token_id=eos_ids(self.tokenizer, self.model), max_context=self.max_context,
                         decode=self.tokenizer.decode)
        return out[0] if single else out

    # ------------------------------------------------------------------ critic
    def add_critic(self, learning_rate: float, **options: Any) -> Any:
        """Attach a value head with its own AdamW optimizer (``reward_range=`` for BPCO's bounded head)."""
        from whileai.engine.critic import Critic

        unknown = sorted(set(options) - {"reward_range", "weight_decay", "betas", "eps"})
        if unknown:
            raise ConfigError(f"add_critic has no option {unknown[0]!r}; its options are learning_rate, "
                              "reward_range, weight_decay, betas and eps")
        self.critic = Critic.for_model(self.model, learning_rate=learning_rate, **options)
        return self.critic

    # ------------------------------------------------------------------ state and export
    def save_state(self, path: str) -> str:
        """Weights, optimizer, step, RNG (and critic) to ``path``, atomically; returns the snapshot dir."""
        return state_io.save_state(self, path)

    def load_state(self, path: str) -> None:
        """Restore what ``save_state`` wrote (the latest complete snapshot under ``path``)."""
        state_io.load_state(self, path)

    def export(self, path: str, merged: bool = False, overwrite: bool = False, dtype: Any = None) -> str:
        """A PEFT adapter directory (``merged=False``, LoRA only) or a full merged model directory, in ``dtype``
        (None: the model folder's own dtype)."""
        return state_io.export(self, path, merged=merged, overwrite=overwrite, dtype=dtype)


def _checkpointing(model: Any, device: torch.device, asked: Any) -> bool:
    """Turn transformers' gradient checkpointing on (non-reentrant) where ``asked`` ('on' / True) or, for 'auto' /
    None, the rule of ``whileai.activation_checkpointing`` says so; returns whether it is on."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    size = sum(p.numel() for p in base.parameters()) if activations.setting(asked) == "auto" else None
    on, _ = activations.resolve(asked, size, device.type)
    if on:
        if not getattr(base, "supports_gradient_checkpointing", False):
            raise ConfigError(f"activation_checkpointing='on': {type(base).__name__} does not support transformers' "
                              "gradient checkpointing; leave it 'auto' or 'off'")
        options = {"use_reentrant": False}
        if hasattr(base, "activation_checkpointing_enable"):  # its name from transformers 5.2x on
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
    return bool(on)


LOGPROBS_FOR = ("which positions' log-probabilities a forward returns, beside the loss's own (the positions with "
                "a nonzero weight), which are always computed: 'every' (Tinker's contract, the default), 'scored' "
                "(the loss's only), or one integer n per datum: its last n positions (a completion of n tokens). "
                "Only these positions go through the output layer (for a value loss, the value head: the critic's "
                "'values'); the others read NaN")


def _wanted(items: Sequence[Prepared], logprobs_for: Any) -> list[np.ndarray]:
    """Per datum, the positions (bool, (T,)) whose log-probabilities the caller asks for (``LOGPROBS_FOR``)."""
    if isinstance(logprobs_for, str) and logprobs_for in ("every", "scored"):
        return [np.full(it.length, logprobs_for == "every") for it in items]
    if isinstance(logprobs_for, (str, bytes)) or not isinstance(logprobs_for, Sequence) \
            or len(logprobs_for) != len(items):
        raise ConfigError(f"logprobs_for={logprobs_for!r:.80} must be 'every', 'scored' or a list of one integer per "
                          f"datum ({len(items)}): {LOGPROBS_FOR}")
    wants = []
    for item, n in zip(items, logprobs_for):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= item.length:
            raise BatchError(f"logprobs_for[{item.index}]={n!r} must be an integer in [0, {item.length}] (datum "
                             f"{item.index} has {item.length} positions): the number of its last positions to score")
        want = np.zeros(item.length, dtype=bool)
        want[item.length - int(n):] = True
        wants.append(want)
    return wants


def _refuse_impossible(logp: torch.Tensor, item: Prepared, positions: np.ndarray, what: str,
                       scorer: _Scorer) -> None:
    """A scored target of probability 0 under a truncated distribution (top-k / top-p) has no finite
    log-probability, ratio or gradient: raise, naming the row / datum, the position and the token."""
    first = first_impossible(logp)
    if first is None:
        return
    position = int(positions[first])
    token = item.targets[position]
    raise BatchError(f"{what}: target token {token.tolist()} at position {position} (token {first} of the scored ones) "
                     f"has probability 0 under the sampling distribution ({scorer.distribution.describe()}): "
                     "top-k / top-p removes it, so its log-probability is -inf. At lag 0 with the sampler's own "
                     "settings this cannot happen except at a rounding boundary; with older samples the policy "
                     "has moved. Score with the settings the tokens were sampled with, or without truncation "
                     "(top_k=0, top_p=1)")


def _check_finite_loss(loss: torch.Tensor, loss_fn: str, batch: Sequence[Prepared]) -> None:
    if not bool(torch.isfinite(loss)):
        first = batch[0].index
        raise WhileaiError(f"loss {loss_fn!r} is {float(loss.detach())} on datums {first}..{batch[-1].index}: a ratio "
                           "overflowed or an input is extreme. Check logprobs/advantages of those datums; "
                           "their gradient was not added")
