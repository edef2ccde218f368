"""The production loop closed: train on traces as a recorder scores them, and push the weights back.

    wai train --rows-from http://127.0.0.1:8400 --sampler-url http://127.0.0.1:8300 --lora-rank 8

``Recorded`` is a batches source for ``whileai.loop.core.run_loop``, like ``Pushed``: each step's batch is
the next ``rollouts_per_step`` traces first scored at the recorder (``wai record``'s ``GET /v1/export``,
read after a cursor, the traces' ``scored_seq``), so no trace is trained twice and none is skipped. When
fewer are scored it waits, saying so, polling every ``POLL_S`` seconds; a Ctrl-C while it waits writes a
checkpoint and stops with the resume line. The cursor lives in the loop state (``LoopState.source``), so it
is part of every checkpoint: a resumed run reads on from where its checkpoint trained up to.

After each ``sync_every``-th step the weights go back to the server the traffic goes to (``PushWeights``,
``whileai.loop.sources.sync``): under LoRA always as the adapter ``ADAPTER`` (loaded in place, so the clients'
``model`` stays the same), under full fine-tuning as a reload of every weight. Each exported row names
the weights that served it (``weights_version``); the run maps it to the step that pushed those weights
(``sampler_step``) and writes the version gaps per step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from whileai.errors import BatchError, ServerStopped, WhileaiError
from whileai.loop.sources.trace_formats import Vocab, read_line
from whileai.loop.sources.traces import TRACE_FIELDS, lacking
from whileai.loop.types import Hook, LagQueue, Loop, LoopState, Source
from whileai.service.auth import TOKEN_ENV

if TYPE_CHECKING:
    from whileai.loop.hooks.context import Context
    from whileai.loop.plan.config import TrainConfig
    from whileai.loop.sources.sync import PushWeights
    from whileai.loop.step import StepResult
    from whileai.methods.base import Method

POLL_S = 1.0  # seconds between polls of the recorder while too few scored traces are new
ADAPTER = "policy"  # the adapter name the trained LoRA weights are served under (clients ask for model="policy")
EXPORT_ROUTE = "/v1/export"


class RecorderError(WhileaiError):
    """The recorder is down, too old for the export route, or answered something that is not its export."""


@dataclass
class RecorderFeed:
    """A client of one recorder's ``GET /v1/export?after=CURSOR&limit=N``."""

    url: str
    timeout: float = 30.0
    token: str | None = field(default_factory=lambda: os.environ.get(TOKEN_ENV))
    """The recorder's bearer token (default ``$WAI_TOKEN``)."""

    def after(self, cursor: int, limit: int) -> dict[str, Any]:
        """``{rows, refused, cursor, unscored}``: the traces first scored after ``cursor``, at most ``limit``."""
        url = self.url.rstrip("/").removesuffix("/v1")
        try:
            headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
            reply = httpx.get(url + EXPORT_ROUTE, params={"after": cursor, "limit": limit}, timeout=self.timeout,
                              headers=headers)
        except httpx.HTTPError as err:
            raise RecorderError(f"no recorder answers at {url} ({type(err).__name__}: {err}). Fix: start it (`wai "
                                "record --upstream SERVER_URL`) or point --rows-from at it") from None
        if reply.status_code == 401:
            raise RecorderError(f"{url}{EXPORT_ROUTE} refused the read (401): set WAI_TOKEN to the token `wai record` "
                                "was given or printed")
        if reply.status_code == 404:
            raise RecorderError(f"{url} has no {EXPORT_ROUTE} route (404): it is not `wai record`, or one older than "
                                "the export stream. Fix: point --rows-from at a current `wai record`")
        if reply.status_code != 200:
            raise RecorderError(f"{url}{EXPORT_ROUTE} refused the read ({reply.status_code}): {reply.text[:300]}")
        answer = reply.json()
        if not isinstance(answer, dict) or not {"rows", "refused", "cursor", "unscored"} <= set(answer):
            raise RecorderError(f"{url}{EXPORT_ROUTE} answered without rows, refused, cursor and unscored: it is not "
                                "`wai record`'s export")
        return answer


