"""The one stop rule, read by every front (the engine's sampler, so ``wai train``; the Tinker front; ``wai policy``).

What ends a sample:

* an **end-of-sequence id**: the tokenizer's EOS and every id of the model's ``generation_config.eos_token_id``
  (an int or a list: Qwen2.5-Instruct's is ``[151645, 151643]``, ``<|im_end|>`` and ``<|endoftext|>``), as
  transformers' ``generate`` and vLLM stop on them (``eos_ids``); unless the caller asks to ignore EOS;
* a **stop string**, matched on the decoded text, not on the ids of the string encoded alone: a BPE writes
  ``" two"`` as one token that is not the id of ``"two"``, and a character may take several byte tokens
  (``TextStops``). The sample ends on the first token after which its text holds the string, so the token that
  completes it is the last one and may carry text past it;
* a stop token id, or a sequence of ids, given as such.

The ids stay in the sample (training scores what was sampled). What a server returns as *text* is OpenAI's and
vLLM's: the content up to the stop string, without it (``cut_at_stop``), and without the end or stop token the
sample ended on (``reply_ids``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return [int(value)]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [int(v) for v in value if isinstance(v, (int, np.integer)) and not isinstance(v, bool)]
    return []


def eos_ids(tokenizer: Any, model: Any = None) -> tuple[int, ...]:
    """The ids that end a sample: the tokenizer's EOS, then each id of the model's
    ``generation_config.eos_token_id`` (read from ``generation_config.json`` when transformers loads a folder),
    each once, in that order."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    generation = getattr(base, "generation_config", None)
    ids: list[int] = []
    for i in _as_ids(getattr(tokenizer, "eos_token_id", None)) + _as_ids(getattr(generation, "eos_token_id", None)):
        if i not in ids:
            ids.append(i)
    return tuple(ids)


class TextStops:
    """Stop strings matched on the decoded text of each row's latest tokens, checked after every new token.

    A row stops at the first token after which its decoded text holds a stop string. Rows are checked every
    step, so a string found is new in the last few tokens: only a window of them is decoded. The window covers a
    string of c characters even when every character takes 4 byte tokens, plus margin for a tokenizer that
    changes a token's text at the start of a decode. A character split across tokens decodes as U+FFFD until its
    last byte arrives, so a string ending in it matches on the token that completes it, never before."""

    def __init__(self, texts: Sequence[str], decode: Callable[[list[int]], str]) -> None:
        self.texts, self.decode = list(texts), decode
        self.window = 4 * max(len(t) for t in texts) + 8

    def found(self, tails: list[list[int]]) -> list[bool]:
        """For each row's latest tokens (at most ``window``), whether their text holds a stop string."""
        decoded = [self.decode(tail[-self.window:]) for tail in tails]
        return [any(t in text for t in self.texts) for text in decoded]


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """The text before the first stop string in it (OpenAI's and vLLM's content: the stop is not returned), and
    whether one was found."""
    at = min((i for s in stops if s and (i := text.find(s)) >= 0), default=-1)
    return (text[:at], True) if at >= 0 else (text, False)


def reply_ids(tokens: Sequence[int], stopped: bool, end_ids: Sequence[int]) -> list[int]:
    """The tokens whose text is the reply: without the end-of-sequence or stop token the sample ended on."""
    if stopped and tokens and tokens[-1] in end_ids:
        return list(tokens[:-1])
    return list(tokens)
