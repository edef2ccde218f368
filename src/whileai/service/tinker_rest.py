"""The Tinker ``RestClient`` routes ``wai serve`` answers, over the service's own store, and the ones it refuses.

    GET    /api/v1/training_runs                           list_training_runs(limit, offset)
    GET    /api/v1/training_runs/{model_id}                get_training_run(id) / ..._by_tinker_path(path)
    GET    /api/v1/training_runs/{model_id}/checkpoints    list_checkpoints(id): states and sampler weights
    DELETE /api/v1/training_runs/{id}/checkpoints/{kind}/{name}   delete_checkpoint(_from_tinker_path)
    PUT    /api/v1/training_runs/{id}/checkpoints/{kind}/{name}/ttl   set_checkpoint_ttl_from_tinker_path
    GET    /api/v1/checkpoints                             list_user_checkpoints(limit, offset)
    POST   /api/v1/weights_info                            get_weights_info_by_tinker_path(path)
    GET    /api/v1/billing/usage/checkpoints/current       get_current_checkpoint_storage_usage()
    GET    /api/v1/sessions, /sessions/{id}; POST /sessions/search    list_sessions, get_session, search_sessions
    POST   /api/v1/sessions/{id}/finish                    ServiceClient.close(status, detail): first wins
    POST   /api/v1/unload_model                            free a run's model (its saved states stay)

A checkpoint is a saved state (``tinker://<run>/weights/<name>``, its folder under ``--data-dir/runs/<run>/states``,
size measured on disk) or named sampler weights (``.../sampler_weights/<name>``, a snapshot in the run's memory: no
size). A TTL makes a checkpoint expire: at the first request after ``expires_at`` it is deleted like
``delete_checkpoint`` would. The session's display name, user metadata, finish reason and TTLs are kept in
SQLite beside the service's tables (``tinker_sessions``, ``tinker_ttl``), so they survive a restart.
Routes for what a single-machine server has no equivalent of (billing, audit, projects, publishing to a hub,
session traces, JWT auth) answer 400 naming the feature and why (``REFUSED``), never a bare 404.
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

SCHEMA = """
CREATE TABLE IF NOT EXISTS tinker_sessions (id TEXT PRIMARY KEY, display_name TEXT, user_metadata TEXT,
                                            reason TEXT, detail TEXT, finished REAL, project_id TEXT);
CREATE TABLE IF NOT EXISTS tinker_ttl (run_id TEXT NOT NULL, checkpoint TEXT NOT NULL, expires REAL NOT NULL,
                                       PRIMARY KEY (run_id, checkpoint));
"""
KINDS = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}
MAX_PAGE = 1000
DEFAULT_PROJECT = "default"  # a session created without project_id (a label here: there are no project rights)
REFUSED = {
    ("POST", "copy_weights"): ("copy_weights", "wai serve has no projects to copy a checkpoint between; its files "
                                               "are under --data-dir/runs/<model_id>/states"),
    ("GET", "billing/usage/events"): ("billing usage", "wai serve bills nothing"),
    ("GET", "audit"): ("the audit log", "wai serve keeps no audit log; its operations are listed by GET "
                                        "/v1/training/runs/<model_id>/operations"),
    ("POST", "auth/token"): ("JWT auth", "wai serve authenticates with its tokens as API keys (client/config "
                                         "says pjwt_auth_enabled false)"),
    ("POST", "create_custom_loss"): ("server-side custom losses", "forward_backward_custom runs the loss on the "
                                     "client (client/config says custom_loss_server_side false)"),
    ("POST", "cancel_future"): ("cancel_future", "a queued operation runs in its turn; client/dynamic_config says "
                                                 "sample_cancel_enabled false"),
}
REFUSED_SUFFIX = {
    "/publish": ("publishing a checkpoint", "wai serve has no hub to publish to; the checkpoint's files are under "
                                            "--data-dir/runs/<model_id>/states"),
    "/project": ("projects", "wai serve has no projects; a session belongs to its api_key"),
    "/trace_export": ("session trace export", "wai serve records each run's operations instead: GET "
                                              "/v1/training/runs/<model_id>/operations"),
}


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat()


def refusal(method: str, rest: str) -> str | None:
    """The message for a route of a feature wai serve does not have, or None."""
    found = REFUSED.get((method, rest))
    if found is None:
        found = next((v for k, v in REFUSED_SUFFIX.items() if rest.endswith(k)), None)
    return None if found is None else f"{method} /api/v1/{rest}: {found[0]} is not available on wai serve: {found[1]}"


class Finish(BaseModel):
    """``ServiceClient.close(status, detail)``'s body."""

    model_config = ConfigDict(extra="forbid")
    reason: dict[Literal["type"], Literal["success", "errored", "interrupted"]]
    detail: str | None = Field(None, max_length=10_000)


