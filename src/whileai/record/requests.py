"""The OpenAI-compatible request bodies the policy server takes, checked field by field.

Every problem is collected and reported at once, as one 400 naming each field, what was wrong and the fix.
An unknown field is refused rather than ignored: a knob the server cannot apply (a penalty, a logit bias)
would change the sampled distribution, and the recorded log-probabilities would no longer be the sampler's.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop", "stream",
          "stream_options", "logprobs", "return_token_ids", "frequency_penalty", "presence_penalty", "user",
          "stop_token_ids", "return_tokens_as_token_ids"}
CHAT = COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools"}
COMPLETIONS = COMMON | {"prompt", "echo"}
DEFAULT_MAX_TOKENS = 16  # the OpenAI completions API's default
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class Limits:
    """What one request to ``wai policy`` may ask for; each refused before any work (a 400 or 413 naming the
    field, the limit and its flag). The CLI's defaults are these."""

    max_body_mb: float = 16.0
    """--max-body-mb: the largest request body, refused while it is read."""
    max_n: int = 16
    """--max-n: most samples per prompt (``n``)."""
    max_tokens: int = 4096
    """--max-tokens: most tokens one sample may ask for (``max_tokens`` / ``max_completion_tokens``)."""
    max_batch: int = 64
    """--max-batch: most prompts in one completions request (a list of token-id lists)."""

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 2**20)


DEFAULT_LIMITS = Limits()


def strict_json(raw: bytes) -> Any:
    """The body as JSON, or a ``RequestError``: not JSON, or holding NaN / Infinity (which JSON does not have,
    and which would reach the sampler as a number)."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not a JSON number")

    try:
        return json.loads(raw or b"null", parse_constant=refuse)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise RequestError(f"the body is not valid JSON ({err}). Fix: send a JSON object with finite "
                           "numbers") from None


async def read_json(request: Any, limits: Limits) -> Any:
    """A request's body, read within ``--max-body-mb`` (413 past it, while reading) and parsed strictly."""
    from whileai.service.guard import BodyTooLarge, read_body

    try:
        return strict_json(await read_body(request, limits.max_body_bytes))
    except BodyTooLarge as err:
        raise RequestError(str(err), status=413) from None


def text_bytes(value: Any) -> int:
    """The UTF-8 bytes of every string inside ``value`` (a prompt, or chat messages), counted without
    tokenizing (and without recursion: a body may nest deeply): a tokenizer cannot make fewer tokens than
    bytes / (longest token's bytes)."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item.encode("utf-8", "surrogatepass"))
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def error_response(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> Any:
    """An error in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: the official client
    raises it with the message. Used by ``wai policy`` and ``wai record`` alike."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status)


def guarded(app: Any, token: str | None, server: str) -> None:
    """The token on every route but /healthz, and any unexpected failure a 500 in OpenAI's error shape
    (``wai policy`` and ``wai record``)."""
    from whileai.service.guard import RequireToken, TokenCheck

    app.add_middleware(RequireToken, check=TokenCheck(token), server=server,
                       refuse=lambda message: error_response(401, message, "authentication_error"))

    @app.exception_handler(Exception)
    async def failed(request: Any, err: Exception) -> Any:
        return error_response(500, f"wai {server} failed on this request ({type(err).__name__}: {str(err)[:200]}); "
                                   "the server is still up. Please report it with the request", "server_error")

    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(HTTPException)
    async def routing(request: Any, err: HTTPException) -> Any:  # no such route, or not with this method
        return error_response(err.status_code, f"{request.method} {request.url.path}: {err.detail}",
                              "not_found" if err.status_code == 404 else "invalid_request_error")

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Any, err: RequestValidationError) -> Any:
        return error_response(422, f"{request.method} {request.url.path}: {str(err.errors())[:300]}")


