"""`wai policy`: an OpenAI-compatible server for the model being trained (`/v1/completions`,
`/v1/chat/completions`, streaming and not), so serve -> record -> train runs on one machine.

It answers in the shapes vLLM's server uses (/work/shared/reference/serving-logs.md), with what training
needs when asked: ``return_token_ids: true`` adds the prompt's and the completion's token ids, ``logprobs``
gives each sampled token's log-probability under the distribution it was drawn from (after temperature,
top-k and top-p: vLLM's ``processed_logprobs``; ``top_k`` is taken as vLLM's extra field). Every answer
carries headers naming the model, the weights version and the logprobs mode::

    x-whileai-model             what answered: the served model (a built-in name, or the weights folder) or the
                                LoRA adapter the request named (``model=<lora_name>``)
    x-whileai-weights-version   a digest of the weights files (a built-in: its name and seed; an adapter:
                                ``<lora_name>@<digest>``); it changes when new weights are loaded
    x-whileai-logprobs-mode     processed_logprobs
    x-whileai-sampling          the temperature, top_p and top_k this answer was sampled with (JSON)

A stream is the finished sample sent token by token (generation runs whole, then streams): the shapes and
the order are the API's, the latency is not a real server's. Chat replies are text (no tool-call parsing):
a model that writes tool calls returns them in the content.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whileai.engine.stops import cut_at_stop, eos_ids, reply_ids
from whileai.errors import ConfigError, WhileaiError
from whileai.prompts import text_ids
from whileai.record import chat, token_text
from whileai.record.requests import DEFAULT_LIMITS, Ask, Limits, RequestError, is_batch, text_bytes

LOGPROBS_MODE = "processed_logprobs"
_UNSTABLE = ("\ufffd",)  # a decoded tail that may change when the next token arrives


@dataclass
class Served:
    """The loaded model and what the server reports about it."""

    engine: Any
    name: str
    version: str
    adapters: dict[str, str] = field(default_factory=dict)
    """LoRA adapters loaded at runtime (``record.weights``): name -> weights version."""
    peft: Any = None
    """The PEFT wrapper around ``engine.model`` holding those adapters (None while none is loaded)."""


@contextlib.contextmanager
def use_adapter(served: Served, name: str | None) -> Iterator[None]:
    """Run a block on the named runtime adapter, or (None) on the base model with every adapter off."""
    if name is not None and name not in served.adapters:  # unloaded since the request was read
        raise RequestError(f"model {name!r} is not served here any more: the adapter was unloaded; loaded: "
                           f"{sorted(served.adapters)}", status=404, param="model")
    if served.peft is None:
        yield
    elif name is None:
        with served.peft.disable_adapter():
            yield
    else:
        served.peft.set_adapter(name)
        yield


def resolve_weights(spec: str) -> str:
    """A built-in name, a model folder, or a run folder (its ``final`` weights)."""
    if spec.startswith("builtin:"):
        return spec
    path = Path(spec)
    if (path / "final").is_dir():
        path = path / "final"
    if not path.is_dir():
        raise ConfigError(f"model {spec!r}: no such folder. Fix: give builtin:tiny / builtin:mini, a model folder "
                          "(config.json, tokenizer, weights), or a run folder from `wai train` (it serves RUN/final)")
    if (path / "adapter_config.json").exists() and not (path / "config.json").exists():
        raise ConfigError(f"{path} holds a LoRA adapter, not a whole model. Fix: serve merged weights (export with "
                          "merged=True, or train without --lora-rank, whose final folder is a whole model)")
    return str(path)


def weights_version(path: str, seed: int) -> str:
    """A short digest of the weights files (a built-in: its name and seed): changes when the weights do."""
    if path.startswith("builtin:"):
        return f"{path}@seed{seed}"
    digest = hashlib.sha256()
    for file in sorted(Path(path).glob("*")):
        if file.suffix in (".safetensors", ".bin", ".pt"):
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    return "sha256:" + digest.hexdigest()[:16]


def load(spec: str, seed: int = 0) -> Served:
    from whileai.engine import TrainingEngine

    path = resolve_weights(spec)
    engine = TrainingEngine(path, seed=seed) if path.startswith("builtin:") else TrainingEngine(path)
    return Served(engine, spec if spec.startswith("builtin:") else path, weights_version(path, seed))


# ----------------------------------------------------------------------------- sampling
class Policy:
    """Samples for requests, one at a time (the engine is not thread-safe). ``lock`` is re-entrant: hold it
    around a sample and its headers so a weight reload cannot fall between them."""

    def __init__(self, served: Served, limits: Limits = DEFAULT_LIMITS) -> None:
        self.served = served
        self.limits = limits
        self.lock = threading.RLock()
        self._token_bytes: int | None = None

    @property
    def tokenizer(self) -> Any:
        return self.served.engine.tokenizer

    def most_prompt_bytes(self) -> int:
        """A text longer than this cannot fit the context, whatever the tokenizer does with it: the context
        times the longest token's UTF-8 bytes (its vocabulary string, an upper bound), doubled for a
        normaliser that shortens text (NFC)."""
        if self._token_bytes is None:
            vocab = self.tokenizer.get_vocab()
            self._token_bytes = max((len(t.encode("utf-8", "surrogatepass")) for t in vocab), default=1)
        return 2 * self.served.engine.max_context * self._token_bytes

    def check_prompt(self, ask: Ask) -> None:
        """Refuse, before tokenizing, a text too long for the context, and token ids outside the vocabulary."""
        field = "messages" if ask.chat else "prompt"
        size, most = text_bytes(ask.prompt), self.most_prompt_bytes()
        if size > most:
            raise RequestError(f"'{field}' holds {size} bytes of text; no text over {most} bytes fits this model's "
                               f"context of {self.served.engine.max_context} tokens. Fix: shorten the prompt",
                               param=field)
        rows: list[tuple[str, Any]] = [("stop_token_ids", ask.stop_token_ids)]
        if not ask.chat and isinstance(ask.prompt, list):
            batch = isinstance(ask.prompt[0], list)
            rows += [(f"prompt[{i}]", r) for i, r in enumerate(ask.prompt)] if batch else [("prompt", ask.prompt)]
        vocab = self.served.engine.vocab_size
        for where, row in rows:
            bad = [t for t in row if not 0 <= t < vocab]
            if bad:
                raise RequestError(f"'{where}' holds token id {bad[0]}, outside this model's vocabulary [0, {vocab}). "
                                   "Fix: use ids from this model's tokenizer", param=where.split("[")[0])

    def prompt_ids(self, ask: Ask) -> list[int]:
        self.check_prompt(ask)
        if not ask.chat:
            if isinstance(ask.prompt, list):
                return list(ask.prompt)
            return text_ids(self.tokenizer, ask.prompt)  # as vLLM serving the exported folder would
        try:
            return chat.render(self.tokenizer, ask.prompt, ask.tools)
        except WhileaiError as err:
            raise RequestError(str(err), param="messages") from None
        except (KeyError, TypeError, ValueError) as err:  # a chat template's own complaint
            raise RequestError(f"the messages could not be rendered with the chat template: {err}",
                               param="messages") from None

    def sample(self, ask: Ask) -> tuple[list[int], list[Any], list[list[list[tuple[int, float]]] | None]]:
        """The prompt ids, ``n`` samples, and per sample the top alternatives at each token (when asked)."""
        (prompt, samples, tops), = self.sample_all(ask, [self.prompt_ids(ask)])
        return prompt, samples, tops

    def sample_all(self, ask: Ask, prompts: list[list[int]]) -> list[tuple[list[int], list[Any], list[Any]]]:
        """``sample`` for several token-id prompts in one engine call (a batch request): per prompt, its ids,
        samples and top alternatives. Prompt i's sample j draws the engine's random stream (seed, i, j)."""
        from whileai.engine.sampling import SamplingParams

        self.check_prompt(ask)
        stops = [*ask.stop, *([t] for t in ask.stop_token_ids)]  # strings match on the text (engine.stops)
        engine = self.served.engine
        for prompt in prompts:
            if len(prompt) >= engine.max_context:
                raise RequestError(f"the prompt has {len(prompt)} tokens; the model's context is "
                                   f"{engine.max_context}. Fix: shorten the prompt",
                                   param="messages" if ask.chat else "prompt")
        params = SamplingParams(max_tokens=ask.max_tokens, temperature=ask.temperature, top_p=ask.top_p,
                                top_k=ask.top_k, stop=stops, seed=ask.seed)
        with self.lock, use_adapter(self.served, ask.adapter):
            batches = engine.sample(prompts, ask.n, params)
            return [(prompt, samples, [self._top(prompt, s.tokens, ask) for s in samples])
                    for prompt, samples in zip(prompts, batches)]

    def _top(self, prompt: list[int], tokens: list[int], ask: Ask) -> list[list[tuple[int, float]]] | None:
        """The ``ask.logprobs`` most likely tokens at each completion position, under the sampled distribution."""
        if not ask.logprobs or not tokens:
            return None
        if ask.temperature == 0:  # greedy: the arg-max had probability 1
            return [[(t, 0.0)] for t in tokens]
        scored = self.served.engine.compute_logprobs(
            prompt + tokens, top_k=ask.logprobs,
            sampling_params={"temperature": ask.temperature, "top_p": ask.top_p, "top_k": ask.top_k})
        return [[(i, v) for i, v in pairs if v > float("-inf")] for pairs in scored["topk"][len(prompt):]]

    def end_ids(self, ask: Ask) -> tuple[int, ...]:
        """The ids a sample of ``ask`` ends on that are not reply text: every EOS id (engine.stops) and
        ``stop_token_ids`` (vLLM drops them from the text too; the token ids keep them)."""
        return eos_ids(self.tokenizer, self.served.engine.model) + tuple(ask.stop_token_ids)

    def answered_by(self, ask: Ask) -> tuple[str, str]:
        """The name and weights version of what answers ``ask``: its adapter, or the base model."""
        if ask.adapter is not None and ask.adapter in self.served.adapters:
            return ask.adapter, self.served.adapters[ask.adapter]
        return self.served.name, self.served.version

    def headers(self, ask: Ask) -> dict[str, str]:
        sampling = {"temperature": ask.temperature, "top_p": ask.top_p, "top_k": ask.top_k}
        name, version = self.answered_by(ask)
        return {"x-whileai-model": name, "x-whileai-weights-version": version,
                "x-whileai-logprobs-mode": LOGPROBS_MODE, "x-whileai-sampling": json.dumps(sampling)}


# ----------------------------------------------------------------------------- answers
def _finish(sample: Any) -> str:
    return "stop" if sample.stop_reason == "stop" else "length"


def _reply(policy: Policy, ask: Ask, sample: Any) -> tuple[str, list[str], list[int]]:
    """The reply's text as OpenAI and vLLM return it, the text each token adds to it (the stream's deltas) and
    where each token starts in it (``text_offset``): without the end or stop token the sample ended on, and cut
    before a stop string (engine.stops)."""
    tok = policy.tokenizer
    ids = reply_ids(sample.tokens, sample.stop_reason == "stop", policy.end_ids(ask))
    deltas = _deltas(tok, ids) + [""] * (len(sample.tokens) - len(ids))
    text, _ = cut_at_stop("".join(deltas), ask.stop)
    cut, left = [], len(text)
    for delta in deltas:
        cut.append(delta[:left])
        left -= len(cut[-1])
    return text, cut, token_text.offsets(tok, ids, len(sample.tokens), text, cut)


def _chat_logprob(tokenizer: Any, token: int, logprob: float, top: list[tuple[int, float]] | None,
                  as_ids: bool = False) -> dict[str, Any]:
    alternatives = [{"token": token_text.piece(tokenizer, i, as_ids), "logprob": v,
                     "bytes": token_text.piece_bytes(tokenizer, i, as_ids)} for i, v in (top or [])]
    return {"token": token_text.piece(tokenizer, token, as_ids), "logprob": logprob,
            "bytes": token_text.piece_bytes(tokenizer, token, as_ids), "top_logprobs": alternatives}


def _completion_logprobs(tokenizer: Any, tokens: list[int], logprobs: list[float],
                         top: list[list[tuple[int, float]]] | None, offsets: list[int],
                         as_ids: bool = False) -> dict[str, Any]:
    tops = ([token_text.keyed(tokenizer, alt, as_ids) for alt in top] if top is not None
            else [None] * len(tokens))
    return {"tokens": [token_text.piece(tokenizer, t, as_ids) for t in tokens], "token_logprobs": list(logprobs),
            "top_logprobs": tops, "text_offset": offsets}


def answer(policy: Policy, ask: Ask) -> dict[str, Any]:
    """The whole (non-streaming) response body; a batch's choices prompt by prompt (index i * n + j)."""
    answered = policy.sample_all(ask, ask.prompt) if is_batch(ask) else [policy.sample(ask)]
    choices: list[dict[str, Any]] = []
    for prompt, samples, tops in answered:
        choices += _choices(policy, ask, prompt, samples, tops, len(choices))
    body = _envelope(policy, ask)
    body["choices"] = choices
    usage = [_usage(prompt, samples) for prompt, samples, _ in answered]
    body["usage"] = {k: sum(u[k] for u in usage) for k in usage[0]}
    if ask.chat and ask.return_token_ids:
        body["prompt_token_ids"] = answered[0][0]
    return body


