"""Weight sync: the trainer's weights pushed to an inference server after every ``every``-th optimizer step.

    push = PushWeights(ServerSampler(url, model), run_dir / "sync", every=1)
    version = push.push(trainer, step)     # write, load, and remember which step this version is
    push.step_of(sample.weights_version)   # the trainer step whose weights sampled it

Under LoRA the adapter is written in PEFT format and loaded through the runtime adapter route (vLLM's
``/v1/load_lora_adapter``, ``wai policy``'s), each push under a new name ``<name>-step<k>`` (the one before
is unloaded), and completions ask for ``model=<that name>``: on vLLM, whose answers name only the model,
the name is the version. Under full fine-tuning the whole model folder is written and reloaded through
``/update_weights_from_disk`` (SGLang's route, ``wai policy``'s) with ``weight_version=<name>-step<k>``;
vLLM's OpenAI server has no route that reloads full weights, so ``check_server`` refuses that pairing
before the first step with the reason.

As a loop hook: ``before`` pushes the weights the run starts from (after the warm start; a resumed run's),
``after_step`` pushes after every ``every``-th step. A ``gate`` (``whileai.loop.sources.sampler.Gate``) is told of
each push and may hold it until the sampler has finished the draws the older weights are meant for.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from whileai.errors import ConfigError
from whileai.loop.sources.server_sampler import SamplerError, ServerSampler, write_weights
from whileai.loop.types import Hook, Loop, engine_of

if TYPE_CHECKING:
    from whileai.engine.training import TrainingEngine
    from whileai.loop.step import StepResult


class PushGate(Protocol):
    """What a push tells the sampler: ``before_push(step)`` may wait; ``pushed(step)`` after the load."""

    def before_push(self, step: int) -> None: ...

    def pushed(self, step: int) -> None: ...


VLLM_FULL = ("vLLM's OpenAI-compatible server has no route that reloads full weights from a folder: its runtime "
             "routes load LoRA adapters (/v1/load_lora_adapter, with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), and its "
             "weight-transfer routes (VLLM_SERVER_DEV_MODE=1 with --weight-transfer-config) receive tensors over "
             "NCCL or CUDA IPC from a trainer process on the GPUs, which this trainer does not send")


class PushWeights(Hook):
    """Push a trainer's weights to one server: ``push(trainer, step)``; a loop hook (``before``, ``after_step``)."""

    def __init__(self, sampler: ServerSampler, folder: str | Path, *, every: int = 1, name: str = "policy",
                 versioned: bool = True, gate: PushGate | None = None) -> None:
        if every < 1:
            raise ConfigError(f"sync_every = {every!r} must be an integer >= 1 (push after every k-th step)")
        self.sampler, self.folder, self.every, self.name = sampler, Path(folder), every, name
        self.versioned = versioned
        """True: each push under ``<name>-step<k>`` (the version is in the name); False: always ``name``"""
        self.gate = gate
        self.versions: dict[str, int] = {}
        """weights version the server reports -> the trainer step that pushed it"""
        self.loaded: str | None = None
        """the adapter name loaded by the last LoRA push"""
        self.seconds = 0.0
        """time spent in the last push (writing and loading; a gate's wait included)"""

    def name_at(self, step: int) -> str:
        return f"{self.name}-step{step}" if self.versioned else self.name

    def push(self, trainer: TrainingEngine, step: int) -> str:
        """Write the trainer's weights (before any wait: the write overlaps the sampler's draw), load them into
        the server, and return the version its answers will report from now on."""
        began = time.perf_counter()
        written = write_weights(trainer, self.folder)
        if self.gate is not None:
            self.gate.before_push(step)
        if trainer.loaded.lora is not None:
            version = self.sampler.push_lora(written, self.name_at(step))
            if self.loaded is not None and self.loaded != self.name_at(step):
                self.sampler.unload_lora(self.loaded)
            self.loaded = self.name_at(step)
        else:
            version = self.sampler.push_full(written, weight_version=self.name_at(step))
        self.versions[version] = step
        if self.gate is not None:
            self.gate.pushed(step)
        self.seconds = time.perf_counter() - began
        return version

    def step_of(self, version: str) -> int:
        """The trainer step whose push the server reports as ``version``; a version this run never pushed means
        the server restarted (it serves its base again) or another trainer pushed to it."""
        if version not in self.versions:
            raise SamplerError(f"{self.sampler.url} answered with weights version {version!r}, which this run did not "
                               f"push (it pushed {sorted(self.versions)[-3:]}...): the server restarted or another "
                               "trainer pushed to it, so the rows' weights are unknown")
        return self.versions[version]

    def check_server(self, lora: bool) -> None:
        """Refuse full fine-tuning against vLLM before anything trains (``VLLM_FULL``)."""
        if not lora and self.sampler.server_kind() == "vllm":
            raise ConfigError(f"--sampler-url {self.sampler.url} is a vLLM server and this run trains every weight: "
                              f"{VLLM_FULL}. Fix: train a LoRA adapter (--lora-rank N; start vLLM with --enable-lora), "
                              "or serve the model with SGLang or `wai policy`, which reload full weights "
                              "(/update_weights_from_disk)")

    # ------------------------------------------------------------------ as a loop hook
    def before(self, loop: Loop) -> None:
        engine = engine_of(loop.trainer, "weight sync to --sampler-url")  # its loaded adapter, if any
        self.check_server(engine.loaded.lora is not None)
        self.push(engine, loop.state.step)

    def after_step(self, loop: Loop, record: dict[str, Any], result: StepResult) -> None:
        if record["step"] % self.every == 0:
            self.push(engine_of(loop.trainer, "weight sync to --sampler-url"), record["step"])
