"""The routes of ``wai serve`` (FastAPI). Every answer is JSON; errors are ``{"error": {"type", "message"}}``.

    GET    /healthz                                   readiness (no token)
    GET    /v1/training/capabilities                  models, operations, losses with config keys, limits
    POST   /v1/training/sessions                      -> {"session_id"}
    GET    /v1/training/sessions                      this token's open sessions
    DELETE /v1/training/sessions/{id}                 close it: its runs take no more operations, models freed
    POST   /v1/training/sessions/{id}/runs            CreateRun -> the run's record (model loaded, warm)
    GET    /v1/training/sessions/{id}/runs            the session's runs
    GET    /v1/training/runs/{id}                     one run: settings, step, next seq_id, saved states
    GET    /v1/training/runs/{id}/operations          the run's executed operations, in order
    POST   /v1/training/runs/{id}/{operation}         an operation (schemas.OPERATIONS), ordered by seq_id
    GET    /v1/training/requests/{request_id}?wait=S  the answer of a long operation (202 while running)
    GET    /v1/training/runs/{id}/exports/{archive}   a LoRA / model archive written by export_lora
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from whileai.errors import WhileaiError
from whileai.service import schemas
from whileai.service.auth import Tokens
from whileai.service.guard import BodyTooLarge, read_body
from whileai.service.provider import LocalProvider, Provider
from whileai.service.runs import Answer, Runner, error_answer, status_of
from whileai.service.store import Store

ARCHIVE = re.compile(r"^export-[A-Za-z0-9._-]+\.tar\.gz$")


@dataclass
class ServeConfig:
    """Everything ``wai serve`` is started with (the CLI's flags)."""

    data_dir: Path
    tokens: list[str]
    models: list[str] = field(default_factory=lambda: ["builtin:tiny", "builtin:mini"])
    order_timeout: float = 30.0
    """Seconds an early operation waits for a missing earlier seq_id before a 408."""
    respond_within: float = 10.0
    """Seconds a POST waits for its answer before returning a request id to poll (202)."""
    max_body_bytes: int = 64 * 2**20
    max_datums: int = 4096
    max_samples: int = 4096
    """Most sequences one sample request may ask for (prompts x num_samples)."""


class Refusal(Exception):
    """An answer given before an operation takes its turn (auth, 404, limits, malformed body)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.answer = error_answer(status, kind, message)


def reply(answer: Answer | tuple[int, Any]) -> Response:
    status, body = answer
    text = body if isinstance(body, str) else json.dumps(body)
    return Response(text, status_code=status, media_type="application/json")


def parse(model: type[BaseModel], raw: bytes) -> Any:
    """The body as ``model``; a 422 naming every field that is wrong."""
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as err:
        problems = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in err.errors()[:10]]
        raise Refusal(422, "ValidationError", f"malformed {model.__name__} body: {'; '.join(problems)}") from None


class Service:
    """The state behind the routes: config, tokens, store, provider, runner."""

    def __init__(self, config: ServeConfig, provider: Provider | None = None) -> None:
        self.config = config
        self.tokens = Tokens(config.tokens)
        self.store = Store(config.data_dir)
        self.provider = provider or LocalProvider(config.models)
        self.runner = Runner(self.store, self.provider, config.data_dir / "runs", config.order_timeout)
        self._capabilities: dict[str, Any] | None = None

    def owner(self, request: Request) -> str:
        header = request.headers.get("authorization")
        owner = self.tokens.owner(header)
        if owner is None:
            why = "no bearer token" if not header else "the bearer token is not accepted by this server"
            raise Refusal(401, "Unauthorized", f"{why}: send 'Authorization: Bearer <token>' with a token given "
                                               "to `wai serve` (--token-file, WAI_TOKEN, or the one it printed)")
        return owner

    async def body(self, request: Request) -> bytes:
        """The body, refused (413) past --max-body-mb while it is read (guard.read_body)."""
        try:
            return await read_body(request, self.config.max_body_bytes)
        except BodyTooLarge as err:
            raise Refusal(413, "TooLarge", str(err)) from None

    def session(self, session_id: str, owner: str) -> dict[str, Any]:
        row = self.store.session(session_id)
        if row is None or row["owner"] != owner or row["closed"] is not None:
            raise Refusal(404, "NotFound", f"no open session {session_id!r} for this token; "
                                           "GET /v1/training/sessions lists yours")
        return row

    def run(self, run_id: str, owner: str) -> dict[str, Any]:
        row = self.store.run(run_id)
        if row is None or row["owner"] != owner:
            raise Refusal(404, "NotFound", f"no run {run_id!r} for this token; GET "
                                           "/v1/training/sessions/{id}/runs lists yours")
        return row

    def saved_state(self, source: str | None, owner: str) -> Path | None:
        """The folder of state ``RUN_ID/NAME`` (``CreateRun.from_state``) of one of ``owner``'s runs."""
        if source is None:
            return None
        run_id, name = source.split("/", 1)
        self.run(run_id, owner)
        folder = self.config.data_dir / "runs" / run_id / "states" / name
        if not (folder / "LATEST").is_file():
            saved = [s["name"] for s in self.store.states(run_id)]
            raise Refusal(404, "NotFound", f"from_state {source!r}: run {run_id} has no saved state {name!r} on this "
                                           f"server (its states: {saved or 'none'}; a server restarted without its "
                                           "data dir has lost them, and a --tinker-url server keeps them upstream)")
        return folder

    def run_info(self, run: dict[str, Any]) -> dict[str, Any]:
        slot = self.runner.slots.get(run["id"])
        next_seq = slot.next_seq if slot is not None else self.store.next_seq(run["id"])
        step = slot.step if slot is not None else run["step"]
        return {"run_id": run["id"], "session_id": run["session_id"], **run["spec"], "status": run["status"],
                "step": step, "version": step, "next_seq": next_seq, "states": self.store.states(run["id"])}

    def capabilities(self) -> dict[str, Any]:
        if self._capabilities is None:
            limits = {k: getattr(self.config, k) for k in ("max_body_bytes", "max_datums", "max_samples",
                                                           "order_timeout", "respond_within")}
            self._capabilities = {**self.provider.capabilities(), "limits": limits}
        return self._capabilities

    def check_limits(self, body: schemas.Op) -> None:
        data = getattr(body, "data", None)
        if data is not None and len(data) > self.config.max_datums:
            raise Refusal(413, "TooLarge", f"{len(data)} datums in one request; the limit is "
                                           f"{self.config.max_datums} (--max-datums): split the batch, the "
                                           "gradients add up across forward_backward calls")
        if isinstance(body, schemas.Sample):
            prompts = 1 if body.prompt_tokens and isinstance(body.prompt_tokens[0], int) else len(body.prompt_tokens)
            if prompts * body.num_samples > self.config.max_samples:
                raise Refusal(413, "TooLarge", f"{prompts} prompts x {body.num_samples} samples = "
                                               f"{prompts * body.num_samples} sequences; the limit is "
                                               f"{self.config.max_samples} (--max-samples): split the request")


def create_app(config: ServeConfig, provider: Provider | None = None) -> FastAPI:
    """The FastAPI app of ``wai serve``; ``provider`` defaults to the local engine."""
    service = Service(config, provider)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await service.runner.shutdown()
        service.store.close()

    app = FastAPI(title="whileai training service", lifespan=lifespan)
    app.state.service = service

    @app.exception_handler(Refusal)
    async def refused(request: Request, err: Refusal) -> Response:
        return reply(err.answer)

    @app.exception_handler(HTTPException)
    async def routing(request: Request, err: HTTPException) -> Response:  # no such route, or not with this method
        kind = "NotFound" if err.status_code == 404 else "MethodNotAllowed" if err.status_code == 405 else "HTTPError"
        return reply(error_answer(err.status_code, kind, f"{request.method} {request.url.path}: {err.detail}; "
                                                         "the routes are listed in docs/service.md"))

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, err: RequestValidationError) -> Response:
        return reply(error_answer(422, "ValidationError", f"{request.method} {request.url.path}: "
                                                          f"{str(err.errors())[:300]}"))

    @app.exception_handler(Exception)
    async def failed(request: Request, err: Exception) -> Response:  # a bug: still the documented error shape
        return reply(error_answer(500, "InternalError", f"wai serve failed on this request ({type(err).__name__}: "
                                                        f"{str(err)[:200]}); the server is still up. Please report "
                                                        "it with the request"))

    _routes(app, service)
    from whileai.service.tinker_api import mount

    mount(app, service)  # the Tinker SDK's protocol under /api/v1 (docs/tinker.md)
    return app