def _choices(policy: Policy, ask: Ask, prompt: list[int], samples: list[Any], tops: list[Any],
             first: int) -> list[dict[str, Any]]:
    choices, tok = [], policy.tokenizer
    for k, (sample, top) in enumerate(zip(samples, tops), start=first):
        text, _, offsets = _reply(policy, ask, sample)
        choice: dict[str, Any] = {"index": k, "finish_reason": _finish(sample), "logprobs": None}
        if ask.chat:
            choice["message"] = {"role": "assistant", "content": text}
            if ask.logprobs is not None:
                choice["logprobs"] = {"content": [_chat_logprob(tok, t, v, top[j] if top else None, ask.tokens_as_ids)
                                                  for j, (t, v) in enumerate(zip(sample.tokens, sample.logprobs))]}
        else:
            choice["text"] = text
            if ask.logprobs is not None:
                choice["logprobs"] = _completion_logprobs(tok, sample.tokens, sample.logprobs, top,
                                                          offsets, as_ids=ask.tokens_as_ids)
            if ask.return_token_ids:
                choice["prompt_token_ids"] = prompt
        if ask.return_token_ids:
            choice["token_ids"] = list(sample.tokens)
        choices.append(choice)
    return choices


def _envelope(policy: Policy, ask: Ask, chunk: bool = False) -> dict[str, Any]:
    kind = ("chat.completion" if ask.chat else "text_completion") + (".chunk" if chunk and ask.chat else "")
    name, version = policy.answered_by(ask)
    return {"id": ("chatcmpl-" if ask.chat else "cmpl-") + uuid.uuid4().hex[:24], "object": kind,
            "created": int(time.time()), "model": name, "system_fingerprint": version}


