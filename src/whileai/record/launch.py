"""Start ``wai policy`` / ``wai record`` in their own processes and wait until they answer (tests, docs).

    with Started(["policy", "builtin:tiny"], log_dir) as policy, Started(["record", "--upstream", policy.url,
            "--data-dir", str(data)], log_dir) as recorder:
        client = openai.OpenAI(base_url=recorder.url + "/v1", api_key="none")

``kill()`` sends SIGKILL (a crash); ``start()`` again runs the same command on the same port.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from whileai.service.launch import ServerProcess, free_port


class Started(ServerProcess):
    """A ``wai`` server subprocess on 127.0.0.1 (``--port`` is added): ``url``, ``kill``, ``stop``, ``start``."""

    def __init__(self, args: Sequence[str], log_dir: Path, port: int | None = None, timeout: float = 120.0) -> None:
        port = port or free_port()
        self.args = [*args, "--port", str(port)]
        super().__init__(self.args, Path(log_dir) / f"{args[0]}-{port}.log", port, timeout)