@dataclass
class Recorded:
    """Each step's batch: the next ``plan.rollouts_per_step`` traces scored at the recorder, read as the
    library's rows (``read_line``: the checks a rows file gets); always scored by the trainer (``rescore``).

    ``state``: the loop's, whose ``source`` holds the cursor; ``write``: the run's log; ``stop``: writes a
    checkpoint and raises ``Interrupted`` after a Ctrl-C (``Context.stop_if_asked``); ``step_of``: the step
    that pushed a weights version (None: not pushed by this run)."""

    feed: RecorderFeed
    size: int
    vocab: Vocab
    state: LoopState
    write: Callable[[str], None]
    stop: Callable[[], None]
    step_of: Callable[[str], int | None]
    seqs: list[int] = field(default_factory=list)
    """the ``scored_seq`` of each trace of the latest batch, in batch order"""
    refused: list[dict[str, Any]] = field(default_factory=list)
    """traces passed since the last batch because they cannot train, with their reasons"""
    waited: float = 0.0
    """seconds the latest batch waited for scored traces"""

    @property
    def cursor(self) -> int:
        return int((self.state.source or {}).get("cursor", 0))

    def next(self, step: int, queue: LagQueue) -> list[dict[str, Any]]:
        began, self.refused, self.seqs = time.perf_counter(), [], []
        batch: list[dict[str, Any]] = []
        at, said = self.cursor, float("-inf")
        while len(batch) < self.size:
            answer = self.feed.after(at, self.size - len(batch))
            self.refused += answer["refused"]
            for row in answer["rows"]:
                self._take(row, batch)
            moved, at = int(answer["cursor"]) != at, int(answer["cursor"])
            if len(batch) >= self.size or moved:
                continue
            if time.perf_counter() - said > 60:  # said when the wait begins, then once a minute
                said = time.perf_counter()
                self.write(f"step {step + 1}: waiting for scored traces at {self.feed.url}: {len(batch)} of "
                           f"{self.size} new after cursor {self.cursor} ({answer['unscored']} recorded trace(s) "
                           f"wait for a score); polling every {POLL_S:g} s, Ctrl-C stops with a checkpoint")
            self.stop()
            time.sleep(POLL_S)
        self.waited = time.perf_counter() - began
        self.state.source = {**(self.state.source or {}), "cursor": at}
        return batch

    def _take(self, row: Mapping[str, Any], batch: list[dict[str, Any]]) -> None:
        """Add the row to the batch as the loop trains it, checked as a rows file's line is; a row that fails
        the checks (another model's token ids, no log-probabilities) is passed as refused, with the reason."""
        seq = int(row["scored_seq"])
        try:
            batch.append(self._trace(row))
            self.seqs.append(seq)
        except BatchError as err:
            self.refused.append({"trace_id": row.get("task_id"), "scored_seq": seq, "reason": str(err)})

    def _trace(self, row: Mapping[str, Any]) -> dict[str, Any]:
        where = f"{self.feed.url}, trace {row.get('task_id')!r} (scored_seq {row.get('scored_seq')})"
        (trace,) = read_line("whileai", where, row, self.vocab, sampled=True)
        if "reward" not in trace or "behavior_logprobs" not in trace:
            raise BatchError(lacking(where, "whileai", "reward" not in trace))
        out = {k: trace[k] for k in TRACE_FIELDS if k in trace}
        version = row.get("weights_version")
        pushed = self.step_of(str(version)) if version is not None else None
        if pushed is not None:
            out["sampler_step"] = pushed
        return out

    def rescore(self, batch: Sequence[dict[str, Any]], step: int) -> bool:
        return True  # the server's log-probabilities are the behaviour's, not the trainer's of this step


