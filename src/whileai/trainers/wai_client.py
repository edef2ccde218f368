"""The Python client of ``wai serve``: sessions, runs, and a ``RunClient`` shaped like ``TrainingEngine``.

    client = Client("http://127.0.0.1:8321", token)
    run = client.create_session().create_run("builtin:tiny", lora_rank=8)
    run.forward_backward([make_datum([1, 72], [105, 2])], "cross_entropy")
    run.optim_step({"learning_rate": 1e-3})

A ``RunClient`` has the engine's operation names, arguments and return shapes, so code written for the
engine (``whileai.loop.step.policy_step``) runs against it unchanged; ``whileai.trainers.wai.WaiTrainer`` is the
``Trainer`` made of one. It numbers its operations 0, 1, 2,
...; a retry (connection lost, 429/502/503/504) resends the same number and the same bytes, and the
server answers a repeated number from its record without running it again. Long operations come back
as a request id that the client polls; callers never see it. Importing this module does not import torch.
"""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from whileai.errors import BatchError, ConfigError, WhileaiError
from whileai.trainers.base import Adam, CustomLoss, Datum, LogprobsFor, Scoring, Tokenizer, load_tokenizer

RETRY_STATUSES = (429, 502, 503, 504)
# rejected before taking a turn: the sequence number was not used and the next operation reuses it
NOT_SEQUENCED = (401, 404, 413, 422)
POLL_WAIT_S = 20.0
RESENDS = 4  # times an operation is sent again when the server no longer knows its request id


class ServiceError(WhileaiError):
    """An error answer from the service: ``status`` (HTTP), ``type`` (the server's error class), message."""

    def __init__(self, status: int, message: str, type_: str = "ServiceError") -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.type = type_
        self.message = message


class ServiceBatchError(ServiceError, BatchError):
    """A datum or row the server's engine refused (also a ``BatchError``, so engine code catches it)."""


class ServiceConfigError(ServiceError, ConfigError):
    """A setting the server refused: a loss name, config key, parameter (also a ``ConfigError``)."""


def _error(response: httpx.Response) -> ServiceError:
    try:
        body = response.json()
    except ValueError:
        body = {"message": response.text}
    error = body.get("error", body) if isinstance(body, dict) else {"message": str(body)}
    if not isinstance(error, dict):  # {"error": "text"}: another server's (or the Tinker front's) shape
        error = {"message": str(error)}
    message, kind = str(error.get("message", error)), str(error.get("type", "ServiceError"))
    cls = {"BatchError": ServiceBatchError, "ConfigError": ServiceConfigError}.get(kind, ServiceError)
    return cls(response.status_code, message, kind)


def require_advertised_loss(capabilities: Mapping[str, Any], name: str,
                            config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The capabilities entry of loss ``name``; raises ``ConfigError`` before any work is sent when the
    server does not advertise it, or does not take one of the ``config`` keys."""
    losses = capabilities.get("losses") or {}
    if name not in losses:
        raise ConfigError(f"loss {name!r} is not advertised by this server (provider "
                          f"{capabilities.get('provider', '?')!r}); it accepts: {', '.join(losses) or 'none'}")
    unknown = sorted(set(config or {}) - set(losses[name].get("config", {})))
    if unknown:
        valid = ", ".join(losses[name].get("config", {})) or "none"
        raise ConfigError(f"loss {name!r} takes no config key {unknown}; valid keys: {valid}")
    return dict(losses[name])


def _to_json(value: Any) -> Any:
    """``json.dumps``'s fallback: dataclasses (AdamParams, SamplingParams), numpy arrays and scalars, tensors."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return dict(value)
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    raise TypeError(f"cannot send a value of type {type(value).__name__} as JSON: use lists, numbers, "
                    "strings and dicts")


def dumps(body: Any) -> bytes:
    return json.dumps(body, default=_to_json).encode()


# ----------------------------------------------------------------------------- results
@dataclass
class ForwardResult:
    """As the engine's ``ForwardBackwardOutput``: per-datum outputs (lists) and metrics."""

    loss_fn_outputs: list[dict[str, Any]]
    metrics: dict[str, float]
    version: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"loss_fn_outputs": self.loss_fn_outputs, "metrics": self.metrics}


@dataclass
class OptimResult:
    """As the engine's ``OptimStepOutput``: the gradient norm before clipping and the step's metrics."""

    grad_norm: float
    metrics: dict[str, float]
    version: int = 0

    def __float__(self) -> float:
        return self.grad_norm


