"""The in-process trainer: the ``TrainingEngine`` on this machine, whose checkpoint is its own snapshot.

    trainer = in_process("builtin:tiny", lora_rank=8, device="cpu", seed=0, micro_batch_tokens=8192, needs=needs)

The loop's run without --url, and each run of a ``wai serve`` (``whileai.service.provider.LocalProvider``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from whileai.engine.training import TrainingEngine
from whileai.trainers.base import Needs, add_critic


class EngineTrainer(TrainingEngine):
    """The engine with the ``Trainer`` protocol's checkpoint operations (``save_state`` / ``load_state`` of a
    folder, ``export`` that replaces the folder it writes)."""

    where = "in-process engine"
    url: str | None = None
    capabilities: Mapping[str, Any] | None = None

    def save(self, folder: Path) -> str:
        return self.save_state(str(folder))

    def load(self, folder: Path, *, optimizer: bool = True) -> None:
        # a gradient accumulated by forward_backward without optim_step belongs to the weights being replaced
        self.zero_grad()
        if self.critic is not None:
            self.critic.optimizer.zero_grad(set_to_none=True)
        self.load_state(str(folder))
        if not optimizer:  # weights only: Adam starts again from zero moments
            self.optimizer.state.clear()

    def export(self, path: str, merged: bool = False, overwrite: bool = True, dtype: Any = None) -> str:
        return super().export(path, merged=merged, overwrite=overwrite, dtype=dtype)

    def close(self) -> None:
        """Nothing to let go: the engine is freed with the trainer."""


def in_process(model: str, *, lora_rank: int, device: str, seed: int, micro_batch_tokens: int,
               needs: Needs, activation_checkpointing: str | None = None) -> EngineTrainer:
    trainer = EngineTrainer(model, lora_rank=lora_rank, device=device, seed=seed, reference=needs.reference or None,
                            micro_batch_tokens=micro_batch_tokens, keep_sampler_versions=1,
                            activation_checkpointing=activation_checkpointing)
    if needs.critic is not None:
        add_critic(trainer, needs.critic)
    return trainer
