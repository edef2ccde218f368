"""The routes of ``wai policy`` (FastAPI): the OpenAI-compatible subset a recorder and a trainer need.

    GET  /healthz                 readiness
    GET  /v1/models               the one model served, with its weights version
    POST /v1/completions          text or token-id prompt; logprobs=N; return_token_ids; stream
    POST /v1/chat/completions     messages (+ tools); logprobs / top_logprobs; return_token_ids; stream

Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, so the official client
raises them with the message. ``--api-key`` (optional) makes every /v1 route ask for ``Bearer KEY``.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from whileai.record.policy import Policy, Served, answer, stream
from whileai.record.requests import RequestError, parse_ask


async def read_json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RequestError(f"the body is not valid JSON ({err}). Fix: send a JSON object") from None


def create_policy_app(served: Served, api_key: str | None = None) -> FastAPI:
    policy = Policy(served)
    app = FastAPI(title="wai policy")

    def refuse_key(request: Request) -> Response | None:
        if api_key is None:
            return None
        given = request.headers.get("authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            return None
        return RequestError("missing or wrong API key: send 'Authorization: Bearer <key>' with the key "
                                  "given to `wai policy --api-key`", status=401).response()

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "model": served.name, "weights_version": served.version}

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        refused = refuse_key(request)
        if refused is not None:
            return refused
        return JSONResponse({"object": "list", "data": [{"id": served.name, "object": "model", "created": 0,
                                                         "owned_by": "whileai", "weights_version": served.version}]})

    async def complete(request: Request, chat: bool) -> Response:
        refused = refuse_key(request)
        if refused is not None:
            return refused
        try:
            ask = parse_ask(await read_json(request), chat, served.name)
            if ask.stream:
                _, _, lines = await run_in_threadpool(stream, policy, ask)
                return StreamingResponse(lines, media_type="text/event-stream", headers=policy.headers(ask))
            body = await run_in_threadpool(answer, policy, ask)
            return JSONResponse(body, headers=policy.headers(ask))
        except RequestError as err:
            return err.response()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await complete(request, chat=True)

    return app
