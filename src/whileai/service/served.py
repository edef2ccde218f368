"""One run of ``wai serve``: its operations executed on a ``Trainer`` (whichever a provider opened), with its
folder ``--data-dir/runs/R`` (saved states in ``states/NAME``, export archives in ``exports/``).

``TrainerRun.execute(op, body)`` dispatches to ``op_<name>`` and returns an ``Outcome``. Each trainer owns its
checkpoints: ``save(states/NAME)`` writes the engine's snapshot there, or a pointer to the state its server
keeps. What a trainer cannot do (a Tinker-API server's value head, its weights) it refuses itself.
"""

from __future__ import annotations

import math
import tarfile
import tempfile
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whileai.errors import ConfigError, WhileaiError
from whileai.service import schemas
from whileai.trainers import Trainer

if TYPE_CHECKING:
    from whileai.engine.training import TrainingEngine

BEFORE_LOAD = ("load_state", "finish", "noop")
"""Operations a run that came back after a restart accepts before ``load_state``."""
SCORES = ("prompt_logprobs", "topk_prompt_logprobs", "topk_sample_logprobs", "target_prompt_logprobs",
          "prompt_alt_tokens_k")
"""what a sample request may ask scored besides the sampled tokens (the in-process engine only)"""


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


class TrainerRun:
    """One run's trainer and folder."""

    def __init__(self, trainer: Trainer, folder: Path, restarted: bool) -> None:
        self.trainer = trainer
        self.folder = folder
        self.restarted = restarted

    def execute(self, op: str, body: schemas.Op) -> Outcome:
        if self.restarted and op not in BEFORE_LOAD:
            saved = self._saved()
            fix = (f"call load_state(NAME) first; saved states: {saved}" if saved else
                   "no state was saved, so the run's work is lost: start a new run")
            raise RunUnavailable(f"the server restarted since this run's last operation, so its weights are "
                                 f"the base model's, not the run's; {fix}. Work after the last save was lost")
        outcome: Outcome = getattr(self, f"op_{op}")(body)
        return outcome

    def close(self) -> None:
        self.trainer.close()

    def _done(self, result: dict[str, Any], version: int | None = None) -> Outcome:
        step = self.trainer.step
        return Outcome(result, step if version is None else version, step)

    def _saved(self) -> list[str]:
        return sorted(p.name for p in (self.folder / "states").glob("*") if (p / "LATEST").is_file())

    # ------------------------------------------------------------------ operations
    def op_forward_backward(self, body: schemas.ForwardBackward) -> Outcome:
        out = self.trainer.forward_backward(body.data, body.loss_function, body.loss_config,
                                            sampling_params=body.sampling_params, logprobs_for=body.logprobs_for)
        return self._done(out.to_dict())

    def op_forward(self, body: schemas.Forward) -> Outcome:
        out = self.trainer.forward(body.data, body.loss_function, body.loss_config,
                                   sampling_params=body.sampling_params, reference=body.reference,
                                   logprobs_for=body.logprobs_for)
        return self._done(out.to_dict())

    def op_optim_step(self, body: schemas.OptimStep) -> Outcome:
        before = self.trainer.step
        out = self.trainer.optim_step(body.adam_params)
        grad_norm = None if math.isnan(out.grad_norm) else out.grad_norm  # a server that reported none
        return self._done({"grad_norm": grad_norm, "metrics": dict(out.metrics)}, before)

    def op_save_weights_for_sampler(self, body: schemas.Op) -> Outcome:
        return self._done({"version": self.trainer.save_weights_for_sampler()})

    def op_add_critic(self, body: schemas.AddCritic) -> Outcome:
        """A value head on this policy run (what a critic method needs: ``ppo_critic`` then trains it)."""
        if body.reward_range is None:
            self.trainer.add_critic(body.learning_rate)
        else:
            self.trainer.add_critic(body.learning_rate, reward_range=tuple(body.reward_range))
        added = {"learning_rate": body.learning_rate,
                 "reward_range": None if body.reward_range is None else list(body.reward_range)}
        return replace(self._done({"critic": True}), spec_update={"added_critic": added})

    def op_sample(self, body: schemas.Sample) -> Outcome:
        from whileai.engine.training import TrainingEngine

        engine = self.trainer if isinstance(self.trainer, TrainingEngine) else None
        asked = [k for k in SCORES if getattr(body, k)]
        if asked and engine is None:
            raise ConfigError(f"sample: {', '.join(asked)} cannot be passed on by the {self.trainer.where} (it "
                              "samples batches prompt by prompt); score with the logprobs operation, or use the "
                              "local provider")
        prompts = body.prompt_tokens
        single = bool(prompts) and isinstance(prompts[0], int)
        scores_prompt = bool(body.prompt_logprobs or body.topk_prompt_logprobs or body.prompt_alt_tokens_k
                             or body.target_prompt_logprobs is not None)
        if scores_prompt and not single:
            raise ConfigError("sample: prompt_logprobs / topk_prompt_logprobs / target_prompt_logprobs / "
                              "prompt_alt_tokens_k take one prompt, not a list")
        if engine is not None and single and scores_prompt and len(prompts) >= engine.max_context:
            out: list[Any] = [_Empty()] * body.num_samples  # compute_logprobs of a full context: nothing sampled
        else:
            out = self.trainer.sample(prompts, body.num_samples, body.sampling_params, version=body.version)
        groups = [out] if single else out
        sequences = [[{"tokens": list(s.tokens), "logprobs": list(s.logprobs), "stop_reason": s.stop_reason}
                      for s in g] for g in groups]
        result = {"sequences": sequences, "single": single}
        if engine is not None and (scores_prompt or body.topk_sample_logprobs):
            result.update(_scores(engine, body, single, sequences))
        return self._done(result, body.version)

    def op_logprobs(self, body: schemas.Logprobs) -> Outcome:
        out = self.trainer.compute_logprobs(body.tokens, body.top_k, reference=body.reference,
                                            sampling_params=body.sampling_params)
        return self._done(out)

    def op_save_state(self, body: schemas.State) -> Outcome:
        path = self.trainer.save(self.folder / "states" / body.name)
        outcome = self._done({"name": body.name, "path": path})
        outcome.saved_state = {"name": body.name, "path": path, "step": self.trainer.step}
        return outcome

    def op_load_state(self, body: schemas.State) -> Outcome:
        folder = self.folder / "states" / body.name
        if not (folder / "LATEST").is_file():
            raise ConfigError(f"load_state: this run saved no state named {body.name!r}; its saved states: "
                              f"{self._saved() or 'none'}")
        self.trainer.load(folder, optimizer=body.optimizer)
        self.restarted = False
        return self._done({"name": body.name})

    def op_export_lora(self, body: schemas.Export) -> Outcome:
        exports = self.folder / "exports"
        exports.mkdir(parents=True, exist_ok=True)
        archive = f"export-step{self.trainer.step:08d}-{uuid.uuid4().hex[:8]}.tar.gz"
        with tempfile.TemporaryDirectory(dir=exports) as tmp:
            written = Path(self.trainer.export(str(Path(tmp) / "model"), merged=body.merged))
            partial = exports / f".{archive}"
            with tarfile.open(partial, "w:gz") as tar:
                for file in sorted(written.rglob("*")):
                    tar.add(file, arcname=str(file.relative_to(written)), recursive=False)
            partial.replace(exports / archive)
        return self._done({"archive": archive, "merged": body.merged})

    def op_finish(self, body: schemas.Op) -> Outcome:
        outcome = self._done({"finished": True})
        outcome.finished = True
        return outcome

    def op_noop(self, body: schemas.Op) -> Outcome:
        return self._done({})


