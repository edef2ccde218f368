"""Teachers: models that score a student's tokens and never train (on-policy distillation).

    teacher = model_teacher(load_model(path))              # OPD: a separate frozen model
    teacher = policy_teacher(engine, "ema", rate=0.01)     # OPSD: the student's own weights
    scores = teacher.score([(context_ids, tokens), ...], distribution, top_k=32)
    teacher.after_step(engine)                             # 'ema': theta_bar <- (1 - rate) theta_bar + rate theta

A teacher of the student's own weights costs, per anchor: ``live`` nothing (the policy in eval mode, no
grad); ``initial`` the engine's reference policy (nothing under LoRA: the adapter-disabled base; a frozen
copy of the model otherwise); ``ema`` one copy of the *trainable* parameters (the adapters under LoRA, the
whole model otherwise), swapped into the policy's parameters for the teacher's forward and back, so the
teacher never needs a second model object.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from whileai.engine.logprobs import DEFAULT_CHUNK, Distribution, hidden_states, select_logprobs, topk_logprobs
from whileai.engine.reference import eval_mode
from whileai.errors import ConfigError

ANCHORS = ("live", "initial", "ema")


@dataclass
class TeacherScores:
    """One sequence's teacher scores on its completion tokens."""

    logprobs: np.ndarray
    """(T,): the teacher's log-probability of each completion token"""
    topk_tokens: np.ndarray | None = None
    """(T, K): the teacher's K most likely tokens at each completion position"""
    topk_logprobs: np.ndarray | None = None
    """(T, K): their log-probabilities"""


