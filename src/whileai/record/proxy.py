"""`wai record`: an OpenAI-compatible proxy that records each exchange as a training trace.

    POST /v1/chat/completions, /v1/completions   forwarded upstream (streaming and not); headers x-whileai-trace-id
                                                 (choice 0's trace) and x-whileai-trace-ids (a JSON list, one
                                                 trace id per choice, in choice-index order)
    GET  /v1/models                                forwarded upstream as it is
    POST /v1/rewards {trace_id, reward, replace?}  a late score: 404 unknown id, 409 already scored, 422 bad body
    GET  /v1/traces/{trace_id}                     a recorded trace, its exchanges oldest first
    GET  /v1/export?after=CURSOR&limit=N           the rows of traces first scored after CURSOR (a scored_seq),
                                                   in score order: {rows, refused, cursor, unscored}
    GET  /healthz                                  readiness (the only route without the token)

With a token (the default: ``--token``, ``$WAI_TOKEN`` or one generated and printed) every route but /healthz
asks for ``Bearer TOKEN``; the recorder then sends the upstream its own ``--upstream-key`` (default: the same
token, so one ``$WAI_TOKEN`` serves a whole local stack), never the client's. With ``--no-token`` (loopback
only) the client's ``Authorization`` header goes upstream as it came. Bodies over ``--max-body-mb`` are
refused (413) while they are read, before anything is forwarded.

Threading: a chat request whose messages, up to its last assistant message, equal an earlier request's
messages plus the reply it got continues that exchange's trace, when its prompt's token ids begin with the
earlier prompt and reply (so the trace is one token sequence the model really saw). The reply's tokens are
actions; the tokens in between (tool results, user turns, the template's own) are observations. A follow-up
of a scored trace, of a trace that has moved on, or of a reply two requests continue at once starts a new
trace that shares the conversation so far. Completions requests are one trace each.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from whileai.record.exchange import Sampled, continued_key, conversation_key, strip, widen
from whileai.record.export import scored_after
from whileai.record.requests import DEFAULT_LIMITS, Limits, RequestError, error_response, guarded, read_json
from whileai.record.rewards import reward_route
from whileai.record.store import RecordStore, UnknownTrace

TRACE_HEADER = "x-whileai-trace-id"
TRACES_HEADER = "x-whileai-trace-ids"
OTHER_KNOBS = ("min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias")
"""Request fields that change the distribution a token is drawn from, besides temperature / top-p / top-k."""
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
EXPORT_LIMIT = 1024  # traces one /v1/export answer holds at most
_HOP = {"content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive", "date", "server"}


@dataclass
class RecordConfig:
    upstream: str
    data_dir: Path
    logprobs_mode: str | None = None
    """What the upstream's log-probabilities are when it does not say (x-whileai-logprobs-mode); None: raw
    (vLLM's default), so an export refuses a ratio for traces sampled with anything but plain settings."""
    timeout: float = 600.0
    token: str | None = None
    """The bearer token every route but /healthz asks for (None: --no-token)."""
    upstream_key: str | None = None
    """The bearer token sent upstream (None: the client's own Authorization header, passed through)."""
    limits: Limits = DEFAULT_LIMITS
    """Only ``max_body_bytes`` applies here; the upstream bounds the rest."""


class Recorder:
    """Forwards, threads and records; one per process."""

    def __init__(self, config: RecordConfig) -> None:
        self.config = config
        self.store = RecordStore(config.data_dir)
        self.claimed: set[str] = set()  # traces a request in flight is continuing
        self.lock = threading.Lock()
        self.http = httpx.AsyncClient(base_url=config.upstream.rstrip("/"), timeout=config.timeout)

    # ------------------------------------------------------------------ threading
    def thread(self, body: Mapping[str, Any], chat: bool, prompt_ids: list[int] | None) -> tuple[str, int | None]:
        """The trace this exchange belongs to and the exchange it continues (None: a new conversation)."""
        key = continued_key(body.get("messages")) if chat else None
        earlier = self.store.continues(key) if key is not None else None
        if earlier is None or prompt_ids is None:
            return _new_id(), None
        before = json.loads(earlier["prompt_ids"]) + json.loads(earlier["completion_ids"])
        if prompt_ids[:len(before)] != before:
            return _new_id(), None  # the template re-rendered the earlier turn differently: not one sequence
        with self.lock:
            in_place = (earlier["tip"] == earlier["id"] and earlier["reward"] is None
                        and earlier["trace_id"] not in self.claimed)
            if in_place:
                self.claimed.add(earlier["trace_id"])
                return earlier["trace_id"], int(earlier["id"])
        return _new_id(), int(earlier["id"])

    def release(self, trace_id: str) -> None:
        with self.lock:
            self.claimed.discard(trace_id)

    # ------------------------------------------------------------------ recording
    def record(self, trace_id: str, parent: int | None, body: Mapping[str, Any], chat: bool, sampled: Sampled,
               reply: Mapping[str, Any], headers: Mapping[str, str]) -> None:
        mode = headers.get("x-whileai-logprobs-mode") or self.config.logprobs_mode or "raw_logprobs"
        sampling = headers.get("x-whileai-sampling")
        messages = body.get("messages")
        key = conversation_key([*messages, sampled.reply_message()]) if chat and isinstance(messages, list) else None
        fields = {"endpoint": "chat" if chat else "completions", "model": reply.get("model"),
                  "weights_version": headers.get("x-whileai-weights-version") or reply.get("system_fingerprint"),
                  "logprobs_mode": mode,
                  "sampling": json.loads(sampling) if sampling else _requested_sampling(body),
                  "prompt_ids": sampled.prompt_ids or [], "completion_ids": sampled.ids() or [],
                  "logprobs": sampled.logprobs if sampled.has_logprobs else None,
                  "finish_reason": sampled.finish_reason, "conversation_key": key, "problem": sampled.problem()}
        self.store.add_exchange(trace_id, parent, fields)

    # ------------------------------------------------------------------ forwarding
    def upstream_headers(self, request: Request) -> dict[str, str]:
        if self.config.upstream_key is not None:
            return {"authorization": f"Bearer {self.config.upstream_key}"}
        return {k: v for k, v in request.headers.items() if k.lower() == "authorization"}

    async def forward(self, request: Request, path: str, chat: bool) -> Response:
        try:
            body = await read_json(request, self.config.limits)
        except RequestError as err:
            return err.response()
        if not isinstance(body, dict):
            return error_response(400, "the body must be a JSON object (the OpenAI request fields)")
        headers = self.upstream_headers(request)
        try:
            upstream = await self.http.send(self.http.build_request("POST", path, json=widen(body, chat),
                                                                    headers=headers), stream=True)
        except httpx.HTTPError as err:
            return error_response(502, f"the upstream {self.config.upstream} did not answer ({type(err).__name__}: {err}). "
                               "Fix: start it, or point --upstream at a running server", "upstream_error")
        if upstream.status_code != 200:  # the upstream's own refusal, passed on as it is; nothing recorded
            content = await upstream.aread()
            await upstream.aclose()
            return self.refused_key(upstream.status_code, content) or Response(
                content, status_code=upstream.status_code, headers=_passed(upstream.headers))
        if body.get("stream"):
            return await self._stream(upstream, body, chat)
        return await self._whole(upstream, body, chat)

    async def _whole(self, upstream: httpx.Response, body: dict[str, Any], chat: bool) -> Response:
        content = await upstream.aread()
        await upstream.aclose()
        try:
            reply = json.loads(content)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(502, f"the upstream answered 200 with a body that is not JSON ({content[:80]!r}); "
                               "nothing was recorded. Fix: point --upstream at an OpenAI-compatible server",
                          "upstream_error")
        if not isinstance(reply, dict):
            return error_response(502, "the upstream answered 200 with JSON that is not an object; nothing was recorded",
                          "upstream_error")
        choices = sorted((c for c in reply.get("choices") or [] if isinstance(c, Mapping)), key=_choice_index)
        ids = []
        for choice in choices:
            sampled = Sampled()
            sampled.add(choice, chat, reply.get("prompt_token_ids"))
            trace_id, parent = self.thread(body, chat, sampled.prompt_ids)
            try:
                await run_in_threadpool(self.record, trace_id, parent, body, chat, sampled, reply, upstream.headers)
            finally:
                self.release(trace_id)
            ids.append(trace_id)
        headers = {**_passed(upstream.headers), TRACE_HEADER: ids[0] if ids else "", TRACES_HEADER: json.dumps(ids)}
        return JSONResponse(strip(reply, body, chat), headers=headers)

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``, the upstream's answer passed on (the OpenAI client's ``models.list()``)."""
        headers = self.upstream_headers(request)
        try:
            upstream = await self.http.get("/v1/models", headers=headers)
        except httpx.HTTPError as err:
            return error_response(502, f"the upstream {self.config.upstream} did not answer ({type(err).__name__}: "
                                       f"{err}). Fix: start it, or point --upstream at a running server",
                                  "upstream_error")
        return self.refused_key(upstream.status_code, upstream.content) or Response(
            upstream.content, status_code=upstream.status_code, headers=_passed(upstream.headers))

    def refused_key(self, status: int, content: bytes) -> Response | None:
        """An upstream 401/403 is the recorder's key, not the client's: a 502 that says which key and how to fix
        it (a client that sent the recorder's right token would otherwise be told its token is wrong)."""
        if status not in (401, 403):
            return None
        sent = "its --upstream-key" if self.config.upstream_key != self.config.token else "its own token"
        message = (f"the upstream {self.config.upstream} refused the recorder's key ({status}: "
                   f"{content[:200].decode('utf-8', 'replace')}): the recorder sends {sent} upstream, not yours. "
                   "Fix: start `wai record` with --upstream-key <the token `wai policy` printed>, or start both "
                   "servers with one $WAI_TOKEN")
        print(f"wai record: {message}", flush=True)
        return error_response(502, message, "upstream_auth")

    async def _stream(self, upstream: httpx.Response, body: dict[str, Any], chat: bool) -> Response:
        events = _events(upstream)
        first = await anext(events, None)
        sampled = Sampled()
        if first is not None and isinstance(first, dict):
            for choice in first.get("choices") or []:
                sampled.add(choice, chat, first.get("prompt_token_ids"))
        trace_id, parent = self.thread(body, chat, sampled.prompt_ids)

        async def lines() -> AsyncIterator[str]:
            try:
                chunk = first
                while chunk is not None:
                    if chunk == "[DONE]":
                        await run_in_threadpool(self.record, trace_id, parent, body, chat, sampled, {**(first or {})},
                                                upstream.headers)
                        yield "data: [DONE]\n\n"
                        return
                    yield f"data: {json.dumps(strip(chunk, body, chat))}\n\n"
                    chunk = await anext(events, None)
                    if isinstance(chunk, dict):
                        for choice in chunk.get("choices") or []:
                            sampled.add(choice, chat, chunk.get("prompt_token_ids"))
            finally:
                self.release(trace_id)
                await upstream.aclose()

        headers = {**_passed(upstream.headers), TRACE_HEADER: trace_id, TRACES_HEADER: json.dumps([trace_id])}
        return StreamingResponse(lines(), media_type="text/event-stream", headers=headers)


async def _events(upstream: httpx.Response) -> AsyncIterator[Any]:
    """The stream's events: each ``data:`` line parsed (a dict), and "[DONE]" at the end."""
    async for line in upstream.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        yield "[DONE]" if data == "[DONE]" else json.loads(data)


def _requested_sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's settings that shape the sampled distribution (an upstream that does not report its own):
    temperature, top_p, top_k (None where the request left them to the server), and any other knob it set."""
    shaping = {k: body.get(k) for k in ("temperature", "top_p", "top_k")}
    return shaping | {k: body[k] for k in OTHER_KNOBS if body.get(k) is not None}


def _choice_index(choice: Mapping[str, Any]) -> int:
    index = choice.get("index")
    return index if isinstance(index, int) else 0


def _passed(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP}


def _new_id() -> str:
    return "tr_" + uuid.uuid4().hex[:24]


def create_record_app(config: RecordConfig) -> FastAPI:
    recorder = Recorder(config)
    app = FastAPI(title="wai record")
    app.state.recorder = recorder
    guarded(app, config.token, "record")

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "upstream": config.upstream}

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await recorder.models(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await recorder.forward(request, "/v1/chat/completions", chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await recorder.forward(request, "/v1/completions", chat=False)

    @app.post("/v1/rewards")
    async def rewards(request: Request) -> Response:
        try:
            body = await read_json(request, config.limits)
        except RequestError as err:
            return error_response(err.status if err.status == 413 else 422, str(err))
        return await reward_route(recorder.store, body)

    @app.get("/v1/traces/{trace_id}")
    async def trace(trace_id: str) -> Response:
        try:
            return JSONResponse(await run_in_threadpool(recorder.store.trace, trace_id))
        except UnknownTrace:
            return error_response(404, f"no trace {trace_id!r} is recorded here (trace ids come in the {TRACE_HEADER} "
                               "response header)")

    @app.get("/v1/export")
    async def export_after(after: str = "0", limit: str = str(EXPORT_LIMIT)) -> Response:
        try:
            cursor, most = int(after), int(limit)
        except ValueError:
            cursor, most = -1, -1
        if cursor < 0 or not 1 <= most <= EXPORT_LIMIT:
            return error_response(422, f"after={after!r}, limit={limit!r}: 'after' must be an integer >= 0 (the "
                                       f"'cursor' of the last answer; 0 from the start) and 'limit' one from 1 to "
                                       f"{EXPORT_LIMIT}")
        return JSONResponse(await run_in_threadpool(scored_after, recorder.store, cursor, most))

    return app
