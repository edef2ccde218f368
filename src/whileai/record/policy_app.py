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
raises them with the message; an unexpected failure is a 500 in the same shape. With a token (the default:
``--token``, ``$WAI_TOKEN`` or one generated and printed) every route but /healthz asks for ``Bearer TOKEN``;
``--no-token`` (loopback only) opens them. Each request is bounded before work (``requests.Limits``): the body
while it is read, the prompt's bytes before it is tokenized, token ids against the vocabulary, n, max_tokens
and the batch against their flags.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from whileai.record import weights
from whileai.record.policy import Policy, Served, answer, stream
from whileai.record.requests import DEFAULT_LIMITS, Limits, RequestError, guarded, parse_ask, read_json


def create_policy_app(served: Served, token: str | None = None, limits: Limits = DEFAULT_LIMITS) -> FastAPI:
    policy = Policy(served, limits)
    app = FastAPI(title="wai policy")
    guarded(app, token, "policy")

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "model": served.name, "weights_version": served.version}

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
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
        try:
            ask = parse_ask(await read_json(request, limits), chat, served.name, tuple(served.adapters), limits)
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

    add_weight_routes(app, policy)
    return app


def add_weight_routes(app: FastAPI, policy: Policy) -> None:
    """vLLM's runtime LoRA routes and SGLang's full reload (record.weights), serialised with sampling."""
    served = policy.served

    def under_lock(change: Any, body: Any) -> Any:
        with policy.lock:
            return change(served, body)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        try:
            body = await read_json(request, policy.limits)
            version = await run_in_threadpool(under_lock, weights.load_adapter, body)
        except RequestError as err:
            return err.response()
        return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' added successfully.",
                                 headers={"x-whileai-model": body["lora_name"], "x-whileai-weights-version": version})

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        try:
            name = await run_in_threadpool(under_lock, weights.unload_adapter, await read_json(request, policy.limits))
        except RequestError as err:
            return err.response()
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Response:
        try:
            new, path = await run_in_threadpool(weights.read_full, served, await read_json(request, policy.limits))
        except RequestError as err:
            return JSONResponse({"success": False, "message": str(err), "num_paused_requests": 0},
                                status_code=err.status)
        dropped = await run_in_threadpool(under_lock, weights.swap_full, new)
        also = f"; unloaded the LoRA adapters {dropped}, trained on the old weights" if dropped else ""
        return JSONResponse({"success": True, "message": f"Succeeded to update model weights from {path}{also}.",
                             "num_paused_requests": 0},  # SGLang's shape; nothing pauses: sampling waits on the lock
                            headers={"x-whileai-model": served.name, "x-whileai-weights-version": served.version})
