"""The algorithms by name: each a ``build_loss`` module, its options, and how the loop must run it.

One ``Algorithm`` per entry of the spec's page (004 "More algorithms"), plus every method of the methods
library as ``method:NAME`` (``whileai.algorithms.library``). The loop reads these fields and calls
``run_cycle``; it never branches on a name.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from whileai.algorithms import (
    cispo,
    dapo,
    dppo,
    drgrpo,
    grpo_len_norm,
    grpo_nostd,
    gspo,
    maxrl,
    opd,
    opsd,
    ppo,
    reinforce_pp,
    rloo,
    sapo,
    sdpo,
)
from whileai.algorithms.core import ForwardRequest, LossContext, NoOptions, Options, Sample, SampleRequest
from whileai.errors import ConfigError

BuildLoss = Callable[[Sample, int, SampleRequest, LossContext], ForwardRequest]


@dataclass(frozen=True)
class LoopNeeds:
    """What an algorithm asks of the loop's sampling and set-up."""

    rollouts_per_prompt: int
    """completions per prompt each cycle"""
    temperature: float = 1.0
    """sampling temperature (the trainer scores at the same one)"""
    max_tokens: int | None = None
    """its own generation cap (None: the taskset's, or the loop's)"""
    second_run: str | None = None
    """None; 'reference' (a frozen copy of the student's base model); 'teacher' (a frozen model that should differ)"""
    learning_rate: float | None = None
    """the rate the method's paper declares (None: the loop's default)"""


@dataclass
class CycleResult:
    """What one cycle's training did: plain-number metrics, notes, and the state carried to the next."""

    metrics: dict[str, float]
    notes: list[str]
    state: Any = None


@dataclass(frozen=True)
class Algorithm:
    """A ``build_loss`` algorithm: per cycle, build_loss -> forward_backward -> optim_step."""

    name: str
    """what ``wai loop --algorithm`` takes"""
    build_loss: BuildLoss
    """``build_loss(sample, cycle, request, ctx) -> ForwardRequest``"""
    options: type[Options]
    """its options dataclass (``NoOptions`` when it has none)"""
    loss: str
    """the loss name it sends (for the listing; the module's ``LOSS``)"""
    rollouts_per_prompt: int = 4
    """completions sampled per prompt each cycle"""
    second_run: str | None = None
    """None; 'reference' (a frozen copy of the student's base model); 'teacher' (a frozen model that should differ)"""

    @property
    def summary(self) -> str:
        """The first line of the module's docstring (or the function's)."""
        doc = sys.modules[self.build_loss.__module__].__doc__ or self.build_loss.__doc__ or ""
        return (doc.strip().splitlines() or [""])[0]

    def make_options(self, given: Mapping[str, Any] | None = None) -> Options:
        """The algorithm's options with ``given`` applied; an unknown key lists the valid ones."""
        valid = [f.name for f in dataclasses.fields(self.options)]  # type: ignore[arg-type]
        unknown = sorted(set(given or {}) - set(valid))
        if unknown:
            raise ConfigError(f"algorithm {self.name!r} has no option {unknown[0]!r}; its options are "
                              f"{', '.join(valid) or 'none'}")
        return self.options(**(given or {}))

    def loop_needs(self, options: Any) -> LoopNeeds:
        """How the loop must sample for this algorithm, and which second run it needs."""
        return LoopNeeds(self.rollouts_per_prompt, second_run=self.second_run)

    def prepare(self, trainer: Any, options: Any, learning_rate: float) -> None:
        """Nothing to attach: the ratio losses train the policy only."""

    def run_cycle(self, sample: Sample, cycle: int, request: SampleRequest, ctx: LossContext, adam: Mapping[str, Any],
                  state: Any = None) -> CycleResult:
        """build_loss -> forward_backward (skipped when no datum carries a signal) -> optim_step."""
        request_out = self.build_loss(sample, cycle, request, ctx)
        metrics = dict(request_out.metrics)
        if request_out.data:
            out = ctx.client.forward_backward(request_out.data, request_out.loss_fn, request_out.loss_fn_config or None)
            metrics["loss"] = float(out.metrics.get("loss:sum", 0.0))
        else:
            request_out.notes.append("no completion carried a signal this cycle: nothing was sent to forward_backward")
        metrics["grad_norm"] = float(ctx.client.optim_step(dict(adam)).grad_norm)
        metrics["datums"] = float(len(request_out.data))
        return CycleResult(metrics, list(request_out.notes), state)


GROUP = 4  # rollouts per prompt of the group algorithms: small enough for three CPU cycles on builtin:tiny

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("grpo_nostd", grpo_nostd.build_loss, NoOptions, grpo_nostd.LOSS, GROUP),
    Algorithm("grpo_len_norm", grpo_len_norm.build_loss, NoOptions, grpo_len_norm.LOSS, GROUP),
    Algorithm("drgrpo", drgrpo.build_loss, drgrpo.DrGRPOOptions, drgrpo.LOSS, GROUP),
    Algorithm("ppo", ppo.build_loss, ppo.PPOOptions, ppo.LOSS, GROUP),
    Algorithm("cispo", cispo.build_loss, cispo.CISPOOptions, cispo.LOSS, GROUP),
    Algorithm("gspo", gspo.build_loss, gspo.GSPOOptions, gspo.LOSS, GROUP),
    Algorithm("dppo", dppo.build_loss, dppo.DPPOOptions, dppo.LOSS, GROUP),
    Algorithm("dapo", dapo.build_loss, dapo.DAPOOptions, dapo.LOSS, GROUP),
    Algorithm("sapo", sapo.build_loss, sapo.SAPOOptions, sapo.LOSS, GROUP),
    Algorithm("rloo", rloo.build_loss, NoOptions, rloo.LOSS, GROUP),
    Algorithm("reinforce_pp", reinforce_pp.build_loss, reinforce_pp.ReinforcePPOptions, reinforce_pp.LOSS, GROUP,
              "reference"),
    Algorithm("maxrl", maxrl.build_loss, maxrl.MaxRLOptions, maxrl.LOSS, GROUP),
    Algorithm("opd", opd.build_loss, opd.DistillOptions, opd.LOSS, GROUP, "teacher"),
    Algorithm("opsd", opsd.build_loss, opsd.OPSDOptions, opd.LOSS, 1, "reference"),
    Algorithm("sdpo", sdpo.build_loss, sdpo.SDPOOptions, opd.LOSS, 1, "reference"),
)}


def algorithm_names() -> list[str]:
    """Every name ``algorithm()`` takes: the spec's algorithms, then ``method:NAME`` for the library's."""
    from whileai.algorithms.library import library_names

    return list(ALGORITHMS) + library_names()


def algorithm(name: str) -> Any:
    """The algorithm called ``name`` (``Algorithm``, or a ``LibraryAlgorithm`` for ``method:NAME``)."""
    from whileai.algorithms.library import PREFIX, library_algorithm

    if name in ALGORITHMS:
        return ALGORITHMS[name]
    if name.startswith(PREFIX):
        return library_algorithm(name[len(PREFIX):])
    raise ConfigError(f"unknown algorithm {name!r}; the algorithms are {', '.join(algorithm_names())}")


def reward_metrics(sample: Sample) -> dict[str, float]:
    rewards = sample.rewards
    return {"reward": float(rewards.mean()) if rewards.size else 0.0,
            "pass_rate": float(np.mean(rewards >= 1.0)) if rewards.size else 0.0}