def _usage(prompt: list[int], samples: list[Any]) -> dict[str, int]:
    completion = sum(len(s.tokens) for s in samples)
    return {"prompt_tokens": len(prompt), "completion_tokens": completion, "total_tokens": len(prompt) + completion}


def stream(policy: Policy, ask: Ask) -> tuple[list[int], list[Any], Iterator[str]]:
    """Sample first (errors surface before the stream starts), then the SSE lines of the chunks."""
    prompt, samples, tops = policy.sample(ask)
    base = _envelope(policy, ask, chunk=True)

    def lines() -> Iterator[str]:
        first = True
        for k, (sample, top) in enumerate(zip(samples, tops)):
            for chunk in _choice_chunks(policy, ask, k, sample, top):
                if first and ask.return_token_ids:
                    (chunk if ask.chat else chunk["choices"][0])["prompt_token_ids"] = prompt
                first = False
                yield f"data: {json.dumps({**base, **chunk})}\n\n"
        if ask.include_usage:
            yield f"data: {json.dumps({**base, 'choices': [], 'usage': _usage(prompt, samples)})}\n\n"
        yield "data: [DONE]\n\n"

    return prompt, samples, lines()


def _deltas(tokenizer: Any, ids: list[int]) -> list[str]:
    """The text each token adds, holding back a tail that the next token may still change."""
    text, sent, out = chat.decode(tokenizer, ids), "", []
    for j in range(len(ids)):
        now = chat.decode(tokenizer, ids[:j + 1])
        while now and (now[-1] in _UNSTABLE or chat.ESCAPE <= ord(now[-1]) < chat.ESCAPE + 256) and j < len(ids) - 1:
            now = now[:-1]
        delta = now[len(sent):] if now.startswith(sent) else ""
        sent += delta
        out.append(delta)
    if out:
        out[-1] += text[len(sent):] if text.startswith(sent) else ""
    return out


