"""The one tokenization rule: how a prompt becomes token ids, everywhere a prompt is tokenized.

Training, evaluation, every ``--rows`` trace format, ``wai policy`` and the tokenizer exported to a run's
``final/`` all tokenize a prompt through these two functions, so a server that tokenizes text with the
exported tokenizer (vLLM, a transformers pipeline) feeds the model the contexts it was trained on:

    text_ids(tokenizer, text)        raw text as the tokenizer itself encodes it, with its own special
                                     tokens: ``tokenizer.encode(text)``. BOS comes from the tokenizer's own
                                     post-processor (its ``add_bos_token``), never from us. The built-in byte
                                     tokenizer adds BOS itself, in process and once exported. This is what a
                                     completions-API server does with a text prompt.
    prompt_ids(tokenizer, prompt)    a task's prompt (text or chat messages): through the tokenizer's chat
                                     template when it has one (text = one user message, with the generation
                                     prompt); otherwise ``text_ids``. Chat messages on a tokenizer without a
                                     template: the built-in byte tokenizer's own chat format (the one `wai
                                     policy` serves, ``whileai.record.chat``); any other tokenizer refuses
                                     them, as vLLM does (no format of ours for a loaded model).

No torch import: the taskset, the trace readers and the engine all use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from whileai.errors import ConfigError

Prompt = str | Sequence[Mapping[str, Any]]


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """``text`` as the tokenizer encodes it with its own special tokens (BOS where the tokenizer adds one)."""
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=True)]


def prompt_ids(tokenizer: Any, prompt: Prompt, where: str = "the prompt") -> list[int]:
    """Token ids of a task's prompt: the chat template when the tokenizer has one, else ``text_ids``.

    ``where`` names the prompt in the error a chat prompt on a tokenizer without a template raises.
    """
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # transformers 5 may return a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    if not isinstance(prompt, str):
        from whileai.record import chat

        if chat.is_byte_tokenizer(tokenizer):
            return chat.render(tokenizer, list(prompt))
        raise ConfigError(f"{where}: the prompt is a list of chat messages but the tokenizer "
                          f"({type(tokenizer).__name__}) has no chat template; use a model whose tokenizer "
                          f"has one, or give plain-text prompts")
    return text_ids(tokenizer, prompt)
