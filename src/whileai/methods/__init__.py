"""Every method as a validated config whose ``update(batch)`` returns per-token coefficients and advantages.

numpy only: importing this never imports torch (and the names below resolve on first use). One registry
(``method(name)``, ``method_names()``) over the one class list ``CLASSES``, which ``whileai`` and
``whileai.methods.registry`` read too; a method whose ``run_spec().loss`` is an engine loss sends
``Update.advantages`` through it. See ``docs/methods.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

# The one list of method classes: class name -> the module that defines it (a new method adds its line here).
CLASSES: dict[str, str] = {
    "FlashReinforce": "flash_reinforce", "SAO": "critic", "BPCO": "critic",
    "GRPO": "grouped", "DrGRPO": "grouped", "RLOO": "grouped", "MaxRL": "grouped", "RAE": "grouped",
    "PPO": "policy", "CISPO": "policy", "GSPO": "policy", "DPPO": "policy", "SAPO": "policy", "DAPO": "policy",
    "ReinforcePP": "policy", "CustomLoss": "custom", "Async": "async_", "SFT": "supervised", "DPO": "supervised",
    "RM": "supervised", "OPD": "distill", "OPSD": "distill", "GroupwiseGrading": "shaping",
    "ReinforceAda": "shaping",
}
# the contract and the registry, by module
API: dict[str, str] = {"Method": "base", "Update": "base", "method": "registry", "method_names": "registry"}

__all__ = ["CLASSES", *API, *CLASSES]


def __getattr__(name: str) -> Any:
    module = API.get(name) or CLASSES.get(name)
    if module is None:
        raise AttributeError(f"module 'whileai.methods' has no attribute {name!r}")
    return getattr(importlib.import_module(f"whileai.methods.{module}"), name)
