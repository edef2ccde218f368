"""The example in docs/engine-sampling.md runs as written, and the two bounds agree."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

DOC = Path(__file__).resolve().parents[2] / "docs" / "engine-sampling.md"


def test_docs_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "docs/engine-sampling.md lost its example"
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})


def test_engine_bound_equals_the_methods_bound():
    """The engine's torch bound and BPCO's numpy bound are the same Eq. 9 (one formula, two layers)."""
    from whileai.engine.critic import bound
    from whileai.methods.critic import BPCO

    z = np.linspace(-20, 20, 41)
    method = BPCO(reward_range=(-1.0, 2.0))
    engine = bound(torch.from_numpy(z), (-1.0, 2.0)).numpy()
    np.testing.assert_allclose(engine, method.bound(z), rtol=0, atol=1e-12)