@dataclass(frozen=True)
class _Empty:
    tokens: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    stop_reason: str = "length"


def _scores(engine: TrainingEngine, body: schemas.Sample, single: bool,
            sequences: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """What a sample request asks scored besides the sampled tokens, on the in-process engine (at the version)."""
    from whileai.service import tinker_scoring as extra

    prompts, result = body.prompt_tokens, dict[str, Any]()
    with engine.weights(body.version):
        if single and (body.prompt_logprobs or body.topk_prompt_logprobs):
            scored = engine.compute_logprobs(prompts, body.topk_prompt_logprobs)
            result.update(prompt_logprobs=scored["logprobs"], topk_prompt_logprobs=scored["topk"])
        if body.target_prompt_logprobs is not None:
            result["target_prompt_logprobs"] = extra.target_logprobs(engine, prompts, body.target_prompt_logprobs)
        if body.prompt_alt_tokens_k:
            result["prompt_alt_tokens"] = extra.alternative_tokens(engine, prompts, body.prompt_alt_tokens_k,
                                                                   body.sampling_params)
        if body.topk_sample_logprobs:
            batch: list[Any] = [prompts] if single else list(prompts)
            for group, prompt in zip(sequences, batch):
                extra.sampled_topk(engine, prompt, group, body.topk_sample_logprobs, body.sampling_params)
    return result
