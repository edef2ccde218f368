"""whileai: post-training language models with reinforcement learning.

    import whileai as wai

Every method is a small validated config whose ``update(batch)`` returns the coefficient on every
token (``whileai.methods``); graded rows are checked and routed by ``whileai.rows``; the engine
(``whileai.engine``, PyTorch + transformers + PEFT) runs one weighted cross-entropy kernel.

Names are resolved lazily so ``import whileai`` stays fast and never imports torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from whileai._version import __version__
from whileai.errors import BatchError, ConfigError, WhileaiError
from whileai.methods import API as _METHOD_API
from whileai.methods import CLASSES as _METHOD_CLASSES

# name -> the module that defines it. One place; `dir(whileai)` and the docs read it.
_EXPORTS: dict[str, str] = {
    # rows: the batch contract and the graded-rows tools
    "Batch": "whileai.rows.batch",
    "load_rows": "whileai.rows.io",
    "pass_at": "whileai.rows.stats",
    "PassAt": "whileai.rows.stats",
    "holdout_size": "whileai.rows.stats",
    "compare": "whileai.rows.stats",
    "expected_split_share": "whileai.rows.checks",
    "truncated_passes": "whileai.rows.checks",
    "rollouts_per_task": "whileai.rows.checks",
    "band": "whileai.rows.checks",
    "split_share": "whileai.rows.checks",
    "on_policy": "whileai.rows.checks",
    "teacher_clears": "whileai.rows.checks",
    "PROVE_EFFECT": "whileai.rows.checks",
    "select": "whileai.rows.select",
    "selection_report": "whileai.rows.select",
    "route": "whileai.routing",
    "load_graded": "whileai.rows.io",
    "GradedRows": "whileai.rows.io",
    "model_mix": "whileai.rows.checks",
    # methods: the contract, the registry and the classes come from whileai.methods (API, CLASSES), below
    "Endpoint": "whileai.endpoints",
    # the training loop
    "train": "whileai.loop",
    "TrainConfig": "whileai.loop",
    "Run": "whileai.loop",
    "reward_model": "whileai.loop",
    "train_with_controls": "whileai.loop.controls",
    # prime-rl config writer
    "prime_rl_config": "whileai.prime_rl",
    "PrimeRLConfig": "whileai.prime_rl",
    # engine (imports torch when first touched)
    "load_model": "whileai.engine",
    "TrainingEngine": "whileai.engine",
    "AdamParams": "whileai.engine",
    "SamplingParams": "whileai.engine",
}

_EXPORTS.update({name: f"whileai.methods.{module}" for name, module in {**_METHOD_API, **_METHOD_CLASSES}.items()})

__all__ = ["BatchError", "ConfigError", "WhileaiError", "__version__", *_EXPORTS]

# The public sub-packages (whileai.methods, whileai.rows, whileai.engine, ...), found on disk so a new one
# resolves too: `wai.methods.ReinforceAda` works right after `import whileai as wai`. Touching one imports
# it, and only then (whileai.engine imports torch). Left out of __all__ so `import *` imports none of them.
_SUBPACKAGES: frozenset[str] = frozenset(info.name for info in pkgutil.iter_modules(__path__)
                                         if info.ispkg and not info.name.startswith("_"))


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        if name in _SUBPACKAGES:  # importing a sub-package sets it as an attribute of whileai
            return importlib.import_module(f"whileai.{name}")
        raise AttributeError(f"module 'whileai' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*__all__, *_SUBPACKAGES})