@dataclass(frozen=True)
class SampledSequence:
    """As the engine's ``SampledSequence``: generated tokens, the sampler's logprob of each, why it ended."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str


# ----------------------------------------------------------------------------- transport
class _Http:
    """One httpx client with the bearer token, retries with backoff, and error answers as exceptions."""

    def __init__(self, url: str, token: str, timeout: float, retries: int, backoff: float,
                 give_up_after: float = 30.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"service url {url!r} has no scheme: write it as http://HOST:PORT (e.g. "
                              "http://127.0.0.1:8321, what `wai serve` prints at start)")
        self.url = url.rstrip("/")
        self.connected = False  # until the server has answered once, a refused connection is not retried long
        self.retries = retries
        self.backoff = backoff
        self.give_up_after = give_up_after
        self.gave_up = False  # the last request found no server: the next tries once (a cleanup after a failure)
        self.http = httpx.Client(base_url=self.url, timeout=timeout,
                                 headers={"Authorization": f"Bearer {token}"})

    def send(self, method: str, path: str, content: bytes | None = None,
             params: Mapping[str, Any] | None = None) -> httpx.Response:
        """The response, after retrying lost connections and 429/502/503/504 (the same bytes each time)."""
        headers = {"Content-Type": "application/json"} if content is not None else None
        began = time.monotonic()
        for attempt in range(self.retries + 1):
            delay = min(self.backoff * 2 ** attempt, 10.0)
            last = attempt == self.retries or self.gave_up or time.monotonic() - began + delay > self.give_up_after
            try:
                response = self.http.request(method, path, content=content, params=params, headers=headers)
            except httpx.TransportError as err:
                never_answered = not self.connected and isinstance(err, httpx.ConnectError) and attempt >= 1
                if last or never_answered or isinstance(err, httpx.UnsupportedProtocol):
                    self.gave_up = True
                    raise ServiceError(0, f"{method} {path} failed: the server at {self.url} did not answer "
                                          f"({type(err).__name__}: {err}) after {attempt + 1} attempts over "
                                          f"{time.monotonic() - began:.0f} s (check that `wai serve` runs at that "
                                          "address)", "ConnectionError") from err
            else:
                self.connected, self.gave_up = True, False
                if response.status_code not in RETRY_STATUSES or last:
                    return response
            time.sleep(delay)
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, body: Any = None) -> Any:
        content = None if body is None else dumps(body)
        response = self.send(method, path, content)
        if response.status_code >= 400:
            raise _error(response)
        return response.json()


# ----------------------------------------------------------------------------- client, sessions
class Client:
    """A connection to ``wai serve`` at ``url`` with a bearer ``token``.

    ``timeout``: seconds for one HTTP request (long operations are polled, so this need not cover them);
    ``retries``: attempts after the first for lost connections and 429/502/503/504, with exponential
    backoff starting at ``backoff`` seconds, within ``give_up_after`` seconds of the first attempt: then the
    error names the request that failed (``ServiceError`` with status 0 when nothing answered).
    """

    def __init__(self, url: str, token: str, *, timeout: float = 60.0, retries: int = 8,
                 backoff: float = 0.25, give_up_after: float = 30.0) -> None:
        self._http = _Http(url, token, timeout, retries, backoff, give_up_after)

    @property
    def url(self) -> str:
        return self._http.url

    def capabilities(self) -> dict[str, Any]:
        """Models, operations, limits, and every loss with its inputs, config keys and defaults."""
        return dict(self._http.json("GET", "/v1/training/capabilities"))

    def create_session(self) -> Session:
        return Session(self, self._http.json("POST", "/v1/training/sessions", {})["session_id"])

    def sessions(self) -> list[Session]:
        """This token's open sessions (after a restart too)."""
        return [Session(self, s["session_id"]) for s in self._http.json("GET", "/v1/training/sessions")]

    def session(self, session_id: str) -> Session:
        return Session(self, session_id)

    def run(self, run_id: str) -> RunClient:
        """Reattach to a run; its next sequence number is read from the server."""
        return RunClient(self, self._http.json("GET", f"/v1/training/runs/{run_id}"))

    def close(self) -> None:
        self._http.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Session:
    """A group of runs owned by one token; ``close()`` frees them."""

    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.id = session_id

    def create_run(self, base_model: str = "builtin:tiny", *, lora_rank: int = 0, seed: int = 0,
                   kind: str = "policy", **options: Any) -> RunClient:
        """A new run with the model loaded (warm). ``kind="critic"`` adds a value head; ``options``:
        ``critic_learning_rate``, ``reward_range``, ``reference`` (see ``schemas.CreateRun``)."""
        body = {"base_model": base_model, "lora_rank": lora_rank, "seed": seed, "kind": kind, **options}
        info = self.client._http.json("POST", f"/v1/training/sessions/{self.id}/runs", body)
        return RunClient(self.client, info)

    def runs(self) -> list[RunClient]:
        """Every run of this session, each ready to continue from the server's next sequence number."""
        return [RunClient(self.client, info)
                for info in self.client._http.json("GET", f"/v1/training/sessions/{self.id}/runs")]

    def close(self) -> None:
        self.client._http.json("DELETE", f"/v1/training/sessions/{self.id}")


