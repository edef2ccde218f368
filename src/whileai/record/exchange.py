"""What one OpenAI-compatible exchange holds for training, read from the upstream's reply (whole or streamed),
and the reply cut back to what the client asked for.

The recorder asks the upstream for ``return_token_ids`` and ``logprobs``; ``strip`` removes them again where
the client did not ask, so the client receives what the upstream would have sent it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TOKEN_ID = "token_id:"


def widen(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    """The request sent upstream: the client's, plus token ids and the sampled tokens' log-probabilities."""
    wide = dict(body, return_token_ids=True)
    if chat:
        wide["logprobs"] = True
    elif body.get("logprobs") is None:
        wide["logprobs"] = 1
    return wide


def strip(reply: dict[str, Any], body: Mapping[str, Any], chat: bool) -> dict[str, Any]:
    """``reply`` (a whole response or a stream chunk) without what only the recorder asked for."""
    if not body.get("return_token_ids"):
        reply.pop("prompt_token_ids", None)
    asked_logprobs = bool(body.get("logprobs")) if chat else body.get("logprobs") is not None
    for choice in reply.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        if not body.get("return_token_ids"):
            choice.pop("prompt_token_ids", None)
            choice.pop("token_ids", None)
        if not asked_logprobs and "logprobs" in choice:
            choice["logprobs"] = None
    return reply


@dataclass
class Sampled:
    """One choice as the recorder collects it."""

    prompt_ids: list[int] | None = None
    token_ids: list[int] = field(default_factory=list)
    token_texts: list[Any] = field(default_factory=list)  # logprobs' token strings ("token_id:N" where so served)
    logprobs: list[Any] = field(default_factory=list)
    has_ids: bool = False
    has_logprobs: bool = False
    content: str = ""
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None

    def add(self, choice: Mapping[str, Any], chat: bool, prompt_ids: Any) -> None:
        """Fold one choice (or stream chunk of it) in."""
        if isinstance(prompt_ids, list):
            self.prompt_ids = [int(i) for i in prompt_ids]
        if isinstance(choice.get("prompt_token_ids"), list):
            self.prompt_ids = [int(i) for i in choice["prompt_token_ids"]]
        if isinstance(choice.get("token_ids"), list):
            self.token_ids += [int(i) for i in choice["token_ids"]]
            self.has_ids = True
        block = choice.get("logprobs")
        if isinstance(block, Mapping) and isinstance(block.get("content"), list):
            self.has_logprobs = True
            self.logprobs += [e.get("logprob") for e in block["content"] if isinstance(e, Mapping)]
            self.token_texts += [e.get("token") for e in block["content"] if isinstance(e, Mapping)]
        elif isinstance(block, Mapping) and isinstance(block.get("token_logprobs"), list):
            self.has_logprobs = True
            self.logprobs += list(block["token_logprobs"])
            self.token_texts += list(block.get("tokens") or [])
        message = choice.get("message") or choice.get("delta") or {}
        if chat and isinstance(message, Mapping):
            self.content += message.get("content") or ""
            for k, call in enumerate(message.get("tool_calls") or []):
                self._merge_call(k, call)
        elif isinstance(choice.get("text"), str):
            self.content += choice["text"]
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]

    def _merge_call(self, k: int, call: Mapping[str, Any]) -> None:
        at = self.tool_calls.setdefault(int(call.get("index", k)), {"id": None, "type": "function",
                                                                    "function": {"name": "", "arguments": ""}})
        at["id"] = call.get("id") or at["id"]
        function = call.get("function") or {}
        at["function"]["name"] += function.get("name") or ""
        at["function"]["arguments"] += function.get("arguments") or ""

    def ids(self) -> list[int] | None:
        if self.has_ids:
            return self.token_ids
        if self.token_texts and all(isinstance(t, str) and t.startswith(TOKEN_ID) and t[len(TOKEN_ID):].isdigit()
                                    for t in self.token_texts):
            return [int(t[len(TOKEN_ID):]) for t in self.token_texts]
        return None

    def problem(self) -> str | None:
        """Why this choice cannot become a training trace, or None."""
        ids = self.ids()
        if self.prompt_ids is None or ids is None:
            return ("the upstream returned no token ids for the prompt or the completion; text does not map back "
                    "to ids reliably. Fix: use an upstream that honours return_token_ids (vLLM >= 0.10.2, wai "
                    "policy) or start vLLM with --return-tokens-as-token-ids")
        if not self.has_logprobs:
            return ("the upstream returned no log-probabilities, so there is no ratio to form. Fix: use an upstream "
                    "that returns logprobs (vLLM does when asked)")
        if len(self.logprobs) != len(ids) or not all(isinstance(v, (int, float)) and v <= 0 for v in self.logprobs):
            return (f"the upstream returned {len(self.logprobs)} log-probabilities for {len(ids)} tokens (or a "
                    "value that is not a log-probability), so they do not line up with the tokens")
        if not ids:
            return "the reply has no tokens"
        return None

    def reply_message(self) -> dict[str, Any]:
        calls = [self.tool_calls[k] for k in sorted(self.tool_calls)]
        return {"role": "assistant", "content": self.content, **({"tool_calls": calls} if calls else {})}


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a chat message that say what the model saw (a client may add or drop nulls)."""
    content = message.get("content")
    out: dict[str, Any] = {"role": message.get("role"), "content": "" if content is None else content}
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [{"id": c.get("id"), "name": (c.get("function") or {}).get("name"),
                              "arguments": (c.get("function") or {}).get("arguments")} for c in calls
                             if isinstance(c, Mapping)]
    for name in ("tool_call_id", "name"):
        if message.get(name) is not None:
            out[name] = message[name]
    return out


def conversation_key(messages: Sequence[Any]) -> str:
    """A digest of a conversation up to and including an assistant reply: how a follow-up finds its trace."""
    canonical = [_message(m) if isinstance(m, Mapping) else m for m in messages]
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def continued_key(messages: Any) -> str | None:
    """The key of the conversation a chat request continues: its messages up to its last assistant turn."""
    if not isinstance(messages, list):
        return None
    last = max((k for k, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "assistant"),
               default=None)
    return None if last is None else conversation_key(messages[:last + 1])
