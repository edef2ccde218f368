"""Rollouts from an OpenAI-compatible inference server (vLLM, SGLang, ``wai policy``), and weights pushed to it.

    sampler = ServerSampler("http://127.0.0.1:8300", model="builtin:tiny")
    samples = sampler.sample([[1, 72, 105]], n=4, temperature=1.0, max_tokens=16)
    version = sampler.sync(engine, run_dir / "sync" / f"step{engine.step}", name=f"policy-step{engine.step}")

``sample`` sends the prompts as token ids to ``/v1/completions`` (one request per prompt; with
``batch_prompts``, all in one request as a list of id lists, which ``wai policy`` samples in one batched call)
and asks for what training needs, the way vLLM takes it: ``return_token_ids`` (vLLM >= 0.10.2, and
``wai policy``) for the completion's token ids, ``return_tokens_as_token_ids`` (the per-request form of vLLM's ``--return-tokens-as-token-ids``) as the
fallback that names each logprob token ``token_id:<int>``, and ``logprobs: 0`` for each sampled token's
log-probability. ``top_k`` and ``stop_token_ids`` travel as vLLM's extra fields (``-1`` is vLLM's "off").

Which weights sampled a row: ``wai policy`` says it in the ``x-whileai-weights-version`` header; else the
answer's ``system_fingerprint``; else (vLLM, SGLang's OpenAI routes) the ``model`` that answered, which
for a runtime adapter is its name: push each step's adapter under a new name there, and the name is the
version. ``push_lora`` / ``push_full`` return the version later samples will report.

The log-probabilities are the server's: they are behaviour log-probabilities only if the server reports
the distribution it sampled from (vLLM: ``--logprobs-mode processed_logprobs``; ``wai policy`` always).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from whileai.errors import WhileaiError
from whileai.service.auth import TOKEN_ENV

if TYPE_CHECKING:
    from whileai.engine.training import TrainingEngine

VERSION_HEADER = "x-whileai-weights-version"
MODE_HEADER = "x-whileai-logprobs-mode"
TOKEN_ID_PREFIX = "token_id:"


class SamplerError(WhileaiError):
    """The inference server is down, slow, refused a request, or answered without what training needs."""


@dataclass(frozen=True)
class Sample:
    """One completion from the server, with what a row needs to record about it."""

    prompt_index: int
    """Which of the prompts passed to ``sample`` this continues."""
    prompt_token_ids: list[int]
    tokens: list[int]
    """The completion's token ids (a stop token the sample ended on is kept, as the engine's sampler does)."""
    logprobs: list[float]
    """The server's log-probability of each token (the sampler's, under the mode below)."""
    finish_reason: str
    """``stop`` (an end token or stop id) or ``length`` (``max_tokens`` reached), as the server said."""
    sampling: dict[str, Any]
    """The settings it was sampled with: temperature, top_p, top_k, max_tokens, stop_token_ids, seed."""
    weights_version: str
    """The weights that sampled it, as the server reported them (see the module docstring)."""
    logprobs_mode: str | None
    """``processed_logprobs`` where the server says so (``wai policy``); None where it does not say."""


class ServerSampler:
    """A client of one server: ``sample`` completions, ``push_lora`` / ``push_full`` new weights."""

    def __init__(self, url: str, model: str, api_key: str | None = None, *, timeout: float = 120.0,
                 concurrency: int = 4, batch_prompts: bool = False) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.model = model
        """What completions ask for: the base model's name, or after ``push_lora`` the adapter's."""
        self.timeout = timeout
        self.concurrency = concurrency
        self.batch_prompts = batch_prompts
        """True: all prompts in one request (``prompt`` as a list of id lists), which ``wai policy`` samples in one
        batched call; False: one request per prompt, ``concurrency`` in flight (vLLM and SGLang batch concurrent
        requests themselves, and give every prompt of a list the request's one seed)"""
        api_key = api_key or os.environ.get(TOKEN_ENV)  # wai policy's token (docs/record.md, Auth)
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> ServerSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ sampling
    def sample(self, prompt_token_ids: Sequence[Sequence[int]], n: int = 1, temperature: float = 1.0,
               top_p: float = 1.0, top_k: int = 0, max_tokens: int = 16, stop_token_ids: Sequence[int] = (),
               seed: int | None = None, stop: Sequence[str] = ()) -> list[Sample]:
        """``n`` completions of each prompt: one request for all (``batch_prompts``; prompt ``i``'s sample ``j`` is
        the server's stream (seed, i, j)), or prompt by prompt (``concurrency`` requests in flight, prompt ``i``
        with seed ``seed + PROMPT_SEED_STRIDE * i``, so no two prompts share a random stream)."""
        sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "max_tokens": max_tokens,
                    "stop_token_ids": list(stop_token_ids), "seed": seed, "stop": list(stop)}
        prompts = [list(map(int, p)) for p in prompt_token_ids]
        if self.batch_prompts and len(prompts) > 1:
            return self._complete_all(prompts, n, sampling)
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(prompts)))) as pool:
            answers = list(pool.map(lambda ip: self._complete(ip[0], ip[1], n, _seeded(sampling, ip[0])),
                                    enumerate(prompts)))
        return [sample for answer in answers for sample in answer]

    def _complete_all(self, prompts: list[list[int]], n: int, sampling: dict[str, Any]) -> list[Sample]:
        """One request for every prompt; the choices come prompt by prompt (index i * n + j, vLLM's order)."""
        reply, answer, version = self._ask(prompts, n, sampling)
        choices = sorted(answer.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != n * len(prompts):
            raise SamplerError(f"{self.url} returned {len(choices)} choices for {len(prompts)} prompts x n={n}")
        mode = reply.headers.get(MODE_HEADER)
        return [Sample(k // n, prompts[k // n], *_tokens_and_logprobs(self.url, choice, prompts[k // n]),
                       str(choice.get("finish_reason")), dict(sampling), version, mode)
                for k, choice in enumerate(choices)]

    def _complete(self, index: int, prompt: list[int], n: int, sampling: dict[str, Any]) -> list[Sample]:
        reply, answer, version = self._ask(prompt, n, sampling)
        choices = sorted(answer.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != n:
            raise SamplerError(f"{self.url} returned {len(choices)} choices for n={n}")
        mode = reply.headers.get(MODE_HEADER)
        return [Sample(index, prompt, *_tokens_and_logprobs(self.url, choice, prompt),
                       str(choice.get("finish_reason")), dict(sampling), version, mode) for choice in choices]

    def _ask(self, prompt: list[int] | list[list[int]], n: int,
             sampling: dict[str, Any]) -> tuple[httpx.Response, dict[str, Any], str]:
        """POST one completions request; the reply, its body, and the weights version it reports."""
        body = {"model": self.model, "prompt": prompt, "n": n, "temperature": sampling["temperature"],
                "top_p": sampling["top_p"], "top_k": sampling["top_k"] or -1, "max_tokens": sampling["max_tokens"],
                "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True}
        if sampling["stop_token_ids"]:
            body["stop_token_ids"] = sampling["stop_token_ids"]
        if sampling["stop"]:  # matched on the text by the server (vLLM, wai policy); the ids keep the stop's tokens
            body["stop"] = sampling["stop"]
        if sampling["seed"] is not None:
            body["seed"] = sampling["seed"]
        reply = self._post("/v1/completions", body)
        answer = reply.json()
        version = reply.headers.get(VERSION_HEADER) or answer.get("system_fingerprint") or answer.get("model")
        if not version:
            raise SamplerError(f"{self.url} said nothing about which weights answered (no {VERSION_HEADER} header, "
                               "system_fingerprint or model in the reply), so a row's weights version is unknown")
        return reply, answer, str(version)

    # ------------------------------------------------------------------ weight sync
    def push_lora(self, adapter_dir: str | Path, name: str) -> str:
        """Load a PEFT adapter folder as ``name`` (replacing one of that name), sample from it from now on,
        and return its weights version. The folder must be readable by the server's machine."""
        path = str(Path(adapter_dir).resolve())
        try:
            reply = self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, "load_inplace": True})
        except SamplerError as err:
            if "already been loaded" not in str(err):  # a vLLM without load_inplace: unload, then load
                raise
            self._post("/v1/unload_lora_adapter", {"lora_name": name})
            reply = self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        self.model = name
        return reply.headers.get(VERSION_HEADER) or name

    def unload_lora(self, name: str) -> None:
        """Unload the runtime adapter ``name`` (an older push, once a newer one is loaded)."""
        self._post("/v1/unload_lora_adapter", {"lora_name": name})

    def served(self) -> tuple[str, str]:
        """The first model ``/v1/models`` lists (the base the server was started with) and who serves it: its
        ``owned_by`` (vLLM: ``vllm``, SGLang: ``sglang``, ``wai policy``: ``whileai``; ``unknown`` if unsaid)."""
        try:
            reply = self.client.get("/v1/models")
        except httpx.TransportError as err:
            raise SamplerError(f"no inference server answers at {self.url} ({err}). Fix: start it (`wai policy "
                               "MODEL --port PORT`, `vllm serve ...`) or point the sampler URL at it") from None
        try:
            first = reply.json()["data"][0]
            return str(first["id"]), str(first.get("owned_by", "unknown"))
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise SamplerError(f"{self.url}/v1/models did not list a model ({reply.status_code}: "
                               f"{reply.text[:200]})") from None

    def server_kind(self) -> str:
        """Who serves (``served``'s second part)."""
        return self.served()[1]

    def push_full(self, folder: str | Path, weight_version: str | None = None) -> str:
        """Reload every weight from a model folder (SGLang's ``/update_weights_from_disk``, and ``wai policy``'s);
        returns the new version (``weight_version``, by default the digest of the folder's weight files)."""
        path = str(Path(folder).resolve())
        version = weight_version or folder_version(path)
        reply = self._post("/update_weights_from_disk", {"model_path": path, "weight_version": version})
        answer = reply.json()
        if not answer.get("success", False):
            raise SamplerError(f"{self.url} did not reload {path}: {answer.get('message')}")
        return reply.headers.get(VERSION_HEADER) or version

    def sync(self, engine: TrainingEngine, folder: str | Path, name: str = "policy") -> str:
        """Write the engine's weights to ``folder`` (:func:`write_weights`) and push them: its LoRA adapter as
        ``name``, or (full fine-tuning) every weight. Returns the version later samples will report."""
        written = write_weights(engine, folder)
        if engine.loaded.lora is not None:
            return self.push_lora(written, name)
        return self.push_full(written)

    # ------------------------------------------------------------------ transport
    def _post(self, route: str, body: dict[str, Any]) -> httpx.Response:
        try:
            reply = self.client.post(route, json=body)
        except httpx.ConnectError as err:
            raise SamplerError(f"no inference server answers at {self.url} ({err}). Fix: start it (`wai policy "
                               "MODEL --port PORT`, `vllm serve ...`) or point the sampler URL at it") from None
        except httpx.TimeoutException:
            raise SamplerError(f"{self.url}{route} did not answer within {self.timeout:g} s. Fix: check the server "
                               "is not stuck or overloaded, or raise the timeout") from None
        except httpx.TransportError as err:
            raise SamplerError(f"the connection to {self.url}{route} broke ({err!r}): the server may have "
                               "crashed or restarted") from None
        if reply.status_code == 404 and route != "/v1/completions":
            raise SamplerError(f"{self.url} has no {route} route (404: {_message(reply)}). {_NO_ROUTE[route]}")
        if reply.status_code >= 400:
            raise SamplerError(f"{self.url}{route} refused the request ({reply.status_code}): {_message(reply)}")
        return reply


PROMPT_SEED_STRIDE = 104_729


def _seeded(sampling: dict[str, Any], index: int) -> dict[str, Any]:
    if sampling["seed"] is None:
        return sampling
    return {**sampling, "seed": int(sampling["seed"]) + PROMPT_SEED_STRIDE * index}


_NO_ROUTE = {
    "/v1/load_lora_adapter": "vLLM has it when started with --enable-lora and the environment variable "
                             "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; `wai policy` always has it",
    "/v1/unload_lora_adapter": "vLLM has it when started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
    "/update_weights_from_disk": "SGLang and `wai policy` reload full weights there; vLLM's OpenAI server has no "
                                 "route that reloads full weights, so with vLLM train a LoRA adapter instead",
}


def _message(reply: httpx.Response) -> str:
    """The error text of an OpenAI-shaped ({"error": {"message"}}), vLLM-shaped ({"message"}) or plain reply."""
    try:
        body = reply.json()
    except json.JSONDecodeError:
        return reply.text[:500]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if body.get("message") or error:
            return str(body.get("message") or error)
    return reply.text[:500]


def _tokens_and_logprobs(url: str, choice: dict[str, Any], prompt: list[int]) -> tuple[list[int], list[float]]:
    """A choice's token ids and log-probabilities, from ``token_ids`` or from ``token_id:<int>`` logprob tokens."""
    logprobs = choice.get("logprobs") or {}
    values = logprobs.get("token_logprobs")
    tokens = choice.get("token_ids")
    if tokens is None:
        pieces = logprobs.get("tokens") or []
        if not pieces or not all(isinstance(p, str) and p.startswith(TOKEN_ID_PREFIX) for p in pieces):
            raise SamplerError(f"{url} returned no token ids for the completion. Fix: vLLM >= 0.10.2 returns them "
                               "for return_token_ids; older vLLM needs the server flag --return-tokens-as-token-ids")
        tokens = [int(p.removeprefix(TOKEN_ID_PREFIX)) for p in pieces]
    if values is None or len(values) != len(tokens):
        raise SamplerError(f"{url} returned {0 if values is None else len(values)} log-probabilities for "
                           f"{len(tokens)} tokens; it must return one per token for logprobs=0")
    served_prompt = choice.get("prompt_token_ids")
    if served_prompt is not None and list(served_prompt) != prompt:
        raise SamplerError(f"{url} sampled from other prompt ids than were sent ({list(served_prompt)[:8]}... for "
                           f"{prompt[:8]}...): it re-tokenized or added tokens")
    return [int(t) for t in tokens], [float(v) for v in values]


# ----------------------------------------------------------------------------- weights to push
def folder_version(path: str) -> str:
    """The digest ``wai policy`` reports for a weights folder (read now: a rewritten folder has a new one)."""
    from whileai.record.policy import weights_version

    return weights_version(path, 0)


@lru_cache(maxsize=8)
def _base_digest(path: str) -> str:
    """A base model folder's digest, read once per process (a base does not change while it is trained on)."""
    return folder_version(path)


def base_version(engine: TrainingEngine) -> str | None:
    """The version a server reports for the base this engine trains on: a built-in's name and seed, a local
    folder's digest; None for a hub id (no local files to digest)."""
    from whileai.record.policy import weights_version

    name = str(engine.loaded.name)
    if name.startswith("builtin:"):
        return weights_version(name, int(engine.loaded.load_args["seed"]))
    return _base_digest(str(Path(name).resolve())) if Path(name).is_dir() else None


def write_weights(engine: TrainingEngine, folder: str | Path) -> str:
    """Write what a server loads: the LoRA adapter in PEFT format (with ``whileai_base.json`` naming its base, which
    ``wai policy`` checks), or under full fine-tuning the whole model folder. Reuses ``TrainingEngine.export``
    (atomic; replaces ``folder``). Returns the folder."""
    from whileai.record.weights import BASE_FILE

    if engine.loaded.lora is None:
        return engine.export(str(folder), merged=True, overwrite=True)
    written = engine.export(str(folder), overwrite=True)
    if (base := base_version(engine)) is not None:
        (Path(written) / BASE_FILE).write_text(json.dumps({"base_version": base}) + "\n")
    return written
