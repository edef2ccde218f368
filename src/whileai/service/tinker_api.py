"""The Tinker SDK's protocol on ``wai serve`` (``/api/v1/...``), over the same runs, order and records.

    import tinker
    service = tinker.ServiceClient(base_url="http://127.0.0.1:8321", api_key=TOKEN)   # TOKEN starts "tml-"
    training = service.create_lora_training_client(base_model="builtin:tiny", rank=8)

A Tinker model is a service run; a Tinker session is a service session. Every training-client request
(``forward_backward``, ``optim_step``, ``save_weights``, ``load_weights``, ``save_weights_for_sampler``) and every
``asample`` becomes one operation of its run in ``runs.py``: this module gives it the run's next sequence
number when it first arrives and remembers which SDK request that number belongs to, so an SDK retry (same
model and ``seq_id``, or same sampling session and ``seq_id``) reaches the same number and ``runs.py`` answers
it from its record, or a 409 if the bytes differ. The SDK submits one client's requests in turn, so arrival
order is the SDK's order. ``request_id`` is ``<run>.<seq>``; ``retrieve_future`` long-polls the run's answer
and shapes it into the SDK's type (protobuf for ``forward_backward`` and ``sample``). A failed operation comes
back as ``{"error", "category"}``, which the SDK raises as ``RequestFailedError`` with the message.
Everything that can refuse a request (its body through the service's one body reader, the service's limits,
names and paths, the context) is checked before it takes a sequence number or makes a run, so a refused
request leaves the run as it was.

The routes live by topic: sessions here, training in ``tinker_training.py``, sampling in ``tinker_sample.py``,
the RestClient's routes (and those refused by name) in ``tinker_rest.py``, the futures poller and clones in
``tinker_futures.py``, external weights in ``tinker_external.py``. docs/tinker.md's conformance table lists every SDK call and its route.

What lives only in memory (lost on restart, as the engine's sampler weights are): the map from SDK request
to sequence number, sampling sessions, named sampler-weight paths, and the SDK-made model ids of clients
created from a saved state.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from whileai.errors import WhileaiError
from whileai.service import schemas
from whileai.service.runs import status_of

PROTO = "application/x-protobuf"
POLL_SECONDS = 25.0  # under the SDK's 45 s retrieve_future timeout
# A checkpoint path; its name is a state name (schemas.STATE_NAME: no "..", no "/"), checked before any work.
WEIGHTS_PATH = re.compile(r"^tinker://(?P<run>[A-Za-z0-9][A-Za-z0-9:._-]*)/(?P<kind>weights|sampler_weights)/"
                          r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,99})$")
EXTERNAL_PATH = re.compile(r"^tinker://(?P<run>[A-Za-z0-9][A-Za-z0-9:._-]*)/(?P<kind>external_weights)/"
                           r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,99})$")
PATH_RULE = ("tinker://<model_id>/weights/<name> or tinker://<model_id>/sampler_weights/<name>, the name letters, "
             "digits, '.', '_', '-' (not starting with '.')")


CLIENT_CONFIG = {"pjwt_auth_enabled": False, "proto_compress_fwdbwd": False, "custom_loss_server_side": False,
                 "sample_use_retrieve_futures": True, "sample_join_sampling_session": True}


class TinkerError(WhileaiError):
    """A Tinker request this server refuses before running it: a 4xx whose body names the route."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def json_answer(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body), status_code=status, media_type="application/json")


def _parse(model: type[BaseModel], raw: bytes, route: str) -> Any:
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as err:
        problems = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in err.errors()[:10]]
        raise TinkerError(400, f"{route}: malformed {model.__name__}: {'; '.join(problems)}") from None


