"""Addresses of models served elsewhere: a teacher (OPD), a frozen sampler (SFT on prime-rl).

An ``Endpoint`` is only an address and what the caller knows about the model behind it; nothing here
opens a connection. It lives apart from the methods so a method, the router and the prime-rl writer
can all name one without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

from whileai.errors import ConfigError


@dataclass(frozen=True)
class Endpoint:
    """A model served over an OpenAI-compatible API: a teacher that scores the student's tokens, or a
    frozen model to sample from."""

    base_url: str
    model: str = ""
    vocab_size: int | None = None
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        problems = []
        parsed = urlparse(self.base_url) if isinstance(self.base_url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
            problems.append(f"Endpoint.base_url={self.base_url!r} is invalid: it must be an http(s) URL with a "
                            "host, e.g. 'http://127.0.0.1:8000/v1'")
        if not isinstance(self.model, str):
            problems.append(f"Endpoint.model={self.model!r} is invalid: it must be the served model's name (str)")
        if self.vocab_size is not None and (isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int)
                                            or self.vocab_size < 1):
            problems.append(f"Endpoint.vocab_size={self.vocab_size!r} is invalid: it must be None or an integer "
                            ">= 1 (the teacher tokenizer's len(tokenizer))")
        if self.api_key_env is not None and (not isinstance(self.api_key_env, str) or not self.api_key_env):
            problems.append(f"Endpoint.api_key_env={self.api_key_env!r} is invalid: it must be None or the name "
                            "of an environment variable holding the key")
        if problems:
            raise ConfigError("; ".join(problems))
