"""Methods by name: ``wai.method("grpo")``."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from whileai.errors import ConfigError
from whileai.methods import CLASSES
from whileai.methods.base import REGISTRY, Method, renamed

# The modules of the one class list (``whileai.methods.CLASSES``); importing them fills REGISTRY.
METHOD_MODULES: tuple[str, ...] = tuple(dict.fromkeys(f"whileai.methods.{module}" for module in CLASSES.values()))

# Names that are another method with some knobs set: the service page's (spec 004) GRPO variants and SDPO.
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo_nostd": ("dr_grpo", {"length": "none", "loss": "importance_sampling", "truncated": "keep"}),
    "grpo_len_norm": ("grpo", {"loss": "importance_sampling", "truncated": "keep"}),
    "sdpo": ("opsd", {"privileged": "feedback", "anchor": "initial", "loss": "importance_sampling",
                      "max_ratio": None}),
}


def _load() -> dict[str, type[Method]]:
    for module in METHOD_MODULES:
        importlib.import_module(module)
    return REGISTRY


def method_names() -> list[str]:
    """Every name ``method()`` accepts."""
    return sorted({*_load(), *ALIASES})


def method(name: str, **overrides: Any) -> Method:
    """A method object by its registry name, with ``overrides`` applied to its defaults."""
    registry = _load()
    key = name.strip().lower().replace("-", "_")
    if key in ALIASES:
        key, preset = ALIASES[key][0], {**ALIASES[key][1], **overrides}
    else:
        preset = overrides
    if key not in registry:
        raise ConfigError(f"unknown method {name!r}; valid names: {', '.join(method_names())}")
    preset = renamed(registry[key], preset)
    knobs = [f.name for f in dataclasses.fields(registry[key])] if dataclasses.is_dataclass(registry[key]) else None
    unknown = sorted(set(preset) - set(knobs)) if knobs is not None else []
    if unknown:
        raise ConfigError(f"{key} has no knob {unknown[0]!r}; its knobs are {', '.join(knobs or [])} "
                          "(`wai methods` lists them with their defaults)")
    return registry[key](**preset)