def _choice_chunks(policy: Policy, ask: Ask, k: int, sample: Any, top: Any) -> Iterator[dict[str, Any]]:
    tokenizer = policy.tokenizer
    _, deltas, offsets = _reply(policy, ask, sample)
    if ask.chat:
        yield {"choices": [{"index": k, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}]}
    for j, (token, logprob) in enumerate(zip(sample.tokens, sample.logprobs)):
        last = j == len(sample.tokens) - 1
        choice: dict[str, Any] = {"index": k, "logprobs": None, "finish_reason": None}
        if ask.chat:
            choice["delta"] = {"content": deltas[j]}
            if ask.logprobs is not None:
                choice["logprobs"] = {"content": [_chat_logprob(tokenizer, token, logprob, top[j] if top else None,
                                                                ask.tokens_as_ids)]}
        else:
            choice["text"] = deltas[j]
            choice["finish_reason"] = _finish(sample) if last else None
            if ask.logprobs is not None:
                choice["logprobs"] = _completion_logprobs(tokenizer, [token], [logprob], [top[j]] if top else None,
                                                          offsets[j:j + 1], as_ids=ask.tokens_as_ids)
        if ask.return_token_ids:
            choice["token_ids"] = [token]
        yield {"choices": [choice]}
    if ask.chat:
        yield {"choices": [{"index": k, "delta": {}, "logprobs": None, "finish_reason": _finish(sample)}]}
