"""Chat messages to token ids, and token ids to text, for the policy server.

A tokenizer with a chat template renders messages through it (``tools`` passed along). The built-in byte
tokenizer, which has none, uses this module's template (the one tokenization rule, ``whileai.prompts``, reads
chat prompts of a built-in through it too; any other tokenizer without a template is refused: a loaded model
gets no format of ours), chosen so that a reply re-rendered in a follow-up request is exactly the tokens the
model wrote (which is what lets ``wai record`` thread a conversation into one trace)::

    <|bos|>                                   once
    {role}: {content}\\n                      each system / user / tool message (tools: one "tools: [json]\\n")
    assistant: {content}<|eos|>\\n            each assistant message: the reply, then the stop token it ended on
    assistant:                                the generation prompt (with the space)

Text of the built-in byte models is lossless both ways: bytes that are not valid UTF-8 read as the
private-use characters U+F700 + byte, and the special tokens as their names (``<|pad|>``), so every reply
maps back to the ids it was sampled as.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from whileai.errors import BatchError, ConfigError

ESCAPE = 0xF700  # a byte b that is not valid UTF-8 reads as chr(ESCAPE + b)
BYTE_OFFSET = 3  # the built-in tokenizer's id of byte b is 3 + b (ids 0-2: pad, bos, eos)
SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>")
_SPECIAL = re.compile("|".join(re.escape(s) for s in SPECIALS))


def _escape_bytes(err: UnicodeError) -> tuple[str, int]:
    assert isinstance(err, UnicodeDecodeError)
    return "".join(chr(ESCAPE + b) for b in err.object[err.start:err.end]), err.end


codecs.register_error("whileai-bytes", _escape_bytes)


def is_byte_tokenizer(tokenizer: Any) -> bool:
    """The built-in byte-level tokenizer (259 ids: pad, bos, eos, then the 256 bytes)."""
    return len(tokenizer) == 256 + BYTE_OFFSET and tokenizer.convert_ids_to_tokens(0) == SPECIALS[0]


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """The text of ``ids`` (special tokens dropped for a real tokenizer; kept by name for the byte model)."""
    if not is_byte_tokenizer(tokenizer):
        return str(tokenizer.decode(list(ids), skip_special_tokens=True))
    parts, run = [], bytearray()
    for i in ids:
        if i >= BYTE_OFFSET:
            run.append(i - BYTE_OFFSET)
            continue
        parts.append(run.decode("utf-8", "whileai-bytes") + SPECIALS[i])
        run = bytearray()
    return "".join(parts) + run.decode("utf-8", "whileai-bytes")


def encode(tokenizer: Any, text: str) -> list[int]:
    """The ids of ``text``, no BOS added (the inverse of ``decode`` for the byte model)."""
    if not is_byte_tokenizer(tokenizer):
        return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    ids: list[int] = []
    at = 0
    for match in _SPECIAL.finditer(text):
        ids += _text_bytes(text[at:match.start()])
        ids.append(SPECIALS.index(match.group()))
        at = match.end()
    return ids + _text_bytes(text[at:])


def _text_bytes(text: str) -> list[int]:
    out = bytearray()
    for ch in text:
        code = ord(ch)
        out += bytes([code - ESCAPE]) if ESCAPE <= code < ESCAPE + 256 else ch.encode("utf-8")
    return [BYTE_OFFSET + b for b in out]


def content_text(where: str, content: Any) -> str:
    """A message's content as text: a string, null, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise BatchError(f"{where}.content must be text or a list of {{'type': 'text', 'text': ...}} parts; got "
                     f"{str(content)[:60]!r}. Fix: send text (this server has no image or audio input).")


def render(tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Any = None) -> list[int]:
    """The prompt's token ids for ``messages``, ending with the generation prompt."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(list(messages), tools=tools, add_generation_prompt=True, tokenize=True)
        return [int(i) for i in (ids["input_ids"] if isinstance(ids, Mapping) else ids)]
    if not is_byte_tokenizer(tokenizer):  # a loaded model's tokenizer: no chat format of ours (vLLM has none)
        raise ConfigError(f"the model's tokenizer ({type(tokenizer).__name__}) has no chat template, so chat "
                          "messages have no format; send the prompt as text to /v1/completions, or serve a "
                          "model whose tokenizer has a chat template")
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    ids = [int(bos)]
    if tools:
        ids += encode(tokenizer, f"tools: {json.dumps(tools, separators=(',', ':'))}\n")
    for k, message in enumerate(messages):
        role, text = message["role"], content_text(f"messages[{k}]", message.get("content"))
        if role == "assistant":
            ids += encode(tokenizer, f"assistant: {text}") + ([int(eos)] if eos is not None else [])
            ids += encode(tokenizer, "\n")
        else:
            ids += encode(tokenizer, f"{role}: {text}\n")
    return ids + encode(tokenizer, "assistant: ")
