"""Helpers of the field suite (a module of its own: ``conftest`` is a name every test folder uses)."""

from __future__ import annotations

from pathlib import Path

MiB = 2**20


def rss_mb(pid: int) -> float:
    """The resident memory of a process, in MiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")
