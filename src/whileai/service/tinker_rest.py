"""The Tinker ``RestClient`` routes ``wai serve`` answers: what tinker-cookbook reads about a training run.

    GET /api/v1/training_runs/{model_id}    RestClient.get_training_run(id) / get_training_run_by_tinker_path(path)

The cookbook calls ``get_training_run_by_tinker_path`` when it resumes or loads a checkpoint, to read the
renderer name it stored in the run's ``user_metadata`` at ``create_lora_training_client(user_metadata=...)``.
The answer is the SDK's ``TrainingRun``: the run's model, owner, LoRA rank, the time of its last operation,
its latest saved state (``last_checkpoint``, a ``tinker://<model_id>/weights/<name>`` path) and its
``user_metadata`` (kept in memory, like the other SDK maps in ``tinker_api.py``).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat()


def training_run(front: Any, run: dict[str, Any], alias: str) -> dict[str, Any]:
    """A service run as the SDK's ``TrainingRun`` (its ``training_run_id`` is the id the SDK asked for)."""
    store = front.service.store
    history = store.history(run["id"])
    last = max([run["created"], *(h["finished"] for h in history)])
    states = store.states(run["id"])
    checkpoint = None
    if states:
        latest = states[-1]
        checkpoint = {"checkpoint_id": f"weights/{latest['name']}", "checkpoint_type": "training",
                      "time": _time(latest["created"]), "tinker_path": f"tinker://{alias}/weights/{latest['name']}"}
    spec = run["spec"]
    return {"training_run_id": alias, "base_model": spec["base_model"], "model_owner": run["owner"],
            "is_lora": spec["lora_rank"] > 0, "lora_rank": spec["lora_rank"] or None,
            "corrupted": False, "last_request_time": _time(last), "last_checkpoint": checkpoint,
            "last_sampler_checkpoint": None, "user_metadata": front.metadata.get(run["id"])}


def mount_rest(app: FastAPI, front: Any, as_json: Any) -> None:
    @app.get("/api/v1/training_runs/{model_id}")
    async def get_training_run(model_id: str, request: Request) -> Response:
        owner = front.owner(request)
        run = front.run(model_id, owner, f"/api/v1/training_runs/{model_id}")
        return as_json(training_run(front, run, model_id))  # type: ignore[no-any-return]