class EmaWeights:
    """A moving average of named parameters: ``theta_bar <- (1 - rate) theta_bar + rate theta``."""

    def __init__(self, params: Mapping[str, torch.Tensor], rate: float) -> None:
        if not 0.0 < rate <= 1.0:
            raise ConfigError(f"EMA rate={rate!r} must be in (0, 1], e.g. 0.01")
        self.rate = rate
        self.shadow = {n: p.detach().clone() for n, p in params.items()}

    def update(self, params: Mapping[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, param in params.items():
                self.shadow[name].lerp_(param.detach(), self.rate)  # shadow + rate (theta - shadow)

    @contextlib.contextmanager
    def swapped_in(self, params: Mapping[str, torch.Tensor]) -> Iterator[None]:
        """Run a block with the average in the parameters' place (storage swapped, nothing copied)."""
        self._swap(params)
        try:
            yield
        finally:
            self._swap(params)

    def _swap(self, params: Mapping[str, torch.Tensor]) -> None:
        for name, param in params.items():
            param.data, self.shadow[name] = self.shadow[name], param.data

    def nbytes(self) -> int:
        """Bytes the average holds: one copy of the averaged parameters."""
        return sum(t.numel() * t.element_size() for t in self.shadow.values())

    def state_dict(self) -> dict[str, Any]:
        return {"rate": self.rate, "shadow": {n: t.detach().cpu().clone() for n, t in self.shadow.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state["shadow"]) != set(self.shadow):
            raise ConfigError("the saved EMA teacher holds other parameters than this model's trainable ones; "
                              "resume with the run's own model and LoRA settings")
        with torch.no_grad():
            for name, tensor in state["shadow"].items():
                self.shadow[name].copy_(tensor)


class Teacher:
    """Scores sequences with a model that never trains; ``model()`` enters it (see the factories below)."""

    def __init__(self, model: Callable[[], Any], precision: Callable[[], Any], device: torch.device,
                 ema: EmaWeights | None = None, micro_batch_tokens: int = 8192,
                 logprob_chunk: int = DEFAULT_CHUNK) -> None:
        self.model, self.precision, self.device, self.ema = model, precision, device, ema
        self.micro_batch_tokens, self.logprob_chunk = micro_batch_tokens, logprob_chunk

    def after_step(self, params: Mapping[str, torch.Tensor]) -> None:
        """Move an EMA teacher toward the student's weights (nothing for the other kinds)."""
        if self.ema is not None:
            self.ema.update(params)

    @torch.no_grad()
    def score(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], distribution: Distribution,
              top_k: int = 0) -> list[TeacherScores]:
        """Per (context, completion): the teacher's log-probabilities of the completion's tokens given the
        context (and the top-k at each of those positions), under ``distribution``."""
        out: list[TeacherScores] = []
        with self.model() as model, eval_mode(model), self.precision():
            for batch in _micro_batches(sequences, self.micro_batch_tokens):
                out += self._score_batch(model, batch, distribution, top_k)
        return out

    def _score_batch(self, model: Any, batch: Sequence[tuple[Sequence[int], Sequence[int]]],
                     distribution: Distribution, top_k: int) -> list[TeacherScores]:
        fulls = [list(c) + list(t) for c, t in batch]
        longest = max(len(f) for f in fulls) - 1
        ids = torch.zeros(len(fulls), longest, dtype=torch.long)
        mask = torch.zeros(len(fulls), longest, dtype=torch.long)
        for b, full in enumerate(fulls):
            ids[b, :len(full) - 1] = torch.tensor(full[:-1])
            mask[b, :len(full) - 1] = 1
        attention = None if bool(mask.all()) else mask.to(self.device)
        hidden_BTH = hidden_states(model, ids.to(self.device), attention)
        scores = []
        for b, (context, tokens) in enumerate(batch):
            where = slice(len(context) - 1, len(context) - 1 + len(tokens))  # position i predicts token i + 1
            hidden_TH = hidden_BTH[b, where]
            targets = torch.tensor(list(tokens), device=self.device)[:, None]
            logp = select_logprobs(model, hidden_TH, targets, chunk_size=self.logprob_chunk,
                                   distribution=distribution)[:, 0]
            score = TeacherScores(logp.double().cpu().numpy())
            if top_k:
                top_ids, top_lp = topk_logprobs(model, hidden_TH, top_k, chunk_size=self.logprob_chunk,
                                                distribution=distribution)
                score.topk_tokens, score.topk_logprobs = top_ids.cpu().numpy(), top_lp.double().cpu().numpy()
            scores.append(score)
        return scores


def model_teacher(loaded: Any, **options: Any) -> Teacher:
    """A separate model (a ``LoadedModel``), frozen: OPD's teacher."""
    loaded.model.requires_grad_(False)
    loaded.model.eval()
    return Teacher(lambda: contextlib.nullcontext(loaded.model), loaded.precision, loaded.device, **options)


def policy_teacher(engine: Any, weights: str, rate: float | None = None, **options: Any) -> Teacher:
    """The engine's own weights as a teacher: 'live' (current), 'initial' (the engine's reference policy) or
    'ema' (a moving average of the trainable parameters, starting from their values now)."""
    if weights not in ANCHORS:
        raise ConfigError(f"teacher weights {weights!r} must be one of {ANCHORS}")
    precision, device = engine.loaded.precision, engine.device
    if weights == "live":
        return Teacher(lambda: contextlib.nullcontext(engine.model), precision, device, **options)
    if weights == "initial":
        if engine.reference is None:
            raise ConfigError("an 'initial' teacher is the engine's reference policy, and this engine keeps none: "
                              "build it with TrainingEngine(..., reference=True)")
        return Teacher(lambda: reference_model(engine.reference), precision, device, **options)
    ema = EmaWeights(engine.named_params, float(rate or 0.0))
    return Teacher(lambda: _with_ema(engine, ema), precision, device, ema=ema, **options)


@contextlib.contextmanager
def reference_model(reference: Any) -> Iterator[Any]:
    """The reference policy's model: the shared model with adapters off, or its frozen copy."""
    if reference.shares_weights:
        with reference.model.disable_adapter():
            yield reference.model
    else:
        yield reference.model


@contextlib.contextmanager
def _with_ema(engine: Any, ema: EmaWeights) -> Iterator[Any]:
    with ema.swapped_in(engine.named_params):
        yield engine.model


def _micro_batches(sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
                   tokens: int) -> Iterator[list[tuple[Sequence[int], Sequence[int]]]]:
    batch: list[tuple[Sequence[int], Sequence[int]]] = []
    longest = 0
    for seq in sequences:
        length = len(seq[0]) + len(seq[1])
        if batch and max(longest, length) * (len(batch) + 1) > tokens:
            yield batch
            batch, longest = [], 0
        batch.append(seq)
        longest = max(longest, length)
    if batch:
        yield batch


def tokenizer_mismatch(student: Any, teacher: Any, vocab_size: int) -> str | None:
    """Why ``teacher``'s tokenizer cannot score ``student``'s token ids (None when every id the student's model
    can write, ``0 .. vocab_size - 1``, is the same token on both sides). Tokens past that (a tokenizer saved
    and reloaded may gain one) are never sampled and do not count."""
    def table(tokenizer: Any) -> dict[int, str]:
        return {i: t for t, i in tokenizer.get_vocab().items() if i < vocab_size}

    mine, theirs = table(student), table(teacher)
    if mine != theirs:
        differ = sorted(i for i in set(mine) | set(theirs) if mine.get(i) != theirs.get(i))
        return (f"{len(differ)} of the student's {vocab_size} token ids are other tokens to the teacher (e.g. id "
                f"{differ[0]}: {mine.get(differ[0])!r} for the student, {theirs.get(differ[0])!r} for the teacher)")
    if student.eos_token_id != teacher.eos_token_id:
        return f"the end-of-sequence ids differ ({teacher.eos_token_id} vs the student's {student.eos_token_id})"
    return None
