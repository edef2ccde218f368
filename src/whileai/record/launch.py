"""Start ``wai policy`` / ``wai record`` in their own processes and wait until they answer (tests, docs).

    with Started(["policy", "builtin:tiny"], log_dir) as policy, Started(["record", "--upstream", policy.url,
            "--data-dir", str(data)], log_dir) as recorder:
        client = openai.OpenAI(base_url=recorder.url + "/v1", api_key=recorder.token)

Each server gets ``token`` (default: one token shared by every server this process starts, so a recorder and
its policy agree) through ``$WAI_TOKEN``, unless its arguments say ``--token`` or ``--no-token``; ``.token``
is what a client sends (None under ``--no-token``). ``kill()`` sends SIGKILL (a crash); ``start()`` again runs
the same command on the same port.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from whileai.service.auth import TOKEN_ENV
from whileai.service.launch import ServerProcess, free_port

SHARED_TOKEN = "wai-test-" + secrets.token_urlsafe(18)


class Started(ServerProcess):
    """A ``wai`` server subprocess on 127.0.0.1 (``--port`` is added): ``url``, ``token``, ``kill``, ``stop``,
    ``start``."""

    def __init__(self, args: Sequence[str], log_dir: Path, port: int | None = None, timeout: float = 120.0,
                 token: str | None = None) -> None:
        port = port or free_port()
        self.args = [*args, "--port", str(port)]
        if "--no-token" in args:
            self.token: str | None = None
        elif "--token" in args:
            self.token = list(args)[list(args).index("--token") + 1]
        else:
            self.token = token or SHARED_TOKEN
        env = {**os.environ, TOKEN_ENV: self.token} if self.token else None
        super().__init__(self.args, Path(log_dir) / f"{args[0]}-{port}.log", port, timeout, env)

    @property
    def headers(self) -> dict[str, str]:
        """The Authorization header a client sends (empty under --no-token)."""
        return {"authorization": f"Bearer {self.token}"} if self.token else {}
