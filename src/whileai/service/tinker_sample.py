"""Sampling on ``wai serve``'s Tinker front: sampling sessions, ``asample``, and sampling without a session.

    POST /api/v1/create_sampling_session    a sampler of saved sampler weights (model_path) or of a base model
    GET  /api/v1/samplers/{id}              what the sampler samples from
    POST /api/v1/asample                    sample / compute_logprobs, every SDK 0.38 field (tinker_wire.sample_body)

A request with no ``sampling_session_id`` samples from its ``model_path`` (named sampler weights) or its
``base_model`` directly: a base model is served by one sampler run per api_key and model, made on first use
in a session of its own. Everything that can refuse a request (the fields, the limits, the context) is checked
before it takes a sequence number of the run.

Context (the model's ``max_position_embeddings``): the prompt plus ``max_tokens`` must fit, else a 400 naming
both; ``max_tokens=None`` samples until the context. The one exception is ``compute_logprobs`` (a request that
scores the prompt with ``max_tokens=1``): its prompt may fill the whole context, and its sample then comes back
empty with ``stop_reason="length"``.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from whileai.errors import WhileaiError


def check_context(fields: dict[str, Any], max_tokens: int | None, context: int | None) -> None:
    """The 400 for a prompt and ``max_tokens`` that do not fit the model's context (module docstring)."""
    from whileai.service.tinker_api import TinkerError

    if context is None:
        return
    n = len(fields["prompt_tokens"])
    scores = fields["prompt_logprobs"] or fields["target_prompt_logprobs"] is not None or fields["prompt_alt_tokens_k"]
    if scores and max_tokens == 1 and n <= context:
        return
    if max_tokens is None and n < context:
        return
    wanted = n + (max_tokens or 1)
    if wanted > context:
        raise TinkerError(400, f"/api/v1/asample: the prompt has {n} tokens and max_tokens is {max_tokens}: "
                               f"{wanted} > the model's context of {context} tokens; shorten the prompt or lower "
                               "max_tokens (max_tokens=None samples until the context)")


def _sampler(front: Any, sampler: str, route: str) -> tuple[str, int | None, str | None]:
    from whileai.service.tinker_api import TinkerError

    if sampler not in front.samplers:
        raise TinkerError(404, f"{route}: no sampling session {sampler!r} (sampling sessions live in memory and "
                               "end when the server restarts): create the sampling client again")
    return front.samplers[sampler]  # type: ignore[no-any-return]


def _weights(front: Any, model_path: str, route: str) -> tuple[str, int]:
    from whileai.service.tinker_api import TinkerError

    found = front.parse_path(model_path, route)
    front.checkpoints.sweep()  # sampler weights whose TTL passed are gone
    if model_path not in front.paths:
        hint = (" (a training state: sampling takes sampler weights, save_weights_for_sampler(name))"
                if found["kind"] == "weights" else "")
        raise TinkerError(404, f"{route}: no sampler weights at {model_path!r}{hint}; save them with "
                               "save_weights_for_sampler(name) on this server first")
    return front.paths[model_path]  # type: ignore[no-any-return]


class BaseSamplers:
    """One base-model sampler run per (api_key, model), made on first use."""

    def __init__(self, front: Any) -> None:
        self.front = front
        self.runs: dict[tuple[str, str], str] = {}
        self.lock = asyncio.Lock()

    async def run_of(self, owner: str, base_model: str) -> str:
        async with self.lock:
            if (owner, base_model) not in self.runs:
                session_id = f"session-{uuid.uuid4().hex[:12]}"
                self.front.service.store.add_session(session_id, owner)
                self.runs[(owner, base_model)] = await self.front.open_run(session_id, owner, base_model, 0, 0)
            return self.runs[(owner, base_model)]


def mount_sampling(app: FastAPI, front: Any, as_json: Any) -> None:
    from tinker import types as T

    from whileai.service import tinker_wire
    from whileai.service.tinker_api import TinkerError

    bases = BaseSamplers(front)

    async def direct(body: Any, owner: str, route: str) -> tuple[str, int | None]:
        """The run and weights version a session-less request samples from."""
        if body.model_path is not None:
            run_id, version = _weights(front, body.model_path, route)
            base = front.run(run_id, owner, route)["spec"]["base_model"]
            if body.base_model not in (None, base):
                raise TinkerError(400, f"{route}: model_path {body.model_path!r} holds weights of {base!r}, not "
                                       f"base_model {body.base_model!r}; give one of them")
            return run_id, version
        if not body.base_model:
            raise TinkerError(400, f"{route}: give sampling_session_id, model_path or base_model")
        return await bases.run_of(owner, body.base_model), None

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> Response:
        route = "/api/v1/create_sampling_session"
        body, _, owner = await front.parsed(request, T.CreateSamplingSessionRequest, route)
        front.session(body.session_id, owner, route)
        sampler = f"{body.session_id}:sample:{body.sampling_session_seq_id}"
        if sampler not in front.samplers:
            if body.model_path is not None:
                run_id, version = _weights(front, body.model_path, route)
                front.samplers[sampler] = (run_id, version, body.model_path)
            else:
                run_id = await front.open_run(body.session_id, owner, body.base_model or "", 0, 0)
                front.samplers[sampler] = (run_id, None, None)
        return as_json({"sampling_session_id": sampler, "type": "create_sampling_session"})  # type: ignore[no-any-return]

    @app.get("/api/v1/samplers/{sampler}")
    async def sampler_info(sampler: str, request: Request) -> Response:
        owner = front.owner(request)
        run_id, _, path = _sampler(front, sampler, "/api/v1/samplers")
        spec = front.run(run_id, owner, "/api/v1/samplers")["spec"]
        return as_json({"sampler_id": sampler, "base_model": spec["base_model"],  # type: ignore[no-any-return]
                        "model_path": path})

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> Response:
        route = "/api/v1/asample"
        body, raw, owner = await front.parsed(request, T.SampleRequest, route)
        sampler = body.sampling_session_id
        if sampler is not None:
            run_id, version, _ = _sampler(front, sampler, route)
            key: tuple[Any, ...] = ("sample", sampler, body.seq_id)
        else:
            run_id, version = await direct(body, owner, route)
            key = ("direct", uuid.uuid4().hex)  # no session, no seq_id: every request is a new one
        run = front.run(run_id, owner, route)
        engine = getattr(front.service.runner.slot(run).trainer_run, "trainer", None)
        try:
            fields, extra = tinker_wire.sample_body(body, getattr(engine, "vocab_size", None))
        except WhileaiError as err:
            raise TinkerError(400, str(err)) from None
        check_context(fields, body.sampling_params.max_tokens, getattr(engine, "max_context", None))
        watch = None if sampler is None else (lambda rid, f: front.futures.watch(sampler, body.seq_id, rid, f))
        request_id = front.submit(run, key, "sample", {**fields, "version": version}, raw,
                                  {"kind": "sample", "route": route, **extra}, watch)
        return as_json({"request_id": request_id, "model_id": run_id,  # type: ignore[no-any-return]
                        "sample_sequence_ids": [f"{request_id}.{i}" for i in range(body.num_samples)]})
