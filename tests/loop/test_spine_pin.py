"""Pinned behaviour of ``wai.train``: the weights after a few steps of a group, a one-rollout, a critic and a
teacher method, recorded before the loop was rewritten (issue 20, "one loop") and checked after it.

Each case trains builtin:tiny for three steps (lag 2, so the off-policy path runs) and compares a fingerprint
of the exported weights (per-tensor sum and sum of squares, float64) with the recorded one within 1e-6. A
change to sampling, scoring, the update, the step or the schedule moves the fingerprint.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import whileai as wai

RUN = dict(steps=3, rollouts_per_step=8, warm_start_steps=0, eval_tasks=0, progress=False, save_every=1000)
CASES = {
    "grpo": dict(method="grpo", knobs={"generations": 4}, warm_start_steps=2, eval_tasks=4, eval_samples=1),
    "flash_reinforce": dict(method="flash_reinforce", knobs={"temperature": 0.7}),
    "sao": dict(method="sao", knobs={"critic_warmup": 1}, critic_learning_rate=1e-2),
    "opd": dict(method="opd", teacher="builtin:mini"),
}
GOLDEN = Path(__file__).with_name("spine_pin.json")


def fingerprint(folder: str | Path) -> dict[str, list[float]]:
    """Per tensor of RUN_DIR/final/model.safetensors: [sum, sum of squares], float64."""
    tensors = load_file(str(Path(folder) / "model.safetensors"))
    return {name: [float(np.sum(t, dtype=np.float64)), float(np.sum(np.square(t, dtype=np.float64)))]
            for name, t in sorted(tensors.items())}


def train_case(name: str, run_dir: Path, **extra: object) -> dict[str, list[float]]:
    run = wai.train(**{**RUN, **CASES[name], **extra}, run_dir=str(run_dir))
    return fingerprint(run.weights)


def close(a: dict[str, list[float]], b: dict[str, list[float]], tol: float) -> float:
    """The largest difference between two fingerprints (they must name the same tensors), relative to the pinned
    value where that exceeds 1: float32 sums differ in their last bits between CPUs (measured: 1.3e-6 on a sum of 15
    between the recording machine and another), while a change of behaviour moves them by far more.
    The key projection's bias is left out: softmax over keys is invariant to it, so its true gradient is 0 and
    Adam turns the rounding noise of that zero into steps that differ from CPU to CPU."""
    assert sorted(a) == sorted(b)
    return max(abs(x - y) / max(1.0, abs(y)) for k in a if not k.endswith("k_proj.bias") for x, y in zip(a[k], b[k]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_weights_after_three_steps_are_the_pinned_ones(name: str, tmp_path: Path):
    got = train_case(name, tmp_path / name)
    pinned = json.loads(GOLDEN.read_text())[name]
    assert close(got, pinned, 1e-6) <= 1e-6


if __name__ == "__main__":  # record: PYTHONPATH=src python tests/loop/test_spine_pin.py
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        GOLDEN.write_text(json.dumps({n: train_case(n, Path(tmp) / n) for n in sorted(CASES)}, indent=1) + "\n")