def _routes(app: FastAPI, service: Service) -> None:
    runner, store = service.runner, service.store

    @app.get("/healthz")
    async def healthz() -> Response:
        return reply((200, {"ok": True}))

    @app.get("/v1/training/capabilities")
    async def capabilities(request: Request) -> Response:
        service.owner(request)
        return reply((200, service.capabilities()))

    @app.post("/v1/training/sessions")
    async def create_session(request: Request) -> Response:
        owner = service.owner(request)
        session_id = f"session-{uuid.uuid4().hex[:12]}"
        store.add_session(session_id, owner)
        return reply((200, {"session_id": session_id}))

    @app.get("/v1/training/sessions")
    async def sessions(request: Request) -> Response:
        owner = service.owner(request)
        return reply((200, [{"session_id": s["id"], "created": s["created"]} for s in store.sessions(owner)]))

    @app.delete("/v1/training/sessions/{session_id}")
    async def close_session(session_id: str, request: Request) -> Response:
        owner = service.owner(request)
        service.session(session_id, owner)
        runs = store.runs(session_id)
        store.close_session(session_id)
        for run in runs:
            if run["id"] in runner.slots:
                await runner.close_run(runner.slots[run["id"]], "its session was closed")
        return reply((200, {"session_id": session_id, "closed": True, "runs": [r["id"] for r in runs]}))

    @app.post("/v1/training/sessions/{session_id}/runs")
    async def create_run(session_id: str, request: Request) -> Response:
        owner = service.owner(request)
        service.session(session_id, owner)
        spec = parse(schemas.CreateRun, await service.body(request)).model_dump()
        source = service.saved_state(spec.pop("from_state"), owner)
        try:
            run_id = await runner.create_run(session_id, owner, spec)
        except WhileaiError as err:
            raise Refusal(status_of(err), type(err).__name__, str(err)) from None
        if source is not None:  # the new run's own copy, which its load_state(NAME) reads
            shutil.copytree(source, service.config.data_dir / "runs" / run_id / "states" / source.name)
        return reply((200, service.run_info(service.run(run_id, owner))))

    @app.get("/v1/training/sessions/{session_id}/runs")
    async def runs(session_id: str, request: Request) -> Response:
        owner = service.owner(request)
        service.session(session_id, owner)
        return reply((200, [service.run_info(r) for r in store.runs(session_id)]))

    @app.get("/v1/training/runs/{run_id}")
    async def run(run_id: str, request: Request) -> Response:
        return reply((200, service.run_info(service.run(run_id, service.owner(request)))))

    @app.get("/v1/training/runs/{run_id}/operations")
    async def operations(run_id: str, request: Request) -> Response:
        service.run(run_id, service.owner(request))
        return reply((200, store.history(run_id)))

    @app.post("/v1/training/runs/{run_id}/{op}")
    async def operation(run_id: str, op: str, request: Request) -> Response:
        owner = service.owner(request)
        run = service.run(run_id, owner)
        if op not in schemas.OPERATIONS:
            raise Refusal(404, "NotFound", f"no operation {op!r}; the operations are {', '.join(schemas.OPERATIONS)}")
        raw = await service.body(request)
        body = parse(schemas.OPERATIONS[op], raw)
        service.check_limits(body)
        digest = hashlib.sha256(op.encode() + b"\0" + raw).hexdigest()
        future = runner.submit(runner.slot(run), op, body, digest)
        return await _wait(future, f"{run_id}.{body.seq_id}", service.config.respond_within)

    @app.get("/v1/training/requests/{request_id}")
    async def poll(request_id: str, request: Request, wait: float = 20.0) -> Response:
        owner = service.owner(request)
        run_id, _, seq = request_id.rpartition(".")
        service.run(run_id, owner)
        found = runner.answer_of(run_id, int(seq)) if seq.isdigit() else None
        if found is None:
            raise Refusal(404, "UnknownRequest", f"no request {request_id!r} is waiting, running or recorded "
                                                 "(the server may have restarted): send the operation again "
                                                 "with the same seq_id")
        if isinstance(found, tuple):
            return reply(found)
        return await _wait(found, request_id, min(max(wait, 0.0), 60.0))

    @app.get("/v1/training/runs/{run_id}/exports/{archive}")
    async def export(run_id: str, archive: str, request: Request) -> Response:
        service.run(run_id, service.owner(request))
        path = service.config.data_dir / "runs" / run_id / "exports" / archive
        if not ARCHIVE.match(archive) or not path.is_file():
            raise Refusal(404, "NotFound", f"run {run_id} has no export {archive!r}; call export_lora first")
        return FileResponse(path, media_type="application/gzip", filename=archive)


async def _wait(future: asyncio.Future[Answer], request_id: str, seconds: float) -> Response:
    """The answer if it comes within ``seconds``, else a 202 with the request id to poll."""
    try:
        return reply(await asyncio.wait_for(asyncio.shield(future), seconds))
    except asyncio.TimeoutError:
        return reply((202, {"request_id": request_id, "status": "pending"}))
