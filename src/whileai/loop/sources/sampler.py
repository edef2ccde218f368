"""Where rollouts come from: the ``Sampler`` interface, and an inference server sampled ahead of the trainer.

    Sampler                      .tokenizer, .sample(prompt_tokens, num_samples, sampling_params) -> [[sample]]
      the trainer itself         in process, between optimizer steps (the default; ``loop.core.Rollouts``)
      HTTPSampler                an OpenAI-compatible server (``wai train --sampler-url``): vLLM, SGLang, wai policy

``AheadRollouts`` hands the loop its batches from a background thread that asks the server for the draws of
upcoming steps while the trainer trains (the server is another process: the two overlap for real). It is
bounded by the run's lag: draw d (the batch step d trains on) is sampled only once the server holds weights
of step >= d - lag, and the push of newer weights waits until the draws meant for the older ones are
sampled. So draw d is sampled with the weights of step max(0, d - lag) exactly, as the in-process lag queue
does, and a run is deterministic given its seed at every lag; each row's ``sampler_step`` is still read from
the version the server reported (``PushWeights.step_of``), not assumed, and checked against the bound.

A server that stops answering stops the run cleanly: ``StopOnServerError`` writes a checkpoint of the steps
trained so far and raises ``ServerStopped`` with the URL, the step and the resume line; rows sampled for
later steps are dropped (a resumed run samples them again with its weights).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from whileai.errors import ConfigError, ServerStopped, WhileaiError
from whileai.loop.sources.rollouts import sample_batch, step_tasks
from whileai.loop.sources.server_sampler import SamplerError, ServerSampler
from whileai.loop.sources.sync import PushWeights
from whileai.loop.types import Hook, LagQueue, Loop, Source, Tokenizer, prompts

if TYPE_CHECKING:
    from whileai.engine.sampling import SamplingParams
    from whileai.envs.core import Taskset
    from whileai.loop.hooks.context import Context
    from whileai.loop.plan.config import TrainConfig
    from whileai.loop.plan.run_plan import RunPlan
    from whileai.methods.base import Method
    from whileai.trainers import Trainer

IN_PROCESS = "in-process"
"""The plan's ``sampler`` when the trainer samples its own rollouts."""


class Sampler(Protocol):
    """What rollouts are sampled with (``whileai.loop.sources.rollouts.rollouts`` calls only this)."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    def sample(self, prompt_tokens: Sequence[Any], num_samples: int, sampling_params: SamplingParams) -> list[Any]: ...


@dataclass(frozen=True)
class Completion:
    """One sampled turn from a server, in the engine's shape (``tokens``, ``logprobs``, ``stop_reason``)."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str
    weights_version: str


class HTTPSampler:
    """A ``Sampler`` over ``ServerSampler``: the engine's ``SamplingParams`` sent as a completions request; the
    versions and settings every answer reported since ``take`` are kept for the rows."""

    def __init__(self, server: ServerSampler, tokenizer: Tokenizer, max_context: int | None) -> None:
        self.server, self.max_context = server, max_context
        self.tokenizer = copy.deepcopy(tokenizer)  # the sampling thread's own: a fast tokenizer is not shared safely
        self.versions: set[str] = set()
        self.settings: dict[str, Any] = {}

    def sample(self, prompt_tokens: Sequence[Any], num_samples: int,
               sampling_params: SamplingParams) -> list[list[Completion]]:
        stop_ids, texts = [], [s for s in sampling_params.stop if isinstance(s, str)]
        for stop in sampling_params.stop:
            if isinstance(stop, str):
                continue  # sent as `stop`: the server matches it on the text, as the engine does
            if len(stop) != 1:
                raise ConfigError(f"stop sequence {stop!r} is more than one token; --sampler-url sends single stop "
                                  "token ids (stop_token_ids) and stop strings. Fix: sample in-process (drop "
                                  "--sampler-url) for this environment, or give it single-token or text stops")
            stop_ids.append(int(stop[0]))
        samples = self.server.sample([list(map(int, p)) for p in prompt_tokens], n=num_samples,
                                     temperature=sampling_params.temperature, top_p=sampling_params.top_p,
                                     top_k=sampling_params.top_k, max_tokens=sampling_params.max_tokens,
                                     stop_token_ids=stop_ids, stop=texts, seed=sampling_params.seed)
        out: list[list[Completion]] = [[] for _ in prompt_tokens]
        for s in samples:
            out[s.prompt_index].append(Completion(s.tokens, s.logprobs, "length" if s.finish_reason == "length"
                                                  else "stop", s.weights_version))
            self.versions.add(s.weights_version)
            self.settings = {k: s.sampling[k] for k in ("temperature", "top_p", "top_k", "max_tokens")}
        return out

    def take(self) -> tuple[set[str], dict[str, Any]]:
        """The versions and the settings reported since the last ``take``."""
        versions, self.versions = self.versions, set()
        return versions, self.settings


