"""Providers: what executes a run's operations. The routes and the ordering know only this interface.

``LocalProvider`` runs each run on its own ``TrainingEngine`` in this process and advertises every loss
in the engine's table. A provider that forwards to a Tinker-compatible server would implement the same
three things: ``capabilities()``, ``open_run()`` and, per run, ``execute(op, body) -> Outcome``.
"""

from __future__ import annotations

import tarfile
import tempfile
import threading
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

from whileai.errors import ConfigError, WhileaiError
from whileai.service import schemas

BUILDING = threading.Lock()
"""Held while a model is built (each run loads on its own thread; concurrent creations queue here)."""


class RunUnavailable(WhileaiError):
    """The run cannot take this operation now (restarted without a loaded state, finished, closed): a 409."""


@dataclass
class Outcome:
    """What one operation did: its result, the weights version it used, the step after it, and the
    effects the service records (a saved state; the run finished)."""

    result: dict[str, Any]
    version: int
    step: int
    saved_state: dict[str, Any] | None = None
    finished: bool = False
    spec_update: dict[str, Any] | None = None
    """fields the run's stored spec gains, so that a restart re-creates the run with them (an added critic)"""


class RunOps:
    """What every provider's run answers the same way: an outcome at the run's step, ``finish`` and ``noop``."""

    def _step(self) -> int:
        raise NotImplementedError

    def _done(self, result: dict[str, Any], version: int | None = None) -> Outcome:
        step = self._step()
        return Outcome(result, step if version is None else version, step)

    def op_finish(self, body: schemas.Op) -> Outcome:
        outcome = self._done({"finished": True})
        outcome.finished = True
        return outcome

    def op_noop(self, body: schemas.Op) -> Outcome:
        return self._done({})


class ProviderRun(Protocol):
    def execute(self, op: str, body: schemas.Op) -> Outcome: ...

    def close(self) -> None: ...


class Provider(Protocol):
    name: str

    def capabilities(self) -> dict[str, Any]: ...

    def open_run(self, run_id: str, spec: dict[str, Any], *, restarted: bool) -> ProviderRun: ...


class LocalProvider:
    """Runs on this machine's ``TrainingEngine``; run ``R``'s files live in ``data_dir/runs/R``."""

    name = "local"

    def __init__(self, models: list[str], data_dir: Path) -> None:
        self.models = list(models)
        self.data_dir = data_dir

    def capabilities(self) -> dict[str, Any]:
        from whileai.engine import capabilities
        from whileai.engine.training import ADAM_KNOBS

        return {"provider": self.name, "models": self.models, "operations": list(schemas.OPERATIONS),
                "losses": capabilities(),
                "clip_thresholds": "loss_config keys clip_low_threshold / clip_high_threshold (absolute ratios), "
                                   "or per-token loss_fn_inputs of the same names",
                "adam_params": {k: {"default": v.value, "doc": v.doc} for k, v in ADAM_KNOBS.items()}}

    def open_run(self, run_id: str, spec: dict[str, Any], *, restarted: bool) -> LocalRun:
        if spec["base_model"] not in self.models:
            raise ConfigError(f"base_model {spec['base_model']!r} is not served here; this server serves "
                              f"{self.models} (start `wai serve --model M` to add one)")
        from whileai.engine import TrainingEngine

        with BUILDING:  # one build at a time: transformers' lazy imports are not safe across threads
            engine = TrainingEngine(spec["base_model"], lora_rank=spec["lora_rank"], seed=spec["seed"],
                                    reference=spec.get("reference"))
        if spec["kind"] == "critic":
            options = {} if spec.get("reward_range") is None else {"reward_range": tuple(spec["reward_range"])}
            engine.add_critic(spec["critic_learning_rate"], **options)
        if spec.get("added_critic") is not None:  # add_critic ran before a restart: the head comes back with the run
            added = spec["added_critic"]
            options = {} if added.get("reward_range") is None else {"reward_range": tuple(added["reward_range"])}
            engine.add_critic(added["learning_rate"], **options)
        return LocalRun(engine, self.data_dir / "runs" / run_id, restarted)


# Operations a run that came back after a restart accepts before ``load_state``.
BEFORE_LOAD = ("load_state", "finish", "noop")


