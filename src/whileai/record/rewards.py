"""Late rewards: ``POST /v1/rewards {"trace_id": ..., "reward": ..., "replace": false}``, and the same from
Python (``score``, over HTTP) or straight into a data directory (``RecordStore(dir).score``).

A trace is scored once: a second score is a 409 that says what it holds, unless ``replace`` is true. An
unknown trace id is a 404; a body that is not an object with a string ``trace_id`` and a finite number
``reward`` (NaN and infinities refused) is a 422 naming the field.
"""

from __future__ import annotations

import math
import os
from typing import Any

from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from whileai.errors import WhileaiError
from whileai.record.requests import error_response
from whileai.record.store import AlreadyScored, RecordStore, UnknownTrace
from whileai.service.auth import TOKEN_ENV

FIELDS = ("trace_id", "reward", "replace")


def check_reward(body: Any, fix: str = "Fix the body and send again") -> tuple[str, float, bool] | str:
    """``(trace_id, reward, replace)``, or the reason the body is refused, ending in ``fix``."""
    if not isinstance(body, dict):
        return "the body must be a JSON object {\"trace_id\": str, \"reward\": number, \"replace\": bool}"
    problems = [f"unknown field {k!r} (fields: {list(FIELDS)})" for k in sorted(set(body) - set(FIELDS))]
    trace_id, reward, replace = body.get("trace_id"), body.get("reward"), body.get("replace", False)
    if not isinstance(trace_id, str) or not trace_id:
        problems.append(f"'trace_id' is {trace_id!r}; it must be the id from the x-whileai-trace-id header")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        problems.append(f"'reward' is {reward!r}; it must be a finite number (a NaN or infinite score would "
                        "poison the batch mean)")
    if not isinstance(replace, bool):
        problems.append(f"'replace' is {replace!r}; it must be true or false")
    if problems:
        return "; ".join(problems) + f". {fix}"
    return str(trace_id), float(reward or 0.0), bool(replace)


async def reward_route(store: RecordStore, body: Any) -> Response:
    """``POST /v1/rewards`` on a body already read (within the limit) and parsed."""
    checked = check_reward(body)
    if isinstance(checked, str):
        return error_response(422, checked)
    trace_id, reward, replace = checked
    try:
        replaced = await run_in_threadpool(store.score, trace_id, reward, replace)
    except UnknownTrace:
        return error_response(404, f"no trace {trace_id!r} is recorded here. Fix: send an id this recorder "
                                   "returned in its x-whileai-trace-id header", "not_found")
    except AlreadyScored as err:
        return error_response(409, f"trace {trace_id!r} is already scored ({err.reward:g}). Fix: send "
                                   "\"replace\": true to replace the score", "conflict")
    return JSONResponse({"trace_id": trace_id, "reward": reward, "replaced": replaced})


def score(url: str, trace_id: str, reward: float, replace: bool = False, timeout: float = 30.0,
          token: str | None = None) -> dict[str, Any]:
    """Score a trace through a running recorder at ``url`` with its ``token`` (default ``$WAI_TOKEN``); a
    refusal raises ``WhileaiError`` with its message."""
    import httpx

    token = token or os.environ.get(TOKEN_ENV)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        answer = httpx.post(f"{url.rstrip('/')}/v1/rewards", timeout=timeout, headers=headers,
                            json={"trace_id": trace_id, "reward": reward, "replace": replace})
    except httpx.HTTPError as err:
        raise WhileaiError(f"no recorder answered at {url} ({err}). Fix: start `wai record`, or score into its "
                           "data folder with --data-dir") from None
    if answer.status_code != 200:
        try:
            message = answer.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = answer.text
        raise WhileaiError(f"reward refused ({answer.status_code}): {message}")
    return dict(answer.json())
