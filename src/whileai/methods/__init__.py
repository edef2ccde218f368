"""Every method as a validated config whose ``update(batch)`` returns per-token coefficients and advantages.

numpy only: importing this never imports torch. One registry (``method(name)``, ``method_names()``); a
method whose ``run_spec().loss`` is an engine loss sends ``Update.advantages`` through it. See
``docs/methods.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

from whileai.methods.base import Method, Update
from whileai.methods.registry import method, method_names

# class name -> the module that defines it, resolved on first use (no loop names: the loop lives above).
CLASSES: dict[str, str] = {
    "FlashReinforce": "flash_reinforce", "SAO": "critic", "BPCO": "critic",
    "GRPO": "grouped", "DrGRPO": "grouped", "RLOO": "grouped", "MaxRL": "grouped", "RAE": "grouped",
    "PPO": "policy", "CISPO": "policy", "GSPO": "policy", "DPPO": "policy", "SAPO": "policy", "DAPO": "policy",
    "ReinforcePP": "policy", "CustomLoss": "custom", "Async": "async_", "SFT": "supervised", "DPO": "supervised",
    "RM": "supervised", "OPD": "distill", "OPSD": "distill", "GroupwiseGrading": "shaping",
    "ReinforceAda": "shaping",
}

__all__ = ["CLASSES", "Method", "Update", "method", "method_names", *CLASSES]


def __getattr__(name: str) -> Any:
    if name not in CLASSES:
        raise AttributeError(f"module 'whileai.methods' has no attribute {name!r}")
    return getattr(importlib.import_module(f"whileai.methods.{CLASSES[name]}"), name)