class AheadRollouts:
    """The loop's ``Batches`` from a server, sampled ahead by a thread within the lag; the ``PushGate`` of its
    ``PushWeights`` (a push waits for the draws of the weights it replaces)."""

    def __init__(self, sampler: HTTPSampler, push: PushWeights, taskset: Taskset, method: Method, plan: RunPlan) -> None:
        self.sampler, self.push, self.taskset, self.method, self.plan = sampler, push, taskset, method, plan
        push.gate = self
        self.lock = threading.Condition()
        self.pushed_step: int | None = None
        self.sampled_through = -1
        self.ready: dict[int, list[dict[str, Any]]] = {}
        self.error: BaseException | None = None
        self.closed = False
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the gate
    def before_push(self, step: int) -> None:
        with self.lock:
            if self.pushed_step is None:
                return
            through = min(self.pushed_step + self.plan.lag, self.plan.steps - 1)
            self.lock.wait_for(lambda: self.sampled_through >= through or self.error is not None)
            self._raise()

    def pushed(self, step: int) -> None:
        with self.lock:
            if self.pushed_step is None:  # the first push (a resumed run's at its step): draws start here
                self.sampled_through = step - 1
                self.thread = threading.Thread(target=self._run, args=(step,), name="wai-sampler", daemon=True)
                self.thread.start()
            self.pushed_step = step
            self.lock.notify_all()

    # ------------------------------------------------------------------ the loop's side
    def next(self, step: int, queue: LagQueue) -> list[dict[str, Any]]:
        with self.lock:
            self.lock.wait_for(lambda: step in self.ready or self.error is not None)
            self._raise()
            batch = self.ready.pop(step)
        stale = [r for r in batch if not step - self.plan.lag <= r["sampler_step"] <= step]
        if stale:
            raise WhileaiError(f"step {step} got rows sampled with the weights of step {stale[0]['sampler_step']}, "
                               f"outside the lag bound [{step - self.plan.lag}, {step}]: the server answered with "
                               "weights the gate did not allow")
        return batch

    def rescore(self, batch: Sequence[dict[str, Any]], step: int) -> bool:
        return True  # the server's log-probabilities are its own: the trainer scores every row itself

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.lock.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=self.sampler.server.timeout + 5)

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    # ------------------------------------------------------------------ the sampling thread
    def _run(self, first: int) -> None:
        try:
            for draw in range(first, self.plan.steps):
                with self.lock:
                    self.lock.wait_for(partial(self._may_sample, draw))
                    if self.closed:
                        return
                rows = self.draw(draw)
                with self.lock:
                    self.ready[draw], self.sampled_through = rows, draw
                    self.lock.notify_all()
        except BaseException as err:  # handed to the trainer's thread, which raises it
            with self.lock:
                self.error = err
                self.lock.notify_all()

    def _may_sample(self, draw: int) -> bool:
        """Draw ``draw`` may be sampled: the server holds weights of step >= draw - lag (or the run is closing)."""
        return self.closed or (self.pushed_step or 0) >= draw - self.plan.lag

    def draw(self, draw: int) -> list[dict[str, Any]]:
        """The ``draw``-th batch of the run (its tasks and seed as in-process), each row stamped with the
        weights version the server reported, the trainer step that pushed it, and the sampling settings."""
        plan, spec = self.plan, self.method.run_spec()
        tasks = step_tasks(self.taskset.split("train"), plan.rollouts_per_step // plan.rollouts_per_prompt, plan.seed,
                           draw)
        rows = sample_batch(self.sampler, self.taskset, tasks, prompts(self.sampler.tokenizer, tasks), spec,
                            plan, plan.seed * 1_000_003 + draw * 101, -1)
        versions, settings = self.sampler.take()
        if len(versions) != 1:
            raise SamplerError(f"{self.sampler.server.url} answered draw {draw} with {len(versions)} weights versions "
                               f"({sorted(versions)}); one draw is sampled with one set of weights")
        version = versions.pop()
        step = self.push.step_of(version)
        for row in rows:
            row.update(sampler_step=step, weights_version=version, sampling=dict(settings))
        return rows