# ----------------------------------------------------------------------------- the run's hook
@dataclass
class FeedHook(Hook):
    """What the run says about the stream (``before``) and writes per step: the traces' ``scored_seq`` (each
    trained once), the traces refused, the wait, and the gap between the step that trained a trace and the
    step whose weights served it. Keeps the pushed versions in the loop state for a resumed run."""

    batches: Recorded
    push: PushWeights
    write: Callable[[str], None]
    ctx: Context | None = None

    def before(self, loop: Loop) -> None:
        source = loop.state.source or {}
        self.push.versions.update(source.get("versions", {}))
        where = f"after cursor {self.batches.cursor} (resumed)" if source else "from the first scored trace"
        self.write(f"rows: the traces scored at {self.batches.feed.url}, {self.batches.size} a step, {where}; each "
                   f"new weights go to {self.push.sampler.url} after every {self.push.every} step(s)")

    def after_step(self, loop: Loop, record: dict[str, Any], result: StepResult) -> None:
        gaps = [record["step"] - 1 - int(r["sampler_step"]) for r in loop.batch if "sampler_step" in r]
        record.update({"recorded/scored_seqs": list(self.batches.seqs), "recorded/cursor": self.batches.cursor,
                       "recorded/refused": len(self.batches.refused), "time/wait_s": self.batches.waited,
                       "recorded/unknown_version": len(loop.batch) - len(gaps),
                       "time/push_s": self.push.seconds if record["step"] % self.push.every == 0 else 0.0})
        if gaps:
            record.update({"recorded/version_gap_mean": sum(gaps) / len(gaps), "recorded/version_gap_max": max(gaps)})
        for refused in self.batches.refused[:3]:
            self.write(f"step {record['step']}: passed trace {refused['trace_id']} (scored_seq "
                       f"{refused['scored_seq']}), which cannot train: {refused['reason']}")
        loop.state.source = {**(loop.state.source or {}), "versions": dict(self.push.versions)}

    def failed(self, loop: Loop, error: BaseException) -> None:
        """A recorder that stops answering stops the run with a checkpoint (the cursor where its steps ended)."""
        if isinstance(error, RecorderError) and self.ctx is not None:
            self.ctx.checkpoint(loop.state, loop.teacher)
            step = loop.state.step
            raise ServerStopped("recorder", self.batches.feed.url, self.ctx.run_dir, step, error,
                                f"A checkpoint of the {step} steps trained is written, with the cursor of the traces "
                                "they trained on.") from None


def problems(config: TrainConfig, method: Method | None) -> list[str]:
    """The config rules of a run from a recorder (``check`` adds them to the rest)."""
    if config.rows_from is None:
        return []
    out = []
    if not str(config.rows_from).startswith(("http://", "https://")):
        out.append(f"rows_from = {config.rows_from!r}: give the recorder's URL, e.g. http://127.0.0.1:8400 (`wai "
                   "record` prints it)")
    if config.sampler_url is None:
        out.append("rows_from needs sampler_url: the server the recorder forwards to, where each new weights are "
                   "pushed (--sampler-url http://127.0.0.1:8300)")
    for name in ("rows", "taskset"):
        if getattr(config, name) is not None:
            out.append(f"{name} = {getattr(config, name)!r} with rows_from: a run trains from the recorder's "
                       f"traces alone; drop --{name} (--eval-taskset measures pass@1 on a taskset)")
    if config.url is not None:
        out.append(f"url = {config.url!r} with rows_from: pushing the weights to the server needs the in-process "
                   "trainer's weights; drop --url")
    if (config.lag or 0) > 0:
        out.append(f"lag = {config.lag}: lag does not apply to traces from a recorder (the traffic's weights are "
                   "the server's; the gap is measured per step as recorded/version_gap): drop --lag")
    spec = method.run_spec() if method is not None else None
    if method is not None and spec is not None and (spec.source != "rollouts" or spec.min_rollouts_per_prompt > 1):
        out.append(f"method {method.name!r} with rows_from: a recorded trace is one try of its ask (its task_id is "
                   "the trace id), so only a one-try RL method learns from them (flash_reinforce, rae, sao, bpco)")
    return out


def source(ctx: Context, state: LoopState, write: Callable[[str], None]) -> Source:
    """The batches source and the hooks of a run from a recorder: the push, ``FeedHook``, and the stop with a
    checkpoint when the server stops answering (``StopOnServerError``; the recorder's: ``FeedHook.failed``)."""
    from whileai.loop.sources.sampler import StopOnServerError
    from whileai.loop.sources.server_sampler import ServerSampler
    from whileai.loop.sources.sync import PushWeights
    from whileai.loop.sources.traces import load_vocab

    config, plan = ctx.config, ctx.plan
    assert config.sampler_url is not None and config.rows_from is not None  # plan.checks: --rows-from needs both
    server = ServerSampler(config.sampler_url, model=config.model)
    push = PushWeights(server, Path(ctx.run_dir) / "sync", every=plan.sync_every, name=ADAPTER,
                       versioned=not config.lora_rank)
    batches = Recorded(RecorderFeed(config.rows_from), plan.rollouts_per_step, load_vocab(config.model), state,
                       write, lambda: ctx.stop_if_asked(state), push.versions.get)
    return Source(batches, feed=[push, FeedHook(batches, push, write, ctx), StopOnServerError(ctx, config.sampler_url)])
