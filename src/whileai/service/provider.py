"""Providers: what opens the trainer each run of ``wai serve`` trains (``whileai.trainers``), and says what it can do.

``LocalProvider`` opens an ``EngineTrainer`` in this process per run and advertises every loss in the engine's
table. ``TinkerProvider`` (``wai serve --tinker-url URL``) opens a ``TinkerTrainer`` per run on the Tinker-API
server at URL, through one SDK session for the whole service. The routes, the ordering and the run adapter
(``whileai.service.served.TrainerRun``) know only ``Provider`` and the ``Trainer`` protocol.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

from whileai.errors import ConfigError
from whileai.service import schemas
from whileai.service.served import RunUnavailable
from whileai.trainers import Trainer
from whileai.trainers.tinker_map import tinker_losses, wai_capabilities

if TYPE_CHECKING:
    from whileai.trainers.engine import EngineTrainer
    from whileai.trainers.tinker import TinkerTrainer

BUILDING = threading.Lock()
"""Held while a model is built (each run loads on its own thread; concurrent creations queue here)."""
Spec = dict[str, Any]
"""A run's stored settings: ``schemas.CreateRun``'s fields (base_model, lora_rank, seed, kind, ...)."""


class Provider(Protocol):
    name: str

    def capabilities(self) -> dict[str, Any]: ...

    def open_trainer(self, spec: Spec, *, restarted: bool) -> Trainer:
        """The trainer of a new run (``restarted``: of a run the database knows from before a restart)."""
        ...


def _served(models: list[str], spec: Spec) -> None:
    if spec["base_model"] not in models:
        raise ConfigError(f"base_model {spec['base_model']!r} is not served here; this server serves "
                          f"{models} (start `wai serve --model M` to add one)")


class LocalProvider:
    """Each run on its own ``EngineTrainer`` in this process."""

    name = "local"

    def __init__(self, models: list[str]) -> None:
        self.models = list(models)

    def capabilities(self) -> dict[str, Any]:
        from whileai.engine import capabilities
        from whileai.engine.training import ADAM_KNOBS

        return {"provider": self.name, "models": self.models, "operations": list(schemas.OPERATIONS),
                "losses": capabilities(),
                "clip_thresholds": "loss_config keys clip_low_threshold / clip_high_threshold (absolute ratios), "
                                   "or per-token loss_fn_inputs of the same names",
                "adam_params": {k: {"default": v.value, "doc": v.doc} for k, v in ADAM_KNOBS.items()}}

    def open_trainer(self, spec: Spec, *, restarted: bool) -> EngineTrainer:
        _served(self.models, spec)
        from whileai.trainers.engine import EngineTrainer

        with BUILDING:  # one build at a time: transformers' lazy imports are not safe across threads
            trainer = EngineTrainer(spec["base_model"], lora_rank=spec["lora_rank"], seed=spec["seed"],
                                    reference=spec.get("reference"))
        if spec["kind"] == "critic":
            _add_critic(trainer, spec["critic_learning_rate"], spec.get("reward_range"))
        if spec.get("added_critic") is not None:  # add_critic ran before a restart: the head comes back with the run
            _add_critic(trainer, spec["added_critic"]["learning_rate"], spec["added_critic"].get("reward_range"))
        return trainer


def _add_critic(trainer: EngineTrainer, learning_rate: float, reward_range: list[float] | None) -> None:
    options = {} if reward_range is None else {"reward_range": tuple(reward_range)}
    trainer.add_critic(learning_rate, **options)


class TinkerProvider:
    """Each run on the Tinker-compatible server at ``url`` (one SDK session for the whole service). What it
    advertises: a ``wai serve`` behind it is asked (every loss, clip thresholds as config keys or per-token
    inputs); any other server gets ``tinker_losses()``, so ``require_advertised_loss`` refuses the rest before
    any work is sent."""

    name = "tinker"

    def __init__(self, url: str, api_key: str, models: list[str]) -> None:
        from whileai.trainers.tinker import sdk_session

        self.url, self.api_key, self.models = url.rstrip("/"), api_key, list(models)
        self.client = sdk_session(self.url, api_key)

    def capabilities(self) -> dict[str, Any]:
        remote = wai_capabilities(self.url, self.api_key)
        losses = remote["losses"] if remote is not None else tinker_losses()
        convention = ("as the wai serve behind it takes them" if remote is not None else
                      "loss_config keys clip_low_threshold / clip_high_threshold (absolute ratios)")
        return {"provider": self.name, "upstream": self.url, "models": self.models,
                "operations": [op for op in schemas.OPERATIONS if op != "add_critic"],  # export: save_weights_external
                "losses": losses, "clip_thresholds": convention}

    def open_trainer(self, spec: Spec, *, restarted: bool) -> TinkerTrainer:
        if restarted:
            raise RunUnavailable("the service restarted, and a tinker-provider run lives on the upstream server "
                                 "through this process's SDK session, which ended: start a new run")
        _served(self.models, spec)
        if spec["kind"] != "policy" or spec.get("reference"):
            raise ConfigError("the tinker provider runs policy runs only: critic runs and reference=True need "
                              "the local provider")
        from whileai.trainers.tinker import new_run

        return new_run(self.client, spec["base_model"], lora_rank=spec["lora_rank"], seed=spec["seed"], url=self.url)