class LocalRun(RunOps):
    """One run's engine and folder; ``execute`` dispatches to ``op_<name>``."""

    def __init__(self, engine: Any, folder: Path, restarted: bool) -> None:
        self.engine = engine
        self.folder = folder
        self.restarted = restarted

    def execute(self, op: str, body: schemas.Op) -> Outcome:
        if self.restarted and op not in BEFORE_LOAD:
            saved = sorted(p.name for p in (self.folder / "states").glob("*") if (p / "LATEST").is_file())
            fix = (f"call load_state(NAME) first; saved states: {saved}" if saved else
                   "no state was saved, so the run's work is lost: start a new run")
            raise RunUnavailable(f"the server restarted since this run's last operation, so its weights are "
                                 f"the base model's, not the run's; {fix}. Work after the last save was lost")
        outcome: Outcome = getattr(self, f"op_{op}")(body)
        return outcome

    def close(self) -> None:
        self.engine = None

    def _step(self) -> int:
        return int(self.engine.step)

    # ------------------------------------------------------------------ operations
    def op_forward_backward(self, body: schemas.ForwardBackward) -> Outcome:
        out = self.engine.forward_backward(body.data, body.loss_function, body.loss_config,
                                           sampling_params=body.sampling_params, logprobs_for=body.logprobs_for)
        return self._done(out.to_dict())

    def op_forward(self, body: schemas.Forward) -> Outcome:
        out = self.engine.forward(body.data, body.loss_function, body.loss_config,
                                  sampling_params=body.sampling_params, reference=body.reference,
                                  logprobs_for=body.logprobs_for)
        return self._done(out.to_dict())

    def op_optim_step(self, body: schemas.OptimStep) -> Outcome:
        before = self.engine.step
        out = self.engine.optim_step(body.adam_params)
        return self._done({"grad_norm": out.grad_norm, "metrics": out.metrics}, before)

    def op_save_weights_for_sampler(self, body: schemas.Op) -> Outcome:
        return self._done({"version": self.engine.save_weights_for_sampler()})

    def op_add_critic(self, body: schemas.AddCritic) -> Outcome:
        """A value head on this policy run (what a critic method needs: ``ppo_critic`` then trains it)."""
        options = {} if body.reward_range is None else {"reward_range": tuple(body.reward_range)}
        self.engine.add_critic(body.learning_rate, **options)
        added = {"learning_rate": body.learning_rate,
                 "reward_range": None if body.reward_range is None else list(body.reward_range)}
        return replace(self._done({"critic": True}), spec_update={"added_critic": added})

    def op_sample(self, body: schemas.Sample) -> Outcome:
        prompts = body.prompt_tokens
        single = bool(prompts) and isinstance(prompts[0], int)
        scores_prompt = body.prompt_logprobs or body.topk_prompt_logprobs or body.target_prompt_logprobs is not None \
            or body.prompt_alt_tokens_k
        if scores_prompt and not single:
            raise ConfigError("sample: prompt_logprobs / topk_prompt_logprobs / target_prompt_logprobs / "
                              "prompt_alt_tokens_k take one prompt, not a list")
        if single and scores_prompt and len(prompts) >= self.engine.max_context:  # compute_logprobs of a full context
            out: list[Any] = [SimpleNamespace(tokens=[], logprobs=[], stop_reason="length")] * body.num_samples
        else:
            out = self.engine.sample(prompts, body.num_samples, body.sampling_params, version=body.version)
        groups = [out] if single else out
        sequences = [[{"tokens": s.tokens, "logprobs": s.logprobs, "stop_reason": s.stop_reason} for s in g]
                     for g in groups]
        result = {"sequences": sequences, "single": single}
        if scores_prompt or body.topk_sample_logprobs:
            from whileai.service import tinker_scoring as extra

            with self.engine.weights(body.version):
                if single and (body.prompt_logprobs or body.topk_prompt_logprobs):
                    scored = self.engine.compute_logprobs(prompts, body.topk_prompt_logprobs)
                    result.update(prompt_logprobs=scored["logprobs"], topk_prompt_logprobs=scored["topk"])
                if body.target_prompt_logprobs is not None:
                    result["target_prompt_logprobs"] = extra.target_logprobs(self.engine, prompts,
                                                                             body.target_prompt_logprobs)
                if body.prompt_alt_tokens_k:
                    result["prompt_alt_tokens"] = extra.alternative_tokens(self.engine, prompts,
                                                                           body.prompt_alt_tokens_k, body.sampling_params)
                if body.topk_sample_logprobs:
                    batch: list[Any] = [prompts] if single else list(prompts)
                    for group, prompt in zip(sequences, batch):
                        extra.sampled_topk(self.engine, prompt, group, body.topk_sample_logprobs, body.sampling_params)
        return self._done(result, body.version)

    def op_logprobs(self, body: schemas.Logprobs) -> Outcome:
        out = self.engine.compute_logprobs(body.tokens, body.top_k, reference=body.reference,
                                           sampling_params=body.sampling_params)
        return self._done(out)

    def op_save_state(self, body: schemas.State) -> Outcome:
        path = self.engine.save_state(str(self.folder / "states" / body.name))
        outcome = self._done({"name": body.name, "path": path})
        outcome.saved_state = {"name": body.name, "path": path, "step": self.engine.step}
        return outcome

    def op_load_state(self, body: schemas.State) -> Outcome:
        folder = self.folder / "states" / body.name
        if not (folder / "LATEST").is_file():
            saved = sorted(p.name for p in (self.folder / "states").glob("*") if (p / "LATEST").is_file())
            raise ConfigError(f"load_state: this run saved no state named {body.name!r}; its saved states: "
                              f"{saved or 'none'}")
        # a gradient accumulated by forward_backward without optim_step belongs to the weights being replaced
        self.engine.zero_grad()
        if self.engine.critic is not None:
            self.engine.critic.optimizer.zero_grad(set_to_none=True)
        self.engine.load_state(str(folder))
        if not body.optimizer:  # weights only: Adam starts again from zero moments
            self.engine.optimizer.state.clear()
        self.restarted = False
        return self._done({"name": body.name})

    def op_export_lora(self, body: schemas.Export) -> Outcome:
        exports = self.folder / "exports"
        exports.mkdir(parents=True, exist_ok=True)
        archive = f"export-step{self.engine.step:08d}-{uuid.uuid4().hex[:8]}.tar.gz"
        with tempfile.TemporaryDirectory(dir=exports) as tmp:
            written = Path(self.engine.export(str(Path(tmp) / "model"), merged=body.merged))
            partial = exports / f".{archive}"
            with tarfile.open(partial, "w:gz") as tar:
                for file in sorted(written.rglob("*")):
                    tar.add(file, arcname=str(file.relative_to(written)), recursive=False)
            partial.replace(exports / archive)
        return self._done({"archive": archive, "merged": body.merged})

