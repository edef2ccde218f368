"""The one step (``whileai.loop.train_step``): scored at the run's temperature, and the run spec's loss picks
what the trainer is sent (coefficients as cross-entropy weights, or advantages to a named engine loss)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

import whileai as wai
from whileai.engine import SamplingParams, TrainingEngine
from whileai.loop.step import train_step
from whileai.methods.base import Update
from whileai.methods.run_spec import RunSpec


def test_a_lag_0_run_at_temperature_0_7_admits_every_trajectory(tmp_path: Path):
    """Scored at temperature 1, FlashReinforce(temperature=0.7)'s fresh rollouts look stale and its trust gate
    drops them (the old engine.train_step did, silently); the one step scores at the run plan's temperature."""
    run = wai.train(method=wai.FlashReinforce(temperature=0.7), lag=0, steps=3, rollouts_per_step=8,
                    warm_start_steps=0, eval_tasks=0, export=False, progress=False, run_dir=str(tmp_path / "r"))
    metrics = run.metrics()
    assert [m["admitted_share"] for m in metrics] == [1.0, 1.0, 1.0]
    assert max(abs(m["mean_ratio"] - 1.0) for m in metrics) < 1e-4
    assert run.summary["resolved"]["temperature"] == 0.7


@dataclass(frozen=True)
class Advantages:
    """A test method: per-token advantage A = reward - 0.5; its coefficients are A under cross_entropy and 3 A
    under a named loss (which must read the advantages, never the coefficients)."""

    loss: str = "cross_entropy"
    name: str = "advantages"

    def run_spec(self) -> RunSpec:
        return replace(RunSpec(), loss=self.loss)

    def update(self, rows: list[dict]) -> Update:
        a = [np.full(len(r["tokens"]), float(r["reward"]) - 0.5) for r in rows]
        c = a if self.loss == "cross_entropy" else [3.0 * x for x in a]
        return Update(self.name, c, a, np.ones(len(rows), dtype=bool), {})


def _step(loss: str) -> dict[str, torch.Tensor]:
    engine = TrainingEngine("builtin:tiny", seed=4)
    prompts = [[1, 70 + i, 71 + i] for i in range(4)]
    samples = engine.sample(prompts, 1, SamplingParams(max_tokens=5, temperature=1.0, seed=3))
    rows = [{"prompt_tokens": p, "tokens": s[0].tokens, "behavior_logprobs": s[0].logprobs, "reward": float(i % 2)}
            for i, (p, s) in enumerate(zip(prompts, samples))]
    train_step(engine, Advantages(loss), rows, adam={"learning_rate": 0.05})
    return {n: p.detach().clone() for n, p in engine.named_params.items()}


def test_a_named_loss_gets_the_advantages_and_the_sampler_logprobs():
    """On-policy the ratio is 1, so importance_sampling over A equals cross_entropy with weights A: the same
    weights after one step; the coefficients (3 A) or a missing ratio would differ."""
    kernel, named = _step("cross_entropy"), _step("importance_sampling")
    moved = max(float((kernel[n] - TrainingEngine("builtin:tiny", seed=4).named_params[n].detach()).abs().max())
                for n in kernel)
    assert moved > 1e-3
    for name in kernel:
        torch.testing.assert_close(named[name], kernel[name], rtol=0, atol=1e-6)
