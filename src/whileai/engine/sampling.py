"""What to sample and what comes back: ``SamplingParams`` (every setting declared once in ``SAMPLING_KNOBS``, with
its rule) and ``SampledSequence``.

    params = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=0)
    sequences = sample(model, [[1, 2, 3], [4, 5]], num_samples=4, params=params, eos_token_id=2)
    sequences[prompt][sample].tokens / .logprobs / .stop_reason     # sample: whileai.engine.generation

The sampler is split by concern: this module (the settings), ``whileai.engine.draw`` (the distribution a token
is drawn from, its log-probability, the random streams), ``whileai.engine.generation`` (the batched loop),
``whileai.engine.kv_cache`` (the key/value buffers), ``whileai.engine.shared_prefix`` (each prompt's keys/values
held once for its samples) and ``whileai.engine.decode`` (one decoding step with the Python work cut).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from whileai.errors import ConfigError
from whileai.knobs import Knob, number

StopReason = Literal["stop", "length"]
TINKER_SAMPLING = "Tinker SamplingParams (reference/tinker.md, 1.5)"


# --------------------------------------------------------------------------------------------------
# The settings, each declared once with its rule


def _whole(low: int) -> Any:
    """An integer (Python or numpy, not bool) >= low."""
    text = f"an integer >= {low}"

    def check(x: Any) -> str | None:
        ok = not isinstance(x, bool) and isinstance(x, (int, np.integer)) and x >= low
        return None if ok else text

    return check


def _optional_seed(x: Any) -> str | None:
    return None if x is None else _whole(0)(x)


def _stop_rule(stop: Any) -> str | None:
    try:
        _normalise_stop(stop)
    except ValueError as err:
        return str(err)
    return None


def _flag(x: Any) -> str | None:
    return None if isinstance(x, bool) else "True or False"


SAMPLING_KNOBS: dict[str, Knob] = {
    "max_tokens": Knob(None, "most tokens to generate per sample (fewer if the model's context runs out first)",
                       _whole(1), TINKER_SAMPLING),
    "temperature": Knob(1.0, "logits are divided by this; 0 means greedy (arg-max)", number(0.0), TINKER_SAMPLING),
    "top_p": Knob(1.0, "nucleus: keep the smallest set of most likely tokens whose mass reaches top_p; 1 = off",
                  number(0.0, 1.0, open_low=True), TINKER_SAMPLING),
    "top_k": Knob(0, "keep only the k most likely tokens; 0 (or Tinker's -1) = off", _whole(-1),
                  f"{TINKER_SAMPLING}; its default is -1, ours 0, both mean off"),
    "stop": Knob((), "stop strings, token ids and/or sequences of ids, e.g. '\\n\\nUser:', [2, 7] or "
                 "[[13, 13], 2, 'User:']; the stop is kept at the end of the returned tokens", _stop_rule,
                 TINKER_SAMPLING),
    "seed": Knob(None, "seed of the random streams; None draws one from torch's global generator",
                 _optional_seed, TINKER_SAMPLING),
    "ignore_eos": Knob(False, "do not stop at the model's end-of-sequence token (Tinker's stop=[]); only "
                       "`stop` and max_tokens end a sample", _flag, "vLLM SamplingParams.ignore_eos"),
}


REQUIRED = ("max_tokens",)
"""Settings without a default (``max_tokens``: a sampler that silently stops at 16 tokens is a classic bug)."""


def _knob(name: str) -> Any:
    spec = SAMPLING_KNOBS[name]
    if name in REQUIRED:
        return field(metadata={"knob": spec})
    return field(default=spec.value, metadata={"knob": spec})


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. Every field's rule is in ``SAMPLING_KNOBS``; all are checked at construction and
    every bad one is reported at once (a ``ConfigError``, a ``ValueError``)."""

    max_tokens: int = _knob("max_tokens")
    """Most tokens to generate per sample (fewer if the model's context runs out first)."""
    temperature: float = _knob("temperature")
    """Logits are divided by this; 0 means greedy (arg-max)."""
    top_p: float = _knob("top_p")
    """Nucleus sampling: keep the smallest set of most likely tokens whose mass reaches top_p; 1 = off."""
    top_k: int = _knob("top_k")
    """Keep only the k most likely tokens; 0 (or Tinker's -1) = off."""
    stop: Any = _knob("stop")
    """Stop strings, token ids and/or stop sequences of ids: ``"\\n\\nUser:"``, ``[2, 7]`` or ``[[13, 13], 2]``.
    Normalised to a tuple whose items are tuples of ids or strings. A string stops a sample at the first
    token after which the decoded completion contains it (the sampler then needs the tokenizer's
    ``decode``). The stop is kept at the end of the returned tokens."""
    seed: int | None = _knob("seed")
    """Seed of the random streams; None draws one from torch's global generator."""
    ignore_eos: bool = _knob("ignore_eos")
    """Do not stop at the model's end-of-sequence token; only ``stop`` and ``max_tokens`` end a sample."""

    def __post_init__(self) -> None:
        problems = []
        for f in dataclasses.fields(self):
            value, spec = getattr(self, f.name), f.metadata["knob"]
            if (rule := spec.check(value)) is not None:
                default = "required" if f.name in REQUIRED else f"default {spec.value!r}"
                problems.append(f"SamplingParams.{f.name}={value!r} is invalid: it must be {rule} "
                                f"({spec.doc}; {default})")
        if problems:
            raise ConfigError("; ".join(problems))
        object.__setattr__(self, "stop", _normalise_stop(self.stop))


@dataclass(frozen=True)
class SampledSequence:
    """One sample: the generated tokens (prompt excluded), the sampler's logprob of each, why it ended."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: StopReason


def _normalise_stop(stop: Any) -> tuple[tuple[int, ...] | str, ...]:
    """``2`` / ``"ab"`` / ``[2, 7]`` / ``[[13, 13], 2, "ab"]`` -> ``((2,),)`` / ``("ab",)`` / ``((2,), (7,))`` /
    ``((13, 13), (2,), "ab")``."""
    if stop is None:
        return ()
    if isinstance(stop, (str, int, np.integer)):
        stop = [stop]
    if not isinstance(stop, Sequence):
        raise ConfigError("stop strings, token ids or sequences of token ids (a str, an int or a list of them), "
                          f"not a {type(stop).__name__}")
    normalised: list[tuple[int, ...] | str] = []
    for index, item in enumerate(stop):
        if isinstance(item, str):
            if not item:
                raise ConfigError(f"non-empty stop strings, but stop[{index}] is ''")
            normalised.append(item)
            continue
        sequence = (item,) if isinstance(item, (int, np.integer)) else tuple(item) if isinstance(
            item, Sequence) else ()
        if not sequence or any(
            isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0 for t in sequence
        ):
            raise ConfigError(f"strings, token ids or non-empty sequences of token ids (integers >= 0), but "
                              f"stop[{index}] is {item!r}")
        normalised.append(tuple(int(t) for t in sequence))
    return tuple(normalised)
