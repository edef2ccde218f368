"""One lock for torch's global random generator, so seeded initialisation is a function of the seed alone.

Model and LoRA initialisation (transformers, PEFT) draw from torch's global generator. ``seeded(seed)`` holds
the lock, seeds it, and restores the generator afterwards; two engines built at once in two threads (the
service creates runs concurrently) then each see only their own seed's stream. Any other draw from the
global generator that could interleave with one (``row_uniforms`` drawing a seed for ``seed=None``) takes
``GLOBAL_RNG`` too.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

GLOBAL_RNG = threading.RLock()


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the body with torch's global generator seeded with ``seed``, alone, then restore it."""
    with GLOBAL_RNG, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
