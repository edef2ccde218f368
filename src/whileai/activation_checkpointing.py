"""Activation checkpointing: the setting and its automatic rule, declared once, read by the engine
(``TrainingEngine(activation_checkpointing=...)``) and by the run plan (its row, ``wai train
--activation-checkpointing``). Torch-free, so a plan resolves it before anything loads.

Checkpointing keeps only each decoder layer's input in a backward pass and recomputes the rest: less memory for
about a third more compute, the same gradients (tests/engine/test_checkpointing.py).
"""

from __future__ import annotations

from typing import Any

from whileai.errors import ConfigError
from whileai.knobs import Knob, one_of

SETTINGS = ("auto", "on", "off")
MIN_PARAMETERS = 1_000_000_000
"""auto turns it on from this many parameters (on a GPU)"""

KNOB = Knob("auto", "keep only each decoder layer's input in a backward pass and recompute the rest (less memory, "
            "about a third more compute, the same gradients); auto: on for a model of at least 1B parameters on a "
            "GPU, off on a CPU and for smaller models", one_of(*SETTINGS),
            "whileai (issue 33): a 1.78B full fine-tune peaked at 80.9 GB of an H200 without it, activations and "
            "logits beyond the 28 GB of weights and Adam; on a CPU or a small model the time it costs buys nothing")


def setting(value: Any) -> str:
    """``value`` as one of ``SETTINGS``: the setting itself, or the engine's None / True / False for auto / on / off;
    anything else is a ``ConfigError`` naming the choices."""
    aliases = {None: "auto", True: "on", False: "off"}
    if isinstance(value, bool) or value is None:
        return aliases[value]
    if value in SETTINGS:
        return str(value)
    raise ConfigError(f"activation_checkpointing={value!r} must be one of {', '.join(map(repr, SETTINGS))} "
                      f"(or None, True, False for the same); auto: {KNOB.doc.split('; auto: ')[1]}")


def rule(parameters: int | None, device: str, *, builtin: bool = False) -> tuple[bool, str]:
    """auto's answer for a model of ``parameters`` (None: not known before it loads; ``builtin``: a built-in model,
    all far below 1B) on ``device``, and why."""
    gpu = str(device).startswith("cuda")
    if not gpu:
        return False, f"off on {device} (on only for a model of at least {MIN_PARAMETERS / 1e9:g}B parameters on a GPU)"
    if builtin:
        return False, f"off: a built-in model (all far below {MIN_PARAMETERS / 1e9:g}B parameters) on {device}"
    if parameters is None:
        return False, ("off: the model's size is not known before it loads; --activation-checkpointing on for a "
                       f"model of at least {MIN_PARAMETERS / 1e9:g}B parameters")
    on = parameters >= MIN_PARAMETERS
    size = f"{parameters / 1e9:.2f}B parameters" if parameters >= 10**7 else f"{parameters:,} parameters"
    return on, f"{'on' if on else 'off'}: {size} on {device} (on from {MIN_PARAMETERS / 1e9:g}B on a GPU)"


def resolve(value: Any, parameters: int | None, device: str) -> tuple[bool, str | None]:
    """Whether checkpointing is on, and the rule's reason when ``value`` is auto (None when it was given)."""
    chosen = setting(value)
    if chosen == "auto":
        return rule(parameters, device)
    return chosen == "on", None
