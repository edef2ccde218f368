"""The text fields of ``wai policy``'s logprobs: each token's own bytes, as OpenAI's API shows them.

    token_bytes(tok, id)   the bytes the token stands for: a byte-level BPE token's bytes (through GPT-2's byte map),
                           a special token's text (``<|im_end|>``), else the token decoded alone
    piece(tok, id)         that text when the bytes are whole UTF-8, else ``bytes:\\xe4\\xbd`` (a token inside a
                           multi-byte character, as OpenAI and vLLM write it); the field ``bytes`` is always the
                           real byte list
    keyed(tok, pairs)      completions' ``top_logprobs`` {text: logprob}: a text two alternatives share (a tokenizer
                           may have two ids for one text) keys the later ones as ``token_id:<id>``, so none is lost
    offsets(tok, ids, n, text, deltas)
                           completions' ``text_offset``: where each token's text starts in the returned text

An offset is the index, in the text returned (after a stop string is cut away), of the character holding the
token's first byte: the halves of a character split across tokens share its offset; a token with no text (a
special token skipped, the end token) sits where the next character would. Exact for byte-level BPEs and the
built-in byte tokenizer (from the tokens' bytes, decoded as their decoders do); for other tokenizers (whose decode
is not their tokens' bytes joined) the offsets are where each token's streamed text starts.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import Any

from whileai.record import chat

_BYTE_OF: dict[str, int] = {}


def _byte_of() -> dict[str, int]:
    if not _BYTE_OF:
        from whileai.engine.models import _bytes_to_unicode

        _BYTE_OF.update({ch: b for b, ch in _bytes_to_unicode().items()})
    return _BYTE_OF


def _byte_level(tokenizer: Any) -> bool:
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return type(decoder).__name__ == "ByteLevel"


def token_bytes(tokenizer: Any, token: int) -> bytes:
    """The bytes token ``token`` stands for (a special token: its text)."""
    if chat.is_byte_tokenizer(tokenizer):
        return (chat.SPECIALS[token] if token < chat.BYTE_OFFSET else "").encode() or bytes([token - chat.BYTE_OFFSET])
    added = getattr(tokenizer, "added_tokens_decoder", {}).get(token)
    if added is not None:
        return str(added.content if hasattr(added, "content") else added).encode()
    if _byte_level(tokenizer):
        text = tokenizer.convert_ids_to_tokens(token)
        byte_of = _byte_of()
        if isinstance(text, str) and all(ch in byte_of for ch in text):
            return bytes(byte_of[ch] for ch in text)
    return str(tokenizer.decode([token], skip_special_tokens=False)).encode()


def piece(tokenizer: Any, token: int, as_id: bool = False) -> str:
    """The token's text, ``bytes:\\xNN..`` when its bytes are not whole UTF-8, or vLLM's ``token_id:<id>``."""
    if as_id:  # vLLM's return_tokens_as_token_ids
        return f"token_id:{token}"
    raw = token_bytes(tokenizer, token)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def piece_bytes(tokenizer: Any, token: int, as_id: bool = False) -> list[int]:
    """The ``bytes`` field: the token's real bytes (of ``token_id:<id>`` with ``as_id``, that text's)."""
    return list(piece(tokenizer, token, True).encode()) if as_id else list(token_bytes(tokenizer, token))


def keyed(tokenizer: Any, pairs: Sequence[tuple[int, float]], as_id: bool = False) -> dict[str, float]:
    """``{text: logprob}`` for completions' ``top_logprobs``, no two alternatives under one key."""
    out: dict[str, float] = {}
    for token, value in pairs:
        key = piece(tokenizer, token, as_id)
        out[key if key not in out else f"token_id:{token}"] = value
    return out


def _chars(data: bytes, per_byte: bool) -> tuple[str, list[int]]:
    """The lossy UTF-8 text of ``data`` and the byte where each of its characters starts. Bytes that are no
    character read as one U+FFFD per maximal invalid run (Python's and Rust's ``from_utf8_lossy``), or with
    ``per_byte`` as the byte model's private-use escapes (``record.chat``)."""
    out: list[str] = []
    starts: list[int] = []
    at = 0
    while at < len(data):
        try:
            good, bad = data[at:].decode("utf-8"), None
        except UnicodeDecodeError as err:
            good, bad = data[at:at + err.start].decode("utf-8"), (at + err.start, at + err.end)
        for ch in good:
            starts.append(at)
            out.append(ch)
            at += len(ch.encode("utf-8"))
        if bad is None:
            break
        if per_byte:
            starts += list(range(bad[0], bad[1]))
            out += [chr(chat.ESCAPE + b) for b in data[bad[0]:bad[1]]]
        else:
            starts.append(bad[0])
            out.append("\ufffd")
        at = bad[1]
    return "".join(out), starts


def offsets(tokenizer: Any, reply: Sequence[int], count: int, text: str, deltas: Sequence[str]) -> list[int]:
    """``text_offset`` of the ``count`` sampled tokens whose first ``len(reply)`` are the reply's (the rest: the end
    token), in ``text`` (the reply's text, cut at a stop string). ``deltas``: what each token adds to the stream."""
    streamed = [0, *itertools.accumulate(len(d) for d in deltas)][:count]
    byte_model = chat.is_byte_tokenizer(tokenizer)
    if not (byte_model or _byte_level(tokenizer)):
        return streamed
    specials = set() if byte_model else {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()
                                         if getattr(t, "special", False)}
    pieces = [b"" if t in specials else token_bytes(tokenizer, t) for t in reply]
    decoded, starts = _chars(b"".join(pieces), byte_model)
    if decoded != chat.decode(tokenizer, reply):  # a decoder that is not the bytes joined: the stream's offsets
        return streamed
    out, at = [], 0
    for j in range(count):
        index = bisect.bisect_right(starts, at) - 1 if j < len(pieces) and pieces[j] else bisect.bisect_left(starts, at)
        out.append(min(index, len(text)))
        at += len(pieces[j]) if j < len(pieces) else 0
    return out
