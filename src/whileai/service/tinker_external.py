"""``save_weights_external`` and ``get_external_weights_urls``: a run's weights as files, with expiring signed URLs.

    POST /api/v1/save_weights_external                    TrainingClient.save_weights_external(name, ttl_seconds)
    GET  /api/v1/training_runs/{id}/checkpoints/external_weights/{name}/external_weights_urls
    GET  /api/v1/external_files/{id}/{name}/{file}?expires=T&signature=S   one file, no api_key (the URL is the key)

The weights are the run's ``export_lora`` (a PEFT adapter for a LoRA run, the whole model otherwise: the files
``wai export`` writes), unpacked into ``--data-dir/runs/<id>/external/<name>`` and listed, sized, given a TTL
and deleted like any checkpoint (``tinker://<id>/external_weights/<name>``). A URL is signed with HMAC-SHA256
under a key kept in ``--data-dir/tinker_url_key`` (made once, mode 0600) and expires ``URL_SECONDS`` after it
was issued. ``age_encryption_recipients`` (encrypting the files) is refused by name: no age implementation here.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, Response

URL_SECONDS = 3600


class External:
    """The external-weights folders of runs and the key their URLs are signed with."""

    def __init__(self, data_dir: Path) -> None:
        self.runs = data_dir / "runs"
        key_file = data_dir / "tinker_url_key"
        if not key_file.is_file():
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(32))
        self.key = key_file.read_text().strip().encode()

    def folder(self, run_id: str, name: str) -> Path:
        return self.runs / run_id / "external" / name

    def unpack(self, run_id: str, archive: str, name: str) -> bool:
        """The export ``archive`` unpacked as external weights ``name``; False when it already was (a retried
        answer finds it there)."""
        folder = self.folder(run_id, name)
        if folder.is_dir():
            return False
        partial = folder.with_name(f".{name}.partial")
        with tarfile.open(self.runs / run_id / "exports" / archive) as tar:
            tar.extractall(partial, filter="data")
        partial.replace(folder)
        return True

    def sign(self, run_id: str, name: str, file: str, expires: int) -> str:
        message = f"{run_id}/{name}/{file}/{expires}".encode()
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()

    def urls(self, base: str, run_id: str, name: str) -> dict[str, Any]:
        expires = int(time.time()) + URL_SECONDS
        folder = self.folder(run_id, name)
        files = sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())
        return {"urls": {f: f"{base}/api/v1/external_files/{run_id}/{name}/{f}?expires={expires}&signature="
                            f"{self.sign(run_id, name, f, expires)}" for f in files},
                "expires": datetime.fromtimestamp(expires, tz=timezone.utc).isoformat()}


def mount_external(app: FastAPI, front: Any, as_json: Any) -> None:
    from tinker import types as T

    from whileai.service.schemas import STATE_NAME
    from whileai.service.tinker_api import TinkerError
    from whileai.service.tinker_rest import int_param

    external = front.external = External(Path(front.service.config.data_dir))

    @app.post("/api/v1/save_weights_external")
    async def save_weights_external(request: Request) -> Response:
        route = "/api/v1/save_weights_external"
        body, raw, run = await front.on_model(request, T.SaveWeightsExternalRequest, route)
        if body.age_encryption_recipients:
            raise TinkerError(400, f"{route}: age_encryption_recipients (encryption) is not available on wai serve: "
                                   "it has no age implementation; the files stay on this machine under --data-dir")
        if not re.match(STATE_NAME, body.path):
            raise TinkerError(400, f"{route}: name {body.path!r}: letters, digits, '.', '_', '-' (not starting "
                                   "with '.'), up to 100 characters")
        if body.ttl_seconds is not None and body.ttl_seconds < 1:
            raise TinkerError(400, f"{route}: ttl_seconds={body.ttl_seconds} must be >= 1 (None: never expires)")
        shape = {"kind": "external", "route": route, "name": body.path, "ttl": body.ttl_seconds}
        merged = not run["spec"].get("lora_rank")  # a full fine-tune has no adapter: its weights are the model
        return front.queued(run, body, "export_lora", {"merged": merged}, raw, shape)  # type: ignore[no-any-return]

    @app.get("/api/v1/training_runs/{model_id}/checkpoints/external_weights/{name}/external_weights_urls")
    async def external_urls(model_id: str, name: str, request: Request) -> Response:
        route = f"/api/v1/training_runs/{model_id}/checkpoints/external_weights/{name}/external_weights_urls"
        run = front.run(model_id, front.owner(request), route)
        front.checkpoints.sweep()
        if not re.match(STATE_NAME, name) or not external.folder(run["id"], name).is_dir():
            raise TinkerError(404, f"{route}: run {model_id} has no external weights {name!r}; "
                                   "save_weights_external(name) writes them")
        return as_json(external.urls(str(request.base_url).rstrip("/"), run["id"], name))  # type: ignore[no-any-return]

    @app.get("/api/v1/external_files/{run_id}/{name}/{file:path}")
    async def external_file(run_id: str, name: str, file: str, request: Request) -> Response:
        route = "/api/v1/external_files"
        expires = int_param(request, "expires", 0, route)
        signature = request.query_params.get("signature", "")
        if not hmac.compare_digest(external.sign(run_id, name, file, expires), signature):
            raise TinkerError(403, f"{route}: the signature does not match; ask get_external_weights_urls for a URL")
        if expires < time.time():
            raise TinkerError(403, f"{route}: the URL expired; ask get_external_weights_urls for a new one")
        folder = external.folder(run_id, name).resolve()
        path = (folder / file).resolve()
        if folder not in path.parents or not path.is_file():
            raise TinkerError(404, f"{route}: no file {file!r} in external weights {name!r}")
        return FileResponse(path)