# ----------------------------------------------------------------------------- a run
class RunClient:
    """One run on the server, with ``TrainingEngine``'s operations. ``.step`` is the weights version after
    the last answer (optimizer steps taken), ``.last_version`` the version the last operation used."""

    def __init__(self, client: Client, info: Mapping[str, Any]) -> None:
        self.client = client
        self.id: str = info["run_id"]
        self.base_model: str = info["base_model"]
        self.kind: str = info.get("kind", "policy")
        self.next_seq: int = int(info["next_seq"])
        self.step: int = int(info.get("step") or 0)
        self.last_version: int | None = None
        self._info = dict(info)
        self._lock = threading.Lock()
        self._tokenizer: Tokenizer | None = None

    def __repr__(self) -> str:
        return f"RunClient({self.id!r}, base_model={self.base_model!r}, step={self.step}, next_seq={self.next_seq})"

    @property
    def version(self) -> int:
        """The current weights version: the number of optimizer steps taken (as ``engine.step``)."""
        return self.step

    @property
    def tokenizer(self) -> Tokenizer:
        """The run's tokenizer, loaded here from the same built-in or local path as the server's model."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.base_model)
        return self._tokenizer

    def info(self) -> dict[str, Any]:
        """The server's record of the run: settings, step, next sequence number, saved states."""
        self._info = self.client._http.json("GET", f"/v1/training/runs/{self.id}")
        return dict(self._info)

    def history(self) -> list[dict[str, Any]]:
        """Every operation the run executed: ``seq_id``, ``op``, ``status``, ``version``, in order."""
        return list(self.client._http.json("GET", f"/v1/training/runs/{self.id}/operations"))

    # ------------------------------------------------------------------ the ordered call
    def call(self, op: str, body: Mapping[str, Any] | None = None, *, seq_id: int | None = None) -> Any:
        """Run operation ``op`` with the next sequence number (or ``seq_id``) and return its result."""
        with self._lock:
            seq = self.next_seq if seq_id is None else seq_id
            self.next_seq = max(self.next_seq, seq + 1)
        content = dumps({"seq_id": seq, **dict(body or {})})
        try:
            answer = self._answer(op, content)
        except ServiceError as err:
            if err.status in NOT_SEQUENCED and seq_id is None:
                with self._lock:  # refused before its turn: the number is still free
                    if self.next_seq == seq + 1:
                        self.next_seq = seq
            raise
        self.step = int(answer["step"])
        self.last_version = answer["version"]
        return answer["result"]

    def _answer(self, op: str, content: bytes) -> dict[str, Any]:
        http = self.client._http
        path = f"/v1/training/runs/{self.id}/{op}"
        for _ in range(RESENDS):
            response = http.send("POST", path, content)
            while response.status_code == 202:  # still running: poll (the server long-polls for us)
                request_id = response.json()["request_id"]
                response = http.send("GET", f"/v1/training/requests/{request_id}", params={"wait": POLL_WAIT_S})
            if response.status_code != 404 or response.json().get("error", {}).get("type") != "UnknownRequest":
                break  # else the server restarted and forgot the request: send it again, same number
        if response.status_code >= 400:
            raise _error(response)
        return dict(response.json())

    # ------------------------------------------------------------------ the engine's operations
    def forward_backward(self, data: Sequence[Datum], loss_fn: str, loss_fn_config: Mapping[str, Any] | None = None,
                         *, sampling_params: Scoring = None, logprobs_for: LogprobsFor = "every") -> ForwardResult:
        result = self.call("forward_backward", {"data": data, "loss_function": loss_fn,
                                                "loss_config": loss_fn_config, "sampling_params": sampling_params,
                                                "logprobs_for": logprobs_for})
        return ForwardResult(result["loss_fn_outputs"], result["metrics"], self.last_version or 0)

    def forward(self, data: Sequence[Datum], loss_fn: str = "cross_entropy",
                loss_fn_config: Mapping[str, Any] | None = None, *, sampling_params: Scoring = None,
                reference: bool = False, logprobs_for: LogprobsFor = "every") -> ForwardResult:
        result = self.call("forward", {"data": data, "loss_function": loss_fn, "loss_config": loss_fn_config,
                                       "sampling_params": sampling_params, "reference": reference,
                                       "logprobs_for": logprobs_for})
        return ForwardResult(result["loss_fn_outputs"], result["metrics"], self.last_version or 0)

    def forward_backward_custom(self, data: Sequence[Datum], loss_fn: CustomLoss, *,
                                sampling_params: Scoring = None, logprobs_for: LogprobsFor = "every") -> ForwardResult:
        """As Tinker's SDK does it: ``forward`` for the log-probabilities, your ``loss_fn(data, logprobs)`` on
        torch tensors here, then ``cross_entropy`` with weights = -dloss/dlogprob (the same gradient)."""
        from whileai.trainers.custom import custom_weights

        scored = self.forward(data, "cross_entropy", sampling_params=sampling_params)
        weighted, loss, metrics = custom_weights(data, scored.loss_fn_outputs, loss_fn)
        out = self.forward_backward(weighted, "cross_entropy", sampling_params=sampling_params,
                                    logprobs_for=logprobs_for)
        return ForwardResult(out.loss_fn_outputs, {**metrics, "loss:sum": loss}, out.version)

    def optim_step(self, adam_params: Adam = None) -> OptimResult:
        result = self.call("optim_step", {"adam_params": adam_params})
        return OptimResult(float(result["grad_norm"]), result["metrics"], self.last_version or 0)

    def add_critic(self, learning_rate: float, *, reward_range: Sequence[float] | None = None) -> None:
        """Attach a value head to this run, as ``TrainingEngine.add_critic`` does (critic methods need one)."""
        self.call("add_critic", {"learning_rate": learning_rate,
                                 "reward_range": None if reward_range is None else list(reward_range)})

    def save_weights_for_sampler(self) -> int:
        return int(self.call("save_weights_for_sampler")["version"])

    def sample(self, prompt_tokens: Sequence[Any], num_samples: int, sampling_params: Scoring, *,
               version: int | None = None) -> list[Any]:
        """One prompt -> a list of sequences; a list of prompts -> one such list per prompt."""
        result = self.call("sample", {"prompt_tokens": prompt_tokens, "num_samples": num_samples,
                                      "sampling_params": sampling_params, "version": version})
        groups = [[SampledSequence(s["tokens"], s["logprobs"], s["stop_reason"]) for s in group]
                  for group in result["sequences"]]
        return groups[0] if result["single"] else groups

    def compute_logprobs(self, tokens: Sequence[int], top_k: int = 0, *, reference: bool = False,
                         sampling_params: Scoring = None) -> dict[str, Any]:
        result = dict(self.call("logprobs", {"tokens": tokens, "top_k": top_k, "reference": reference,
                                             "sampling_params": sampling_params}))
        if result.get("topk"):
            result["topk"] = [None if pos is None else [tuple(pair) for pair in pos] for pos in result["topk"]]
        return result

    def save_state(self, name: str) -> str:
        """Save weights, optimizer, step and RNG on the server under ``name``; returns the server's path.
        It is recorded as saved only once written and synced, and survives a server crash."""
        return str(self.call("save_state", {"name": name})["path"])

    def load_state(self, name: str, *, optimizer: bool = True) -> None:
        """Restore the state this run saved under ``name`` (after a restart, the first thing to call);
        ``optimizer=False``: the weights only, Adam starts again from zero moments."""
        self.call("load_state", {"name": name} if optimizer else {"name": name, "optimizer": False})

    def export_lora(self, path: str | Path, *, merged: bool = False) -> str:
        """Export the adapter (or, ``merged=True``, the merged model) on the server, download the archive
        and unpack it into the new folder ``path``; returns ``path``."""
        target = Path(path)
        if target.exists():
            raise ConfigError(f"export_lora: {str(target)!r} already exists; name a new folder")
        archive = self.call("export_lora", {"merged": merged})["archive"]
        response = self.client._http.send("GET", f"/v1/training/runs/{self.id}/exports/{archive}")
        if response.status_code >= 400:
            raise _error(response)
        with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as tar:
            _unpack(tar, target)
        return str(target)

    def finish(self) -> None:
        """End the run and free its model on the server; its saved states stay."""
        self.call("finish")


def _unpack(tar: tarfile.TarFile, target: Path) -> None:
    """Unpack an export archive into ``target``, refusing members that would land outside it or are not plain
    files and folders (Python's ``filter="data"``, which 3.10.0-3.10.11 and 3.11.0-3.11.3 lack)."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(target, filter="data")
        return
    root = target.resolve()
    for member in tar.getmembers():
        where = (root / member.name).resolve()
        if not (member.isfile() or member.isdir()) or (where != root and root not in where.parents):
            raise WhileaiError(f"export archive member {member.name!r} is not a plain file inside the folder; "
                               "refused (the server's archive is damaged or not ours)")
    tar.extractall(target)
