"""Start ``wai policy`` / ``wai record`` in their own processes and wait until they answer (tests, docs).

    with Started(["policy", "builtin:tiny"], log_dir) as policy, Started(["record", "--upstream", policy.url,
            "--data-dir", str(data)], log_dir) as recorder:
        client = openai.OpenAI(base_url=recorder.url + "/v1", api_key="none")

``kill()`` sends SIGKILL (a crash); ``start()`` again runs the same command on the same port.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from whileai.errors import WhileaiError
from whileai.service.launch import free_port


class Started:
    """A ``wai`` server subprocess on 127.0.0.1 (``--port`` is added): ``url``, ``kill``, ``stop``, ``start``."""

    def __init__(self, args: Sequence[str], log_dir: Path, port: int | None = None, timeout: float = 120.0) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [*args, "--port", str(self.port)]
        self.log = Path(log_dir) / f"{args[0]}-{self.port}.log"
        self.timeout = timeout
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Started:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "whileai", *self.args], stdout=log,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise WhileaiError(f"wai {self.args[0]} exited ({self.process.returncode}):\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise WhileaiError(f"wai {self.args[0]} did not answer on {self.url} in {self.timeout:g} s")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Started:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
