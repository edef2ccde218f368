"""The sampling routes ``client/config`` advertises: the futures poller and joining a sampling session.

    POST /api/v1/retrieve_futures         one long poll per sampling client: which of its samples completed
    POST /api/v1/join_sampling_session    a clone's id (an unpickled SamplingClient), unique in its session

The SDK (``sample_use_retrieve_futures``) runs one background poll per sampling client instead of one
``retrieve_future`` long poll per sample; a completion only says *that* a request finished (or failed), the
SDK then fetches its answer with ``retrieve_future`` as before. Each sampling session keeps, per clone
(``seq_id // 1_000_000_000``), a log of completions numbered 1, 2, 3...; a poll returns those after its
``prev_cursor`` (and forgets those at or before it, which the SDK has seen), waiting up to ``POLL_SECONDS`` for
one when there is none. A clone id (``sample_join_sampling_session``) is the session's next counter, from 1
(the original client is 0), so clones never share a ``seq_id``. Both live in memory, as sampling sessions do.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

CLONE_BLOCK = 1_000_000_000
POLL_SECONDS = 25.0


@dataclass
class Log:
    """One (sampling session, clone)'s completions, numbered from 1."""

    events: list[tuple[int, str, str]] = field(default_factory=list)  # (cursor, request_id, finished|failed)
    watched: set[str] = field(default_factory=set)  # an SDK retry of a request is logged once
    last: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class Futures:
    """Completion logs per sampling client, and the clone counters of sampling sessions."""

    def __init__(self) -> None:
        self.logs: dict[tuple[str, int], Log] = defaultdict(Log)
        self.clones: dict[str, int] = {}

    def watch(self, sampler: str, seq_id: int | None, request_id: str, future: asyncio.Future[Any]) -> None:
        """Log ``request_id`` in its sampling client's log once its answer is known."""
        log = self.logs[(sampler, (seq_id or 0) // CLONE_BLOCK)]
        if request_id in log.watched:
            return
        log.watched.add(request_id)

        def done(f: asyncio.Future[Any]) -> None:
            log.last += 1
            log.events.append((log.last, request_id, "finished" if f.result()[0] == 200 else "failed"))
            log.wake.set()

        future.add_done_callback(done)

    async def poll(self, sampler: str, clone: int, prev: int, timeout: float | None,
                   retrieved: list[str]) -> dict[str, Any]:
        log = self.logs[(sampler, clone)]
        log.events = [e for e in log.events if e[0] > prev]  # seen by the SDK: forgotten
        log.watched.difference_update(retrieved)  # answers the SDK has fetched: nothing more to tell of them
        wait = POLL_SECONDS if timeout is None else min(max(timeout, 0.0), POLL_SECONDS)
        if not log.events and wait > 0:
            log.wake.clear()
            try:
                await asyncio.wait_for(log.wake.wait(), wait)
            except asyncio.TimeoutError:
                pass
        events = [e for e in log.events if e[0] > prev]
        return {"completions": [{"state": state, "request_id": rid} for _, rid, state in events],
                "cursor": events[-1][0] if events else prev}

    def join(self, sampler: str) -> int:
        self.clones[sampler] = self.clones.get(sampler, 0) + 1
        return self.clones[sampler]


def mount_futures(app: FastAPI, front: Any, as_json: Any) -> None:
    from tinker import types as T

    from whileai.service.tinker_api import TinkerError

    def owned_sampler(sampler: str, owner: str, route: str) -> None:
        if sampler not in front.samplers:
            raise TinkerError(404, f"{route}: no sampling session {sampler!r} (sampling sessions live in memory "
                                   "and end when the server restarts): create the sampling client again")
        front.run(front.samplers[sampler][0], owner, route)

    @app.post("/api/v1/retrieve_futures")
    async def retrieve_futures(request: Request) -> Response:
        body, _, owner = await front.parsed(request, T.FuturesRetrieveRequest, "/api/v1/retrieve_futures")
        target = body.target
        owned_sampler(target.sampling_session_id, owner, "/api/v1/retrieve_futures")
        answer = await front.futures.poll(target.sampling_session_id, target.cloned_sampler_id, body.prev_cursor,
                                          body.timeout, body.retrieved_request_ids)
        return as_json(answer)  # type: ignore[no-any-return]

    @app.post("/api/v1/join_sampling_session")
    async def join_sampling_session(request: Request) -> Response:
        body, _, owner = await front.parsed(request, T.JoinSamplingSessionRequest, "/api/v1/join_sampling_session")
        owned_sampler(body.sampling_session_id, owner, "/api/v1/join_sampling_session")
        return as_json({"type": "join_sampling_session",  # type: ignore[no-any-return]
                        "client_counter": front.futures.join(body.sampling_session_id)})