class WeightsInfo(BaseModel):
    """``get_weights_info_by_tinker_path``'s body (the SDK sends it as a plain dict)."""

    model_config = ConfigDict(extra="forbid")
    tinker_path: str


class Ttl(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl_seconds: int | None = Field(description="seconds from now until the checkpoint expires; None: never")


class Records:
    """The Tinker front's own rows in the service's database."""

    def __init__(self, store: Any) -> None:
        self.store = store
        with store.lock:
            store.db.executescript(SCHEMA)
            columns = {row[1] for row in store.db.execute("PRAGMA table_info(tinker_sessions)")}
            if "project_id" not in columns:  # a data dir written before sessions kept their project
                store.db.execute("ALTER TABLE tinker_sessions ADD COLUMN project_id TEXT")

    def write(self, sql: str, *args: Any) -> None:
        with self.store._write() as db:
            db.execute(sql, args)

    def session(self, session_id: str) -> dict[str, Any]:
        rows = self.store.rows("SELECT * FROM tinker_sessions WHERE id = ?", session_id)
        return rows[0] if rows else {"display_name": None, "user_metadata": None, "reason": None, "project_id": None}

    def add_session(self, session_id: str, display_name: str | None, metadata: dict[str, Any] | None,
                    project_id: str | None) -> None:
        meta = None if not metadata else json.dumps({str(k): str(v) for k, v in metadata.items()})
        self.write("INSERT INTO tinker_sessions VALUES (?, ?, ?, NULL, NULL, NULL, ?)", session_id, display_name, meta,
                   project_id)

    def finish(self, session_id: str, reason: str, detail: str | None, when: float) -> None:
        self.write("INSERT INTO tinker_sessions VALUES (?, NULL, NULL, ?, ?, ?, NULL) ON CONFLICT(id) DO UPDATE SET "
                   "reason = excluded.reason, detail = excluded.detail, finished = excluded.finished "
                   "WHERE tinker_sessions.reason IS NULL", session_id, reason, detail, when)

    def expiry(self, run_id: str, checkpoint: str) -> float | None:
        rows = self.store.rows("SELECT expires FROM tinker_ttl WHERE run_id = ? AND checkpoint = ?", run_id, checkpoint)
        return float(rows[0]["expires"]) if rows else None

    def set_ttl(self, run_id: str, checkpoint: str, ttl: int | None) -> None:
        if ttl is None:
            self.write("DELETE FROM tinker_ttl WHERE run_id = ? AND checkpoint = ?", run_id, checkpoint)
        else:
            self.write("INSERT OR REPLACE INTO tinker_ttl VALUES (?, ?, ?)", run_id, checkpoint, time.time() + ttl)

    def expired(self) -> list[tuple[str, str]]:
        rows = self.store.rows("SELECT run_id, checkpoint FROM tinker_ttl WHERE expires <= ?", time.time())
        return [(r["run_id"], r["checkpoint"]) for r in rows]


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


class Checkpoints:
    """A run's checkpoints as the SDK's ``Checkpoint``: saved states, named sampler weights, external weights."""

    def __init__(self, front: Any, records: Records) -> None:
        self.front = front
        self.records = records

    @property
    def runs_dir(self) -> Path:
        return Path(self.front.service.config.data_dir) / "runs"

    def of_run(self, run: dict[str, Any], alias: str) -> list[dict[str, Any]]:
        self.sweep()
        out = []
        for state in self.front.service.store.states(run["id"]):
            folder = self.runs_dir / run["id"] / "states" / state["name"]
            out.append(self.row(run, alias, "weights", state["name"], state["created"], _size(folder)))
        for path, (run_id, _) in self.front.paths.items():
            if run_id == run["id"]:
                out.append(self.row(run, alias, "sampler_weights", path.rsplit("/", 1)[1], None, None))
        for folder in sorted((self.runs_dir / run["id"] / "external").glob("[!.]*")):
            out.append(self.row(run, alias, "external_weights", folder.name, folder.stat().st_mtime, _size(folder)))
        return out

    def row(self, run: dict[str, Any], alias: str, kind: str, name: str, created: float | None,
            size: int | None) -> dict[str, Any]:
        expires = self.records.expiry(run["id"], f"{kind}/{name}")
        return {"checkpoint_id": f"{kind}/{name}", "checkpoint_type": KINDS[kind],
                "time": _time(created if created is not None else run["created"]),
                "tinker_path": f"tinker://{alias}/{kind}/{name}", "size_bytes": size, "public": False,
                "expires_at": None if expires is None else _time(expires),
                "user_metadata": self.front.checkpoint_metadata.get((run["id"], f"{kind}/{name}"))}

    def delete(self, run_id: str, checkpoint: str) -> bool:
        """Delete one checkpoint; False when there is none of that id."""
        kind, _, name = checkpoint.partition("/")
        folder = {"weights": self.runs_dir / run_id / "states" / name,
                  "external_weights": self.runs_dir / run_id / "external" / name}.get(kind)
        found = False
        if kind == "sampler_weights":
            found = self.front.paths.pop(f"tinker://{run_id}/sampler_weights/{name}", None) is not None
        elif folder is not None and folder.is_dir():
            shutil.rmtree(folder)
            found = True
        if kind == "weights":
            with self.front.service.store._write() as db:
                found = db.execute("DELETE FROM states WHERE run_id = ? AND name = ?", (run_id, name)).rowcount > 0 \
                    or found
        self.records.set_ttl(run_id, checkpoint, None)
        return found

    def sweep(self) -> None:
        """Delete every checkpoint whose TTL has passed."""
        for run_id, checkpoint in self.records.expired():
            self.delete(run_id, checkpoint)


def training_run(front: Any, run: dict[str, Any], alias: str) -> dict[str, Any]:
    """A service run as the SDK's ``TrainingRun`` (its ``training_run_id`` is the id the SDK asked for)."""
    store = front.service.store
    history = store.history(run["id"])
    last = max([run["created"], *(h["finished"] for h in history)])
    rows = front.checkpoints.of_run(run, alias)
    training = [c for c in rows if c["checkpoint_type"] == "training"]
    sampler = [c for c in rows if c["checkpoint_type"] == "sampler"]
    spec = run["spec"]
    return {"training_run_id": alias, "base_model": spec["base_model"], "model_owner": run["owner"],
            "is_lora": spec["lora_rank"] > 0, "lora_rank": spec["lora_rank"] or None,
            "corrupted": False, "last_request_time": _time(last),
            "last_checkpoint": training[-1] if training else None,
            "last_sampler_checkpoint": sampler[-1] if sampler else None,
            "user_metadata": front.metadata.get(run["id"])}


def int_param(request: Request, name: str, default: int, route: str) -> int:
    """A query parameter as an integer; a 400 in the front's error shape (not FastAPI's 422) when it is not one."""
    from whileai.service.tinker_api import TinkerError

    text = request.query_params.get(name)
    if text is None:
        return default
    if not text.lstrip("-").isdigit() or len(text) > 18:
        raise TinkerError(400, f"{route}: {name}={text!r} is not an integer")
    return int(text)


def _page(items: list[Any], limit: int, offset: int, route: str) -> list[Any]:
    from whileai.service.tinker_api import TinkerError

    if not (1 <= limit <= MAX_PAGE and offset >= 0):
        raise TinkerError(400, f"{route}: limit={limit}, offset={offset}: limit must be in [1, {MAX_PAGE}] and "
                               "offset >= 0")
    return items[offset:offset + limit]


def _cursor(limit: int, offset: int, total: int) -> dict[str, int]:
    return {"limit": limit, "offset": offset, "total_count": total}


def session_status(store: Any, records: Records, session_id: str) -> dict[str, Any]:
    """A session's ``SessionStatus``: active, finished by its client (first reason wins) or closed otherwise."""
    row, extra = store.session(session_id), records.session(session_id)
    if extra["reason"] is not None:
        return {"type": "client_finished", "reason": {"type": extra["reason"]}, "detail": extra["detail"]}
    if row["closed"] is not None:
        return {"type": "cancelled", "detail": "closed through DELETE /v1/training/sessions/<id>"}
    return {"type": "active"}


def mount_rest(app: FastAPI, front: Any, as_json: Any) -> None:
    from whileai.service.tinker_api import TinkerError

    store = front.service.store
    records = front.records
    checkpoints = front.checkpoints

    def owned_runs(owner: str) -> list[dict[str, Any]]:
        return [store.run(r["id"]) for r in store.rows("SELECT id FROM runs WHERE owner = ? ORDER BY created", owner)]

    def owned_session(session_id: str, owner: str, route: str) -> dict[str, Any]:
        row = store.session(session_id)
        if row is None or row["owner"] != owner:
            raise TinkerError(404, f"{route}: no session {session_id!r} for this api_key")
        return row  # type: ignore[no-any-return]

    def summary(row: dict[str, Any]) -> dict[str, Any]:
        extra = records.session(row["id"])
        runs = store.runs(row["id"])
        return {"session_id": row["id"], "created_at": _time(row["created"]), "owner": row["owner"],
                "project_id": extra["project_id"] or DEFAULT_PROJECT,
                "status": session_status(store, records, row["id"]),
                "checkpoints_count": sum(len(store.states(r["id"])) for r in runs),
                "display_name": extra["display_name"],
                "user_metadata": json.loads(extra["user_metadata"]) if extra["user_metadata"] else None}

    @app.get("/api/v1/training_runs")
    async def list_training_runs(request: Request) -> Response:
        owner = front.owner(request)
        limit, offset = (int_param(request, k, d, "/api/v1/training_runs") for k, d in (("limit", 20), ("offset", 0)))
        runs = owned_runs(owner)
        page = _page(runs, limit, offset, "/api/v1/training_runs")
        return as_json({"training_runs": [training_run(front, r, r["id"]) for r in page],  # type: ignore[no-any-return]
                        "cursor": _cursor(limit, offset, len(runs))})

    @app.get("/api/v1/training_runs/{model_id}")
    async def get_training_run(model_id: str, request: Request) -> Response:
        owner = front.owner(request)
        run = front.run(model_id, owner, f"/api/v1/training_runs/{model_id}")
        return as_json(training_run(front, run, model_id))  # type: ignore[no-any-return]

    @app.get("/api/v1/training_runs/{model_id}/checkpoints")
    async def list_checkpoints(model_id: str, request: Request) -> Response:
        run = front.run(model_id, front.owner(request), f"/api/v1/training_runs/{model_id}/checkpoints")
        return as_json({"checkpoints": checkpoints.of_run(run, model_id), "cursor": None})  # type: ignore[no-any-return]

    @app.get("/api/v1/checkpoints")
    async def list_user_checkpoints(request: Request) -> Response:
        owner = front.owner(request)
        limit, offset = (int_param(request, k, d, "/api/v1/checkpoints") for k, d in (("limit", 100), ("offset", 0)))
        rows = [c for r in owned_runs(owner) for c in checkpoints.of_run(r, r["id"])]
        page = _page(rows, limit, offset, "/api/v1/checkpoints")
        return as_json({"checkpoints": page, "cursor": _cursor(limit, offset, len(rows))})  # type: ignore[no-any-return]

    def checkpoint_of(model_id: str, kind: str, name: str, owner: str, route: str) -> tuple[dict[str, Any], str]:
        run = front.run(model_id, owner, route)
        checkpoint = f"{kind}/{name}"
        if kind not in KINDS or checkpoint not in {c["checkpoint_id"] for c in checkpoints.of_run(run, model_id)}:
            raise TinkerError(404, f"{route}: run {model_id} has no checkpoint {checkpoint!r}; list_checkpoints "
                                   "lists its checkpoints")
        return run, checkpoint

    @app.delete("/api/v1/training_runs/{model_id}/checkpoints/{kind}/{name}")
    async def delete_checkpoint(model_id: str, kind: str, name: str, request: Request) -> Response:
        route = f"/api/v1/training_runs/{model_id}/checkpoints/{kind}/{name}"
        run, checkpoint = checkpoint_of(model_id, kind, name, front.owner(request), route)
        checkpoints.delete(run["id"], checkpoint)
        return as_json({"deleted": f"tinker://{model_id}/{checkpoint}"})  # type: ignore[no-any-return]

    @app.put("/api/v1/training_runs/{model_id}/checkpoints/{kind}/{name}/ttl")
    async def set_ttl(model_id: str, kind: str, name: str, request: Request) -> Response:
        route = f"/api/v1/training_runs/{model_id}/checkpoints/{kind}/{name}/ttl"
        body, _, owner = await front.parsed(request, Ttl, route)
        if body.ttl_seconds is not None and body.ttl_seconds < 1:
            raise TinkerError(400, f"{route}: ttl_seconds={body.ttl_seconds} must be >= 1 (None: never expires)")
        run, checkpoint = checkpoint_of(model_id, kind, name, owner, route)
        records.set_ttl(run["id"], checkpoint, body.ttl_seconds)
        expires = records.expiry(run["id"], checkpoint)
        return as_json({"expires_at": None if expires is None else _time(expires)})  # type: ignore[no-any-return]

    @app.post("/api/v1/weights_info")
    async def weights_info(request: Request) -> Response:
        body, _, owner = await front.parsed(request, WeightsInfo, "/api/v1/weights_info")
        found = front.parse_path(body.tinker_path, "/api/v1/weights_info")
        run, _ = checkpoint_of(found["run"], found["kind"], found["name"], owner, "/api/v1/weights_info")
        spec = run["spec"]
        return as_json({"base_model": spec["base_model"], "is_lora": spec["lora_rank"] > 0,  # type: ignore[no-any-return]
                        "lora_rank": spec["lora_rank"] or None, "train_unembed": True, "train_mlp": True,
                        "train_attn": True})

    @app.get("/api/v1/billing/usage/checkpoints/current")
    async def storage_usage(request: Request, project_id: str | None = None) -> Response:
        owner = front.owner(request)
        rows = [c for r in owned_runs(owner) for c in checkpoints.of_run(r, r["id"])]
        size = sum(c["size_bytes"] or 0 for c in rows)
        item = {"project_id": project_id, "org_user_urn": owner, "checkpoint_count": len(rows),
                "size_bytes": size, "size_gigabytes": size / 1e9, "estimated_monthly_cost_usd": None}
        return as_json({"effective_rate_usd_per_gigabyte_month": None, "data": [item]})  # type: ignore[no-any-return]

    @app.get("/api/v1/sessions")
    async def list_sessions(request: Request) -> Response:
        owner = front.owner(request)
        limit, offset = (int_param(request, k, d, "/api/v1/sessions") for k, d in (("limit", 20), ("offset", 0)))
        ids = [s["id"] for s in store.rows("SELECT id FROM sessions WHERE owner = ? ORDER BY created", owner)]
        return as_json({"sessions": _page(ids, limit, offset, "/api/v1/sessions")})  # type: ignore[no-any-return]

    @app.post("/api/v1/sessions/search")
    async def search_sessions(request: Request) -> Response:
        from tinker import types as T

        body, _, owner = await front.parsed(request, T.SessionSearchRequest, "/api/v1/sessions/search")
        if body.owner.type != "own":
            raise TinkerError(400, "/api/v1/sessions/search: other owners' sessions are not available on wai serve: "
                                   "a search covers this api_key's sessions")
        rows = [summary(r) for r in store.rows("SELECT * FROM sessions WHERE owner = ? ORDER BY created DESC, id",
                                               owner)]

        def matches(s: dict[str, Any]) -> bool:
            named = body.session_id is None and body.display_name is None or s["session_id"] == body.session_id or (
                body.display_name is not None and all(w.lower() in (s["display_name"] or "").lower()
                                                      for w in body.display_name.split()))
            meta = all((s["user_metadata"] or {}).get(k) == v for k, v in body.user_metadata.items())
            status = body.statuses is None or any(
                q.type == s["status"]["type"] and (q.type != "client_finished" or q.reasons is None
                                                   or s["status"]["reason"]["type"] in q.reasons)
                for q in body.statuses)
            project = body.project_ids is None or s["project_id"] in body.project_ids
            return named and meta and status and project

        found = [s for s in rows if matches(s)]
        if body.cursor is not None:
            after = [i for i, s in enumerate(found) if s["session_id"] == body.cursor.last_session_id]
            found = found[after[0] + 1:] if after else []
        page = found[:body.limit]
        more = len(found) > body.limit
        cursor = {"last_created_at": page[-1]["created_at"], "last_session_id": page[-1]["session_id"]} \
            if more else None
        return as_json({"sessions": page, "next_cursor": cursor})  # type: ignore[no-any-return]

    @app.get("/api/v1/sessions/{session_id}")
    async def get_session(session_id: str, request: Request) -> Response:
        row = owned_session(session_id, front.owner(request), f"/api/v1/sessions/{session_id}")
        extra = records.session(session_id)
        runs = [r["id"] for r in store.rows("SELECT id FROM runs WHERE session_id = ? ORDER BY created", row["id"])]
        samplers = sorted(s for s in front.samplers if s.startswith(f"{session_id}:sample:"))
        return as_json({"training_run_ids": runs, "sampler_ids": samplers,  # type: ignore[no-any-return]
                        "user_metadata": json.loads(extra["user_metadata"]) if extra["user_metadata"] else None,
                        "display_name": extra["display_name"], "status": session_status(store, records, session_id)})

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request) -> Response:
        """First wins: a second finish (the SDK's retried ``close()``) answers the first one's reason."""
        route = f"/api/v1/sessions/{session_id}/finish"
        body, _, owner = await front.parsed(request, Finish, route)
        owned_session(session_id, owner, route)
        records.finish(session_id, body.reason["type"], body.detail, time.time())
        if store.session(session_id)["closed"] is None:
            runs = store.runs(session_id)
            store.close_session(session_id)
            for run in runs:
                if run["id"] in front.service.runner.slots:
                    await front.service.runner.close_run(front.service.runner.slots[run["id"]], "its session finished")
        extra = records.session(session_id)
        return as_json({"session_id": session_id, "status": session_status(store, records, session_id),  # type: ignore[no-any-return]
                        "finished_at": _time(extra["finished"]) if extra["finished"] else None})

    @app.post("/api/v1/unload_model")
    async def unload_model(request: Request) -> Response:
        from tinker import types as T

        body, _, owner = await front.parsed(request, T.UnloadModelRequest, "/api/v1/unload_model")
        run = front.run(body.model_id, owner, "/api/v1/unload_model")
        slot = front.service.runner.slot(run)
        if slot.closed is None:
            await front.service.runner.close_run(slot, "its model was unloaded (unload_model)")
            store.set_status(run["id"], "closed")
        request_id = f"unload.{run['id']}"
        front.ready[request_id] = {"model_id": body.model_id, "type": "unload_model"}
        return as_json({"request_id": request_id, "model_id": body.model_id})  # type: ignore[no-any-return]
