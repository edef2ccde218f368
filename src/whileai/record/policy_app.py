"""The routes of ``wai policy`` (FastAPI): the OpenAI-compatible subset a recorder and a trainer need.

    GET  /healthz                 readiness
    GET  /v1/models               the one model served, with its weights version
    POST /v1/completions          text or token-id prompt; logprobs=N; return_token_ids; stream
    POST /v1/chat/completions     messages (+ tools); logprobs / top_logprobs; return_token_ids; stream
    POST /v1/load_lora_adapter    {lora_name, lora_path, load_inplace?}: then model=<lora_name> samples with it
    POST /v1/unload_lora_adapter  {lora_name}
    POST /update_weights_from_disk {model_path, weight_version?} -> {success, message, num_paused_requests}
                                  (SGLang's shape)

The weight routes are record.weights; each answer's ``x-whileai-weights-version`` header is the new version.

Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, so the official client
raises them with the message. ``--api-key`` (optional) makes every /v1 route and the reload route ask for ``Bearer KEY``.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from whileai.record import weights
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
        adapters = [{"id": name, "object": "model", "created": 0, "owned_by": "whileai", "parent": served.name,
                     "weights_version": version} for name, version in served.adapters.items()]
        return JSONResponse({"object": "list", "data": [{"id": served.name, "object": "model", "created": 0,
                                                         "owned_by": "whileai", "weights_version": served.version},
                                                        *adapters]})

    def respond(ask: Any) -> tuple[Any, dict[str, str]]:
        with policy.lock:  # the sample and the version in its headers, with no reload between them
            if ask.stream:
                return stream(policy, ask)[2], policy.headers(ask)
            return answer(policy, ask), policy.headers(ask)

    async def complete(request: Request, chat: bool) -> Response:
        refused = refuse_key(request)
        if refused is not None:
            return refused
        try:
            ask = parse_ask(await read_json(request), chat, served.name, tuple(served.adapters))
            body, headers = await run_in_threadpool(respond, ask)
            if ask.stream:
                return StreamingResponse(body, media_type="text/event-stream", headers=headers)
            return JSONResponse(body, headers=headers)
        except RequestError as err:
            return err.response()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await complete(request, chat=True)

    add_weight_routes(app, policy, refuse_key)
    return app


def add_weight_routes(app: FastAPI, policy: Policy, refuse_key: Any) -> None:
    """vLLM's runtime LoRA routes and SGLang's full reload (record.weights), serialised with sampling."""
    served = policy.served

    def under_lock(change: Any, body: Any) -> Any:
        with policy.lock:
            return change(served, body)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        if (refused := refuse_key(request)) is not None:
            return refused
        try:
            body = await read_json(request)
            version = await run_in_threadpool(under_lock, weights.load_adapter, body)
        except RequestError as err:
            return err.response()
        return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' added successfully.",
                                 headers={"x-whileai-model": body["lora_name"], "x-whileai-weights-version": version})

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        if (refused := refuse_key(request)) is not None:
            return refused
        try:
            name = await run_in_threadpool(under_lock, weights.unload_adapter, await read_json(request))
        except RequestError as err:
            return err.response()
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Response:
        if (refused := refuse_key(request)) is not None:
            return refused
        try:
            new, path = await run_in_threadpool(weights.read_full, served, await read_json(request))
        except RequestError as err:
            return JSONResponse({"success": False, "message": str(err), "num_paused_requests": 0}, status_code=400)
        dropped = await run_in_threadpool(under_lock, weights.swap_full, new)
        also = f"; unloaded the LoRA adapters {dropped}, trained on the old weights" if dropped else ""
        return JSONResponse({"success": True, "message": f"Succeeded to update model weights from {path}{also}.",
                             "num_paused_requests": 0},  # SGLang's shape; nothing pauses: sampling waits on the lock
                            headers={"x-whileai-model": served.name, "x-whileai-weights-version": served.version})
