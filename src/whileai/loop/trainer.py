"""The ``Trainer`` protocol the loop drives, and the backends that give one: in-process or over HTTP.

    backend = local_backend(plan, needs)                  # a TrainingEngine on this machine
    backend = remote_backend(url, token, plan, needs)     # a run on `wai serve` (or any server behind it)

The loop calls only the operations of ``Trainer``: ``TrainingEngine`` has them, and so has the service's
``RunClient`` (whose server may itself run them on a Tinker-API server through the SDK: ``wai serve
--tinker-url``). What differs between backends (where a checkpoint lives, how the final weights come back,
what the backend can do at all) is the ``Backend`` around the trainer. ``refusals`` reads a server's
capabilities and names every need of the method it cannot meet, before anything is allocated.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from whileai.errors import ConfigError


@runtime_checkable
class Trainer(Protocol):
    """The operations the loop calls (Tinker's, with the engine's ``sampling_params=`` for scoring)."""

    @property
    def tokenizer(self) -> Any: ...

    def forward(self, data: Sequence[Any], loss_fn: str = "cross_entropy",
                loss_fn_config: Mapping[str, Any] | None = None, *, sampling_params: Any = None,
                reference: bool = False) -> Any: ...

    def forward_backward(self, data: Sequence[Any], loss_fn: str, loss_fn_config: Mapping[str, Any] | None = None,
                         *, sampling_params: Any = None) -> Any: ...

    def forward_backward_custom(self, data: Sequence[Any], loss_fn: Any, *, sampling_params: Any = None) -> Any: ...

    def optim_step(self, adam_params: Any = None) -> Any: ...

    def sample(self, prompt_tokens: Sequence[Any], num_samples: int, sampling_params: Any, *,
               version: int | None = None) -> list[Any]: ...

    def save_state(self, path: str) -> str: ...

    def load_state(self, path: str) -> None: ...


@dataclass(frozen=True)
class Needs:
    """What a run asks of its backend, read from the method's run spec and the config."""

    loss: str = "cross_entropy"
    reference: bool = False
    critic: tuple[float, tuple[float, float] | None] | None = None
    """(learning rate, reward range) of a value head, or None"""
    policy_teacher: str | None = None
    """a teacher made of the student's own weights ('live', 'initial', 'ema'), or None"""
    retake_reference: bool = False
    """the reference is re-taken after a warm start (full fine-tuning)"""
    export: bool = False
    """the final weights are written to RUN_DIR/final"""
    own_distribution: bool = True
    """every token is scored under the model's own distribution (temperature 1, no top-k / top-p)"""


@dataclass
class Backend:
    """A trainer and what the loop needs around it: checkpoints, the final weights, the teacher's access."""

    trainer: Any
    where: str
    local: bool
    closers: list[Any] = field(default_factory=list)

    def save(self, folder: Path) -> None:
        """An atomic snapshot: in ``folder`` in-process; on the server (named by the step) over HTTP, with the
        name recorded in ``folder/REMOTE``."""
        if self.local:
            self.trainer.save_state(str(folder))
            return
        name = f"step-{int(self.trainer.step):08d}"
        self.trainer.save_state(name)
        (folder / "REMOTE").write_text(f"{self.trainer.id}\n{name}\n")

    def load(self, folder: Path) -> None:
        if not self.local:
            raise ConfigError("--resume over --url is not supported yet: the checkpoint lives on the server; start "
                              "the run again, or resume it in-process")
        self.trainer.load_state(str(folder))

    def export(self, path: Path, merged: bool) -> str:
        if self.local:
            return str(self.trainer.export(str(path), merged=merged, overwrite=True))
        if path.exists():
            import shutil

            shutil.rmtree(path)
        return str(self.trainer.export_lora(path, merged=merged))

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


def local_backend(model: str, *, lora_rank: int, device: str, seed: int, micro_batch_tokens: int,
                  needs: Needs) -> Backend:
    from whileai.engine import TrainingEngine

    engine = TrainingEngine(model, lora_rank=lora_rank, device=device, seed=seed, reference=needs.reference or None,
                            micro_batch_tokens=micro_batch_tokens, keep_sampler_versions=1)
    if needs.critic is not None:
        _add_critic(engine, needs.critic)
    return Backend(engine, "in-process engine", True)


def _add_critic(trainer: Any, critic: tuple[float, tuple[float, float] | None]) -> None:
    rate, reward_range = critic
    if reward_range is None:
        trainer.add_critic(rate)
    else:
        trainer.add_critic(rate, reward_range=reward_range)


def token_for(token: str | None) -> str:
    found = token or os.environ.get("WAI_TOKEN")
    if not found:
        raise ConfigError("--url needs the server's bearer token: give --token T or set WAI_TOKEN (wai serve printed "
                          "it)")
    return found


def remote_backend(url: str, token: str | None, model: str, *, lora_rank: int, seed: int, needs: Needs) -> Backend:
    """A run on the server at ``url``: refused with every unmet need before the run is created."""
    from whileai.service.client import Client

    client = Client(url, token_for(token))
    try:
        problems = refusals(client.capabilities(), model, needs)
        if problems:
            raise ConfigError(f"the server at {url} cannot run this: " + "; ".join(problems))
        session = client.create_session()
        run = session.create_run(model, lora_rank=lora_rank, seed=seed, reference=needs.reference or None)
        if needs.critic is not None:
            _add_critic(run, needs.critic)
    except BaseException:
        client.close()
        raise
    return Backend(run, f"service at {url}", False, [client.close, session.close])


def refusals(capabilities: Mapping[str, Any], model: str, needs: Needs) -> list[str]:
    """Each need the server's capabilities cannot meet, with the alternative."""
    problems = []
    models = capabilities.get("models")
    if models is not None and model not in models:
        problems.append(f"it does not serve model {model!r} (it serves {', '.join(models)}): start it with "
                        f"`wai serve --model {model}`, or pick one of those with --model")
    operations = capabilities.get("operations", [])
    losses = capabilities.get("losses", {})
    if needs.loss not in losses:
        problems.append(f"the method runs the engine loss {needs.loss!r}, which it does not advertise (it takes "
                        f"{', '.join(losses) or 'none'}): pick a method whose run spec loss is one of those")
    if needs.critic is not None and "add_critic" not in operations:
        problems.append("the method needs a value head and the server cannot attach one (no add_critic): run it "
                        "in-process (drop --url) or pick a method without a critic (grpo, flash_reinforce)")
    if needs.policy_teacher is not None:
        problems.append(f"the method's teacher is the student's own weights ({needs.policy_teacher!r}), which the "
                        "loop reads from an in-process engine only: drop --url, or use a method whose teacher is a "
                        "separate model (opd --teacher MODEL)")
    if capabilities.get("provider") == "tinker" and not (needs.own_distribution and not needs.reference):
        what = "a reference policy" if needs.reference else "tokens sampled at another temperature"
        problems.append(f"the method needs {what} scored, and a Tinker-API server scores under the policy's own "
                        "distribution only: set --set temperature=1 (and beta=0), or train on the local engine "
                        "(a wai serve without --tinker-url, or drop --url)")
    if needs.export and "export_lora" not in operations:
        problems.append("the run writes its final weights to RUN_DIR/final and the server cannot export them (no "
                        "export_lora): add --no-export (the weights stay on the server's side)")
    if needs.retake_reference:
        problems.append("the method's reference policy would be re-taken after the warm start, which a server run "
                        "cannot do (its reference is the model as created): set --warm-start-steps 0, or drop --url")
    return problems