class RequestError(Exception):
    """A 400 (or 404 for an unknown model) with every problem found."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param

    def response(self) -> Any:
        return error_response(self.status, str(self), param=self.param)


@dataclass(frozen=True)
class Ask:
    """One checked request: how to sample and what to return."""

    chat: bool
    prompt: Any  # chat: the messages; completions: text or a list of token ids
    tools: Any
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    n: int
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: int | None  # None: not asked; chat: top_logprobs (0 = only the sampled token)
    return_token_ids: bool
    adapter: str | None = None  # a LoRA adapter loaded at runtime (model=<lora_name>); None: the base model
    stop_token_ids: tuple[int, ...] = ()  # vLLM's extra field: token ids that end a sample (kept in it)
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprobs name tokens 'token_id:<int>'


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(body: Mapping[str, Any], name: str, default: float, low: float, high: float,
            problems: list[str]) -> float:
    value = body.get(name, default)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        problems.append(f"'{name}' is {_shown(value)}; it must be a number in [{low:g}, {high:g}]")
        return default
    return float(value)


def _whole(body: Mapping[str, Any], name: str, default: int | None, low: int, high: int,
           problems: list[str], flag: str | None = None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        limit = f" (the server's limit, {flag})" if flag else ""
        problems.append(f"'{name}' is {_shown(value)}; it must be an integer in [{low}, {high}]{limit}")
        return default
    return int(value)


def _stop(body: Mapping[str, Any], problems: list[str]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        problems.append(f"'stop' is {stop!r}; it must be a non-empty string or a list of up to 4 of them")
        return ()
    return tuple(stops)


def _prompt(body: Mapping[str, Any], chat: bool, problems: list[str]) -> Any:
    if chat:
        messages = body.get("messages")
        ok = isinstance(messages, list) and messages and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages)
        if not ok:
            problems.append("'messages' must be a non-empty list of {'role': ..., 'content': ...} objects")
        return messages
    prompt = body.get("prompt")
    if isinstance(prompt, str) or _ids(prompt) or (isinstance(prompt, list) and prompt and all(map(_ids, prompt))):
        return prompt
    problems.append(f"'prompt' is {str(prompt)[:60]!r}; it must be one text, one list of token ids, or a list of "
                    "lists of token ids (a batch, answered in one sampling call)")
    return None


def _ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def is_batch(ask: Ask) -> bool:
    """A completions request whose prompt is a list of token-id prompts (vLLM's and SGLang's list form)."""
    return not ask.chat and isinstance(ask.prompt, list) and isinstance(ask.prompt[0], list)


def _stop_token_ids(body: Mapping[str, Any], problems: list[str]) -> tuple[int, ...]:
    ids = body.get("stop_token_ids")
    if ids is None:
        return ()
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        problems.append(f"'stop_token_ids' is {str(ids)[:60]!r}; it must be a list of token ids (integers >= 0)")
        return ()
    return tuple(ids)


def parse_ask(body: Any, chat: bool, served: str, adapters: Collection[str] = (), limits: Limits = DEFAULT_LIMITS) -> Ask:
    """A checked ``Ask`` from a request body, or a ``RequestError`` listing every problem. ``adapters``: the
    LoRA adapters loaded at runtime, which ``model`` may also name; ``limits``: the server's (--max-n,
    --max-tokens, --max-batch)."""
    if not isinstance(body, Mapping):
        raise RequestError("the body must be a JSON object (the OpenAI request fields)")
    known = CHAT if chat else COMPLETIONS
    problems = [f"unknown field {_shown(k)}: this server cannot apply it, and ignoring it would change what was "
                f"sampled; known fields: {sorted(known)}" for k in sorted(set(body) - known)]
    if body.get("model") not in (None, served, *adapters):
        also = f" and the LoRA adapters {sorted(adapters)}" if adapters else ""
        raise RequestError(f"model {body.get('model')!r} is not served here; this server serves {served!r}{also}. "
                           f"Fix: send model={served!r}", status=404, param="model")
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            problems.append(f"'{name}' is {body[name]!r}; only 0 is supported (penalties are not applied)")
    if body.get("echo") not in (None, False):
        problems.append("'echo' must be false: the prompt is returned as 'prompt_token_ids' (return_token_ids)")
    cap = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    logprobs = _logprobs(body, chat, problems)
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, Mapping) or set(stream_options) - {"include_usage"}:
        problems.append(f"'stream_options' is {stream_options!r}; only {{'include_usage': bool}} is supported")
        stream_options = {}
    for name in ("stream", "return_token_ids", "return_tokens_as_token_ids"):
        if body.get(name) not in (None, True, False):
            problems.append(f"'{name}' is {body[name]!r}; it must be true or false")
    ask = Ask(chat=chat, prompt=_prompt(body, chat, problems), tools=body.get("tools") if chat else None,
              max_tokens=_whole(body, cap, DEFAULT_MAX_TOKENS, 1, limits.max_tokens, problems,
                                "--max-tokens") or DEFAULT_MAX_TOKENS,
              temperature=_number(body, "temperature", 1.0, 0.0, 2.0, problems),
              top_p=_number(body, "top_p", 1.0, 1e-9, 1.0, problems),
              top_k=max(0, _whole(body, "top_k", 0, -1, 2**31, problems) or 0),
              n=_whole(body, "n", 1, 1, limits.max_n, problems, "--max-n") or 1,
              seed=_whole(body, "seed", None, 0, 2**63 - 1, problems),
              stop=_stop(body, problems), stream=bool(body.get("stream")),
              include_usage=bool(stream_options.get("include_usage")), logprobs=logprobs,
              return_token_ids=bool(body.get("return_token_ids")),
              adapter=body["model"] if body.get("model") in adapters else None,
              stop_token_ids=_stop_token_ids(body, problems),
              tokens_as_ids=bool(body.get("return_tokens_as_token_ids")))
    batch = isinstance(ask.prompt, list) and bool(ask.prompt) and isinstance(ask.prompt[0], list)
    if ask.stream and batch:
        problems.append("a batch of prompts cannot stream here; stream one prompt per request")
    if batch and len(ask.prompt) > limits.max_batch:
        problems.append(f"'prompt' holds {len(ask.prompt)} prompts; this server takes at most {limits.max_batch} "
                        "in one request (--max-batch): split the batch")
    if problems:
        more = f"; and {len(problems) - 10} more problems" if len(problems) > 10 else ""
        named = re.match(r"'(\w+)'", problems[0])  # OpenAI's error names one field: the first problem's
        raise RequestError("; ".join(problems[:10]) + more + ". Fix each field and send again",
                           param=named.group(1) if named else None)
    return ask


def _logprobs(body: Mapping[str, Any], chat: bool, problems: list[str]) -> int | None:
    if not chat:
        return _whole(body, "logprobs", None, 0, MAX_TOP_LOGPROBS, problems)
    if body.get("logprobs") not in (None, True, False):
        problems.append(f"'logprobs' is {body['logprobs']!r}; in chat completions it must be true or false")
    top = _whole(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS, problems)
    if top is not None and not body.get("logprobs"):
        problems.append("'top_logprobs' needs 'logprobs': true")
    return (top or 0) if body.get("logprobs") else None