class TinkerFront:
    """The SDK's view of the service: requests in, run operations out, answers back in the SDK's types."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.seqs: dict[tuple[Any, ...], int] = {}       # (run, SDK request key) -> the run's seq
        self.next: dict[str, int] = {}                   # run -> next seq to give out
        self.shapes: dict[str, dict[str, Any]] = {}      # request_id -> how to shape its answer
        self.ready: dict[str, dict[str, Any]] = {}       # request_id -> an answer known at once (create_model)
        self.builtin_tokenizer_written = False           # a built-in's tokenizer folder, rewritten once per process
        self.refused: dict[str, tuple[int, str]] = {}    # request_id -> runs.py's refusal, given at submit
        self.samplers: dict[str, tuple[str, int | None, str | None]] = {}  # sampling session -> run, version, path
        self.paths: dict[str, tuple[str, int]] = {}     # tinker://run/sampler_weights/name -> run, version
        self.aliases: dict[str, str] = {}                # the SDK's "<session>:train:<n>" model id -> run
        self.metadata: dict[str, dict[str, Any]] = {}    # run -> create_model's user_metadata (RestClient reads it)
        self.records: Any = None                         # tinker_rest.Records / Checkpoints, set by mount()
        self.checkpoints: Any = None
        self.external: Any = None                        # tinker_external.External, set by mount()
        self.checkpoint_metadata: dict[tuple[str, str], dict[str, str]] = {}  # (run, checkpoint id) -> user_metadata
        from whileai.service.tinker_futures import Futures

        self.futures = Futures()

    # ------------------------------------------------------------------ who, which run
    def owner(self, request: Request) -> str:
        key = request.headers.get("x-api-key")  # the SDK's header; a wai client's Authorization works as well
        owner = self.service.tokens.owner(f"Bearer {key}" if key else request.headers.get("authorization") or "")
        if owner is None:
            raise TinkerError(401, "the api_key is not accepted by this wai serve: pass one of its tokens "
                                   "(--token-file or WAI_TOKEN; the Tinker SDK needs it to start with 'tml-')")
        return owner  # type: ignore[no-any-return]

    def run(self, run_id: str, owner: str, route: str) -> dict[str, Any]:
        row = self.service.store.run(self.aliases.get(run_id, run_id))
        if row is None or row["owner"] != owner:
            raise TinkerError(404, f"{route}: no model {run_id!r} for this api_key; create one with "
                                   "create_lora_training_client")
        return row  # type: ignore[no-any-return]

    def parse_path(self, path: str, route: str) -> Any:
        """A checkpoint path's parts (run, kind, name); a 400 naming the rule for anything else."""
        found = WEIGHTS_PATH.match(path) or EXTERNAL_PATH.match(path)
        if found is None:
            raise TinkerError(400, f"{route}: {path!r} is not a checkpoint path: {PATH_RULE}")
        return found

    def session(self, session_id: str, owner: str, route: str) -> None:
        row = self.service.store.session(session_id)
        if row is None or row["owner"] != owner or row["closed"] is not None:
            raise TinkerError(404, f"{route}: no open session {session_id!r} for this api_key")

    async def body(self, request: Request, route: str) -> bytes:
        """A route's raw body, read through the service's one body reader (its ``--max-body-mb`` limit)."""
        from whileai.service.app import Refusal

        try:
            return await self.service.body(request)  # type: ignore[no-any-return]
        except Refusal as err:
            raise TinkerError(err.answer[0], f"{route}: {err}") from None

    async def parsed(self, request: Request, model: type[BaseModel], route: str) -> tuple[Any, bytes, str]:
        """A route's body as ``model``, its raw bytes and the caller's owner (401 / 413 / 400 when they are not)."""
        owner = self.owner(request)
        raw = await self.body(request, route)
        return _parse(model, raw, route), raw, owner

    async def on_model(self, request: Request, model: type[BaseModel], route: str) -> tuple[Any, bytes, dict[str, Any]]:
        """A training client's request: its body, raw bytes and the run its ``model_id`` names."""
        body, raw, owner = await self.parsed(request, model, route)
        return body, raw, self.run(body.model_id, owner, route)

    # ------------------------------------------------------------------ submitting to runs.py
    def queued(self, run: dict[str, Any], body: Any, op: str, fields: dict[str, Any], raw: bytes,
               shape: dict[str, Any]) -> Response:
        """Queue a training client's ``op`` (``submit``) and answer with the SDK's future."""
        request_id = self.submit(run, ("train", body.seq_id), op, fields, raw, shape)
        return json_answer({"request_id": request_id, "model_id": body.model_id})

    def checked(self, op: str, fields: dict[str, Any], route: str) -> schemas.Op:
        """The operation's body, validated and within the service's limits (``--max-samples``,
        ``--max-datums``), before it takes a sequence number: a refused request uses up nothing."""
        from whileai.service.app import Refusal

        try:
            body = schemas.OPERATIONS[op](seq_id=0, **fields)
        except ValidationError as err:
            problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()[:5]]
            raise TinkerError(400, f"{route}: {'; '.join(problems)}") from None
        try:
            self.service.check_limits(body)
        except Refusal as err:
            raise TinkerError(err.answer[0], f"{route}: {err}") from None
        return body

    def submit(self, run: dict[str, Any], key: tuple[Any, ...], op: str, fields: dict[str, Any], raw: bytes,
               shape: dict[str, Any], watch: Any = None) -> str:
        """Give the SDK request its run sequence number (the same one on a retry) and queue the operation.
        Everything that can refuse it runs first, so a refusal leaves the run's numbering as it was."""
        checked = self.checked(op, fields, shape["route"])
        runner = self.service.runner
        slot = runner.slot(run)
        where = (run["id"], *key)
        if where not in self.seqs:
            self.seqs[where] = max(self.next.get(run["id"], 0), slot.next_seq)
            self.next[run["id"]] = self.seqs[where] + 1
        seq = self.seqs[where]
        body = checked.model_copy(update={"seq_id": seq})
        digest = hashlib.sha256(op.encode() + b"\0" + raw).hexdigest()
        future = runner.submit(slot, op, body, digest)
        request_id = f"{run['id']}.{seq}"
        if future.done() and future.result()[0] != 200:  # refused at once (a changed retry, a closed run)
            request_id = f"{request_id}.refused-{uuid.uuid4().hex[:8]}"
            self.refused[request_id] = future.result()
        self.shapes[request_id] = shape
        if watch is not None:  # a sampling client's futures poller hears of its completion
            watch(request_id, future)
        return request_id

    async def retrieve(self, request_id: str, owner: str) -> Response:
        if request_id in self.ready:
            self.run(self.ready[request_id]["model_id"], owner, "/api/v1/retrieve_future")  # the owner's only
            return json_answer(self.ready[request_id])
        if request_id in self.refused:
            return self.shaped(request_id, *self.refused[request_id])
        run_id, _, seq = request_id.rpartition(".")
        self.run(run_id, owner, "/api/v1/retrieve_future")
        found = self.service.runner.answer_of(run_id, int(seq)) if seq.isdigit() and len(seq) < 19 else None
        if found is None or request_id not in self.shapes:
            raise TinkerError(410, f"/api/v1/retrieve_future: request {request_id!r} is unknown here (the server "
                                   "may have restarted); the SDK sends it again")
        if isinstance(found, tuple):
            return self.shaped(request_id, *found)
        try:
            status, text = await asyncio.wait_for(asyncio.shield(found), POLL_SECONDS)
        except asyncio.TimeoutError:
            return json_answer({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        return self.shaped(request_id, status, text)

    def shaped(self, request_id: str, status: int, text: str) -> Response:
        """A recorded answer as the SDK's result type, or its error as ``{"error", "category"}``."""
        shape, answer = self.shapes[request_id], json.loads(text)
        if status != 200:
            error = answer.get("error", {})
            return json_answer({"error": f"{shape['route']}: {error.get('type')}: {error.get('message')}",
                          "category": "user" if status < 500 else "server"})
        run_id, result = answer["run_id"], answer["result"]
        kind = shape["kind"]
        if kind == "forward_backward":
            from whileai.service.tinker_wire import forward_backward_output
            return Response(forward_backward_output(result), media_type=PROTO)
        if kind == "sample":
            from whileai.service.tinker_wire import sample_output
            return Response(sample_output(result, shape.get("last_n"), shape.get("sparse")), media_type=PROTO)
        if kind == "optim_step":
            return json_answer({"metrics": result["metrics"]})
        if kind == "external":
            if self.external.unpack(run_id, result["archive"], shape["name"]) and shape["ttl"] is not None:
                self.records.set_ttl(run_id, f"external_weights/{shape['name']}", shape["ttl"])
            return json_answer({"path": f"tinker://{run_id}/external_weights/{shape['name']}",
                          "type": "save_weights_external"})
        if kind in ("save_weights", "load_weights"):
            self.start_ttl(run_id, f"weights/{shape['name']}", shape.get("ttl"))
            return json_answer({"path": f"tinker://{run_id}/weights/{shape['name']}", "type": kind})
        return json_answer(self.sampler_saved(run_id, result["version"], shape))

    def sampler_saved(self, run_id: str, version: int, shape: dict[str, Any]) -> dict[str, Any]:
        if shape["name"] is not None:
            path = f"tinker://{run_id}/sampler_weights/{shape['name']}"
            self.paths[path] = (run_id, version)
            self.start_ttl(run_id, f"sampler_weights/{shape['name']}", shape.get("ttl"))
            return {"path": path, "type": "save_weights_for_sampler"}
        self.samplers[shape["sampler"]] = (run_id, version, None)
        return {"sampling_session_id": shape["sampler"], "type": "save_weights_for_sampler"}

    def check_saving(self, route: str, ttl: int | None) -> None:
        if ttl is not None and ttl < 1:
            raise TinkerError(400, f"{route}: ttl_seconds={ttl} must be >= 1 (None: never expires)")

    def start_ttl(self, run_id: str, checkpoint: str, ttl: int | None) -> None:
        """A checkpoint's ``ttl_seconds``, counted from its first answer (an SDK retry does not extend it)."""
        if ttl is not None and self.records.expiry(run_id, checkpoint) is None:
            self.records.set_ttl(run_id, checkpoint, ttl)

    def keep_checkpoint_metadata(self, run_id: str, checkpoint: str, metadata: dict[str, str] | None) -> None:
        if metadata:
            self.checkpoint_metadata[(run_id, checkpoint)] = {str(k): str(v) for k, v in metadata.items()}

    # ------------------------------------------------------------------ models
    async def open_run(self, session_id: str, owner: str, base_model: str, rank: int, seed: int) -> str:
        try:
            spec = schemas.CreateRun.model_validate({"base_model": base_model, "lora_rank": rank,
                                                     "seed": seed}).model_dump()
        except ValidationError as err:
            problems = [f"{'.'.join(str(p) for p in e['loc'])}={e['input']!r}: {e['msg']}" for e in err.errors()]
            raise TinkerError(400, f"/api/v1/create_model: {'; '.join(problems)}") from None
        try:
            return await self.service.runner.create_run(session_id, owner, spec)  # type: ignore[no-any-return]
        except WhileaiError as err:
            raise TinkerError(status_of(err), f"/api/v1/create_model: {err}") from None

    async def from_state(self, body: Any, owner: str, raw: bytes) -> Response:
        """``create_training_client_from_state(_with_optimizer)``: a new run of the saved run's model, with a
        copy of the saved state in its folder, whose first operation loads it."""
        route = "/api/v1/load_weights"
        if body.session_id is None or body.model_seq_id is None:
            raise TinkerError(400, f"{route}: give model_id, or session_id and model_seq_id")
        self.session(body.session_id, owner, route)
        found = WEIGHTS_PATH.match(body.path)
        source = self.run(found["run"], owner, route) if found is not None else None
        runs = Path(self.service.config.data_dir) / "runs"
        if found is None or source is None or found["kind"] != "weights" or not (
                runs / source["id"] / "states" / found["name"]).is_dir():
            raise TinkerError(404 if found is not None else 400,
                              f"{route}: no saved state at {body.path!r}; save_state(name) writes {PATH_RULE}")
        spec = source["spec"]
        if body.base_model not in (None, spec["base_model"]):
            raise TinkerError(400, f"{route}: the state was saved from {spec['base_model']!r}, not "
                                   f"{body.base_model!r}; a state loads into the model it was saved from")
        alias = f"{body.session_id}:train:{body.model_seq_id}"
        fields = {"name": found["name"], "optimizer": body.optimizer}
        self.checked("load_state", fields, route)  # before a run is made: a refusal leaves no orphan run
        if alias not in self.aliases:  # a retry reuses the run made the first time
            run_id = await self.open_run(body.session_id, owner, spec["base_model"], spec["lora_rank"], spec["seed"])
            try:
                shutil.copytree(runs / source["id"] / "states" / found["name"], runs / run_id / "states" / found["name"])
            except OSError as err:  # the new run is of no use without its copy: close it, keep nothing loaded
                await self.service.runner.close_run(self.service.runner.slots[run_id], "its state could not be copied")
                raise TinkerError(500, f"{route}: copying the state {body.path!r} failed ({err})") from None
            self.aliases[alias] = run_id
            self.keep_metadata(run_id, body.user_metadata)
        request_id = self.submit(self.run(alias, owner, route), ("from_state",), "load_state", fields, raw,
                                 {"kind": "load_weights", "route": route, "name": found["name"]})
        return json_answer({"request_id": request_id, "model_id": alias})

    def keep_metadata(self, run_id: str, metadata: dict[str, Any] | None) -> None:
        """A run's ``user_metadata`` (from create_model or a load), for the RestClient's training run."""
        if metadata:
            self.metadata[run_id] = {str(k): str(v) for k, v in metadata.items()}

    def tokenizer_id(self, base_model: str) -> str:
        """Where ``AutoTokenizer.from_pretrained`` finds this model's tokenizer. A built-in's is written once per
        server process (so a data dir from an older version never serves an older tokenizer rule)."""
        if not base_model.startswith("builtin:"):
            return base_model
        folder = Path(self.service.config.data_dir).resolve() / "tokenizers" / "builtin"
        if not self.builtin_tokenizer_written:
            from whileai.engine.models import byte_tokenizer

            byte_tokenizer().save_pretrained(str(folder))
            self.builtin_tokenizer_written = True
        return str(folder)


def mount(app: FastAPI, service: Any) -> None:
    """Add the Tinker routes to ``wai serve``'s app (without the SDK installed: a 501 saying how to add it)."""
    try:
        import tinker  # noqa: F401
    except ImportError:
        @app.api_route("/api/v1/{rest:path}", methods=["GET", "POST"])
        async def missing(rest: str) -> Response:
            return json_answer({"error": f"/api/v1/{rest}: this wai serve has no Tinker support; install it with "
                                   "`pip install whileai[tinker]` and restart"}, 501)
        return
    front = TinkerFront(service)

    @app.exception_handler(TinkerError)
    async def refused(request: Request, err: TinkerError) -> Response:
        return json_answer({"error": str(err)}, err.status)

    _session_routes(app, front)
    from whileai.service.tinker_training import mount_training

    mount_training(app, front)
    from whileai.service.tinker_sample import mount_sampling

    mount_sampling(app, front, json_answer)
    from whileai.service.tinker_futures import mount_futures
    from whileai.service.tinker_rest import Checkpoints, Records, mount_rest, refusal

    front.records = Records(service.store)
    front.checkpoints = Checkpoints(front, front.records)
    mount_rest(app, front, json_answer)
    mount_futures(app, front, json_answer)
    from whileai.service.tinker_external import mount_external

    mount_external(app, front, json_answer)

    @app.api_route("/api/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def unsupported(rest: str, request: Request) -> Response:
        refused = refusal(request.method, rest)
        if refused is not None:
            return json_answer({"error": refused}, 400)
        return json_answer({"error": f"{request.method} /api/v1/{rest} is not a Tinker route (wai serve serves every "
                               "route of the Tinker SDK 0.38; docs/tinker.md lists them)"}, 404)


def _session_routes(app: FastAPI, front: TinkerFront) -> None:
    from tinker import types as T

    store = front.service.store

    @app.post("/api/v1/client/config")
    @app.post("/api/v1/client/dynamic_config")
    async def client_config(request: Request) -> Response:
        # API-key auth, uncompressed protobuf (the SDK's defaults), and the two sampling routes served here
        return json_answer(CLIENT_CONFIG)

    @app.get("/api/v1/healthz")
    async def healthz() -> Response:
        return json_answer({"status": "ok"})

    @app.post("/api/v1/telemetry")
    async def telemetry(request: Request) -> Response:
        front.owner(request)
        await front.body(request, "/api/v1/telemetry")  # read within the body limit, then dropped
        return json_answer({"status": "accepted"})  # the SDK's usage events are meant for Tinker Cloud; none kept

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities(request: Request) -> Response:
        front.owner(request)
        models = front.service.capabilities()["models"]
        return json_answer({"supported_models": [{"model_name": m, "trainable": True, "sampleable": True}
                                           for m in models]})

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> Response:
        body, _, owner = await front.parsed(request, T.CreateSessionRequest, "/api/v1/create_session")
        session_id = f"session-{uuid.uuid4().hex[:12]}"
        store.add_session(session_id, owner)
        front.records.add_session(session_id, body.display_name, body.user_metadata, body.project_id)
        return json_answer({"session_id": session_id, "type": "create_session"})

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> Response:
        body, _, owner = await front.parsed(request, T.SessionHeartbeatRequest, "/api/v1/session_heartbeat")
        row = store.session(body.session_id)
        if row is None or row["owner"] != owner or row["closed"] is not None:
            return json_answer({"error": f"session {body.session_id!r} is finished"}, 410)
        return json_answer({"type": "session_heartbeat"})
