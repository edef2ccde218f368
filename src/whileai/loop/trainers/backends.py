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

import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from whileai.errors import ConfigError
from whileai.loop.types import Adam, LogprobsFor, Scoring, Tokenizer


class LossOutput(Protocol):
    """What ``forward`` / ``forward_backward`` return: per-datum outputs (``logprobs``, ``values``) and metrics."""

    @property
    def loss_fn_outputs(self) -> Sequence[Mapping[str, Any]]: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...


class OptimOutput(Protocol):
    """What ``optim_step`` returns: the gradient norm before clipping, and the step's metrics."""

    @property
    def grad_norm(self) -> float: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...


@runtime_checkable
class Trainer(Protocol):
    """The operations the loop calls (Tinker's, with the engine's ``sampling_params=`` for scoring)."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def step(self) -> int:
        """optimizer steps taken (a checkpoint's name and a teacher's snapshot read it)"""
        ...

    def forward(self, data: Sequence[Any], loss_fn: str = "cross_entropy",
                loss_fn_config: Mapping[str, Any] | None = None, *, sampling_params: Scoring = None,
                reference: bool = False, logprobs_for: LogprobsFor = "every") -> LossOutput: ...

    def forward_backward(self, data: Sequence[Any], loss_fn: str, loss_fn_config: Mapping[str, Any] | None = None,
                         *, sampling_params: Scoring = None, logprobs_for: LogprobsFor = "every") -> LossOutput: ...

    def forward_backward_custom(self, data: Sequence[Any], loss_fn: Callable[..., Any], *,
                                sampling_params: Scoring = None, logprobs_for: LogprobsFor = "every") -> LossOutput: ...

    def optim_step(self, adam_params: Adam = None) -> OptimOutput: ...

    def sample(self, prompt_tokens: Sequence[Any], num_samples: int, sampling_params: Scoring, *,
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
    loss_config: tuple[str, ...] = ()
    """the config keys the run spec sends with its loss"""


@dataclass
class Backend:
    """A trainer and what the loop needs around it: checkpoints, the final weights, the teacher's access.
    ``api``: 'local' (in-process), 'wai' (a wai serve's own API) or 'tinker' (the Tinker SDK)."""

    trainer: Any
    where: str
    local: bool
    closers: list[Any] = field(default_factory=list)
    api: str = "local"
    url: str | None = None
    capabilities: Mapping[str, Any] | None = None
    """a server's capabilities answer (what ``refusals`` reads), None in-process"""

    def save(self, folder: Path) -> None:
        """An atomic snapshot: in ``folder`` in-process; over --url a state saved on the server (named by the
        step) and, in ``folder``, a snapshot that names it (``remote_state`` reads it back)."""
        if self.local:
            self.trainer.save_state(str(folder))
            return
        step = int(self.trainer.step)
        name = f"step-{step:08d}"
        path = self.trainer.save_state(name)
        record = {"api": self.api, "url": self.url, "run": self.trainer.id, "name": name, "path": path, "step": step}
        _write_pointer(folder, step, record)

    def load(self, folder: Path) -> None:
        """Restore the checkpoint in ``folder`` (over --url the trainer was made from it: see ``backend_for``)."""
        if self.local:
            self.trainer.load_state(str(folder))
            return
        saved = remote_checkpoint(folder)
        self.trainer.load_state(saved["name"] if self.api == "wai" else saved["path"])

    def export(self, path: Path, merged: bool) -> str:
        if self.local:
            return str(self.trainer.export(str(path), merged=merged, overwrite=True))
        if path.exists():
            shutil.rmtree(path)
        return str(self.trainer.export_lora(path, merged=merged))

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


def _write_pointer(folder: Path, step: int, record: dict[str, Any]) -> None:
    """The engine's snapshot layout (``folder/LATEST`` -> ``step-N-remote/meta.json``) holding no weights, only
    where they are: the step (what ``hooks.read_state`` reads) and ``remote``, the server's state."""
    name = f"step-{step:08d}-remote"
    snapshot = folder / name
    snapshot.mkdir(parents=True, exist_ok=True)
    temporary = snapshot / "meta.json.tmp"
    temporary.write_text(json.dumps({"format": 1, "step": step, "remote": record}, indent=2))
    os.replace(temporary, snapshot / "meta.json")
    pointer = folder / f".tmp-LATEST-{name}"
    pointer.write_text(name)
    os.replace(pointer, folder / "LATEST")
    for old in folder.glob("step-*"):
        if old.name != name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


def remote_checkpoint(folder: Path) -> dict[str, Any]:
    """``remote_state(folder)`` of a run over --url; a checkpoint written in-process is refused."""
    saved = remote_state(folder)
    if saved is None:
        raise ConfigError(f"--resume: the checkpoint in {folder} was written in-process, and the run's config trains "
                          "over --url; it cannot continue on a server (resume it without url in its config.toml)")
    return saved


def remote_state(folder: Path) -> dict[str, Any] | None:
    """The server-side state a run's checkpoint names (api, url, run, name, path, step); None for an in-process
    snapshot or no checkpoint."""
    pointer = folder / "LATEST"
    if not pointer.is_file():
        return None
    meta = folder / pointer.read_text().strip() / "meta.json"
    return json.loads(meta.read_text()).get("remote") if meta.is_file() else None


def local_backend(model: str, *, lora_rank: int, device: str, seed: int, micro_batch_tokens: int,
                  needs: Needs, activation_checkpointing: str | None = None) -> Backend:
    from whileai.engine import TrainingEngine

    engine = TrainingEngine(model, lora_rank=lora_rank, device=device, seed=seed, reference=needs.reference or None,
                            micro_batch_tokens=micro_batch_tokens, keep_sampler_versions=1,
                            activation_checkpointing=activation_checkpointing)
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


def remote_backend(url: str, token: str | None, model: str, *, lora_rank: int, seed: int, needs: Needs,
                   resume: Mapping[str, Any] | None = None) -> Backend:
    """A run on the server at ``url``: refused with every unmet need before the run is created. ``resume``: the
    checkpoint's record of a state saved there (``Backend.save``); the new run starts from a copy of it."""
    from whileai.service.client import Client

    client = Client(url, token_for(token))
    session = None
    try:
        offered = _wai_capabilities(client)
        problems = refusals(offered, model, needs)
        if problems:
            raise ConfigError(f"the server at {url} cannot run this: " + "; ".join(problems))
        session = client.create_session()
        source = {} if resume is None else {"from_state": f"{resume['run']}/{resume['name']}"}
        try:
            run = session.create_run(model, lora_rank=lora_rank, seed=seed, reference=needs.reference or None,
                                     **source)
        except ConfigError:
            raise
        except Exception as err:
            if resume is None or getattr(err, "status", None) != 404:
                raise
            raise ConfigError(f"--resume: the checkpoint at step {resume['step']} is the state {resume['name']!r} of "
                              f"run {resume['run']} on the server at {url}, which no longer has it ({err}); it was "
                              "restarted without its data dir, or the run was deleted. The run cannot continue from "
                              "there: start it again in a new --run-dir") from None
        if needs.critic is not None:
            _add_critic(run, needs.critic)
    except BaseException:
        if session is not None:
            session.close()
        client.close()
        raise
    return Backend(run, f"service at {url}", False, [client.close, partial(_close_quietly, session)], api="wai",
                   url=url, capabilities=offered)


def _close_quietly(session: Any) -> None:
    """Close the run's session; on a server that is gone this fails, and must not hide why the run stopped."""
    try:
        session.close()
    except Exception:  # noqa: BLE001 - the error that stopped the run is the one to report
        pass


def _wai_capabilities(client: Any) -> dict[str, Any]:
    """The wai serve's capabilities; a server that does not answer them is named, with --api tinker."""
    try:
        return dict(client.capabilities())
    except ConfigError:
        raise
    except Exception as err:
        if getattr(err, "status", None) != 404:
            raise
        raise ConfigError(f"--url {client.url}: no wai serve answers there (GET /v1/training/capabilities: "
                          f"{err}); for a Tinker-API server (Tinker, SkyRL's) add --api tinker") from None


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
    unknown = sorted(set(needs.loss_config) - set(losses.get(needs.loss, {}).get("config", {}))) \
        if needs.loss in losses else []
    if unknown:
        taken = ", ".join(losses[needs.loss].get("config", {})) or "none"
        problems.append(f"the method sends loss {needs.loss!r} the config keys {unknown}, which the server does not "
                        f"take for it (it takes: {taken}): pick a method whose loss it takes with those keys, or "
                        "train on a wai serve (every loss and key)")
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
