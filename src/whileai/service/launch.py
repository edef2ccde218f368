"""Start ``wai serve`` in its own process and wait until it answers (tests, ``wai loop``, benchmarks).

    with start_server(tmp_path / "data") as server:
        client = Client(server.url, server.token)

``server.kill()`` sends SIGKILL (a crash); ``server.restart()`` starts a new process on the same data
directory, port and token. The server's output goes to ``data_dir/server.log``.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

from whileai.errors import WhileaiError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_Server = TypeVar("_Server", bound="ServerProcess")


class ServerProcess:
    """A ``wai`` server subprocess (``argv`` after ``wai``) that answers GET /healthz on ``port`` once up: ``url``,
    ``kill`` (SIGKILL, as in a crash), ``stop``; ``start()`` again runs the same command on the same port."""

    def __init__(self, argv: Sequence[str], log: Path, port: int, timeout: float,
                 env: dict[str, str] | None = None) -> None:
        self.argv, self.log, self.port, self.timeout, self.env = list(argv), log, port, timeout, env
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self: _Server) -> _Server:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:  # the child keeps its own handle
            self.process = subprocess.Popen([sys.executable, "-m", "whileai", *self.argv], stdout=log,
                                            stderr=subprocess.STDOUT, env=self.env)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise WhileaiError(f"wai {self.argv[0]} exited with status {self.process.returncode} before "
                                   f"answering; its output:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise WhileaiError(f"wai {self.argv[0]} did not answer on {self.url} within {self.timeout:g} s; its "
                           f"output:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL: the process dies at once, as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self: _Server) -> _Server:
        return self if self.process is not None else self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class LocalServer(ServerProcess):
    """A ``wai serve`` subprocess on 127.0.0.1: ``url``, ``token``, ``data_dir``; ``kill``, ``stop``, ``restart``."""

    def __init__(self, data_dir: Path, *, token: str | None = None, port: int | None = None,
                 args: Sequence[str] = (), threads: int = 1, startup_timeout: float = 120.0) -> None:
        self.data_dir = Path(data_dir)
        self.token = token or secrets.token_urlsafe(24)
        self.args = [*args, "--threads", str(threads)]
        port = port or free_port()
        super().__init__(["serve", "--port", str(port), "--data-dir", str(self.data_dir), *self.args],
                         self.data_dir / "server.log", port, startup_timeout, {**os.environ, "WAI_TOKEN": self.token})

    def restart(self) -> LocalServer:
        self.stop()
        return self.start()


def start_server(data_dir: Path, **options: Any) -> LocalServer:
    """A started ``LocalServer`` (see its arguments); use it as a context manager to stop it."""
    return LocalServer(data_dir, **options).start()
