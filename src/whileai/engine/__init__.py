"""The engine: real models on PyTorch + transformers + PEFT, one coefficient kernel, the named losses.

    from whileai.engine import TrainingEngine, AdamParams, make_datum
    engine = TrainingEngine("builtin:tiny")
    engine.forward_backward([make_datum([1, 72, 105], [33, 2])], "cross_entropy")
    engine.optim_step(AdamParams(learning_rate=1e-3))

Importing this package imports torch; ``import whileai`` does not import it.
"""

from whileai.engine.datums import make_datum, sft_datum
from whileai.engine.losses import LOSSES, capabilities, resolve_config
from whileai.engine.models import BUILTINS, LoadedModel, load_model
from whileai.engine.sampling import SampledSequence, SamplingParams
from whileai.engine.training import (
    AdamParams,
    ForwardBackwardOutput,
    OptimStepOutput,
    TrainingEngine,
)

__all__ = [
    "BUILTINS",
    "LOSSES",
    "AdamParams",
    "ForwardBackwardOutput",
    "LoadedModel",
    "OptimStepOutput",
    "SampledSequence",
    "SamplingParams",
    "TrainingEngine",
    "capabilities",
    "load_model",
    "make_datum",
    "resolve_config",
    "sft_datum",
]