@dataclass
class StopOnServerError(Hook):
    """A loop hook: on a ``SamplerError`` during the steps, checkpoint and stop with ``ServerStopped``."""

    ctx: Context
    url: str

    def failed(self, loop: Loop, error: BaseException) -> None:
        if isinstance(error, SamplerError):
            self.ctx.checkpoint(loop.state, loop.teacher)
            step, lag = loop.state.step, self.ctx.plan.lag
            fresher = (f" At lag {lag} the resumed run samples steps {step + 1}-{step + lag} with the weights of step "
                       f"{step} (the uninterrupted run used older ones; each row's sampler_step says which)."
                       if lag else "")
            raise ServerStopped("inference server", self.url, self.ctx.run_dir, step, error,
                                f"A checkpoint of the {step} steps trained is written (rows sampled for later steps "
                                f"are dropped and will be sampled again).{fresher}") from None


def server_rollouts(ctx: Context, trainer: Trainer, taskset: Taskset, method: Method, plan: RunPlan) -> Source:
    """The batches of a run sampled from ``plan.sampler`` and the hooks that push its weights there and stop the run
    cleanly when the server dies."""
    name, kind = ServerSampler(plan.sampler, "").served()
    server = ServerSampler(plan.sampler, name, concurrency=8, batch_prompts=kind == "whileai")
    push = PushWeights(server, ctx.run_dir / "sync", every=plan.sync_every)
    sampler = HTTPSampler(server, trainer.tokenizer, getattr(trainer, "max_context", None))
    batches = AheadRollouts(sampler, push, taskset, method, plan)
    return Source(batches, pushing=[push, StopOnServerError(ctx, plan.sampler)], closers=[batches.close])


def problems(config: TrainConfig, method: Method, plan: RunPlan) -> list[str]:
    """What --sampler-url cannot do, each with a fix."""
    if config.sampler_url is None or config.rows_from is not None:  # --rows-from: loop.recorded's rules
        return []
    out = []
    if config.rows is not None or method.run_spec().source != "rollouts":
        out.append("sampler_url: the run trains on rows from a file, which nothing samples; drop --sampler-url")
    if config.url is not None:
        out.append("sampler_url: the weights pushed to the sampler are written by the in-process trainer; --url "
                   "trains on a server, so drop one of --url and --sampler-url")
    if plan.sync_every > plan.lag + 1:
        out.append(f"sync_every = {plan.sync_every} with lag = {plan.lag}: a batch trained at step t must be sampled "
                   f"with the weights of step t - {plan.lag} or later, so the weights must reach the server at least "
                   f"every {plan.lag + 1} steps; lower --sync-every or raise --lag")
    return out
