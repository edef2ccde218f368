"""The checkpoint of a trainer whose weights stay on its server: a pointer, in the engine's snapshot layout.

``folder/LATEST`` -> ``step-N-remote/meta.json`` holds no weights, only the step (what the loop's ``read_state``
reads, as of an in-process snapshot) and ``remote``, the state saved on the server (api, url, run, name, path,
step). ``WaiTrainer`` and ``TinkerTrainer`` write one at ``save`` and read it at ``load`` and at ``--resume``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TypedDict

from whileai.errors import ConfigError


class Remote(TypedDict):
    """A state saved on a server: which API, where, the run that saved it, its name and path there, its step."""

    api: str
    url: str | None
    run: str
    name: str
    path: str
    step: int


def state_name(step: int) -> str:
    """The name a server trainer saves its state under: the step (a resume finds it by the step)."""
    return f"step-{step:08d}"


def write_pointer(folder: Path, remote: Remote) -> None:
    """Atomically: the new pointer snapshot, then LATEST names it, then the older ones go."""
    step = remote["step"]
    name = f"{state_name(step)}-remote"
    snapshot = folder / name
    snapshot.mkdir(parents=True, exist_ok=True)
    temporary = snapshot / "meta.json.tmp"
    temporary.write_text(json.dumps({"format": 1, "step": step, "remote": remote}, indent=2))
    os.replace(temporary, snapshot / "meta.json")
    pointer = folder / f".tmp-LATEST-{name}"
    pointer.write_text(name)
    os.replace(pointer, folder / "LATEST")
    for old in folder.glob("step-*"):
        if old.name != name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


def remote_state(folder: Path) -> Remote | None:
    """The server-side state a checkpoint names; None for an in-process snapshot or no checkpoint."""
    pointer = folder / "LATEST"
    if not pointer.is_file():
        return None
    meta = folder / pointer.read_text().strip() / "meta.json"
    if not meta.is_file():
        return None
    remote: Remote | None = json.loads(meta.read_text()).get("remote")
    return remote


def remote_checkpoint(folder: Path) -> Remote:
    """``remote_state(folder)`` of a run on a server; a checkpoint written in-process is refused."""
    saved = remote_state(folder)
    if saved is None:
        raise ConfigError(f"--resume: the checkpoint in {folder} was written in-process, and the run's config trains "
                          "over --url; it cannot continue on a server (resume it without url in its config.toml)")
    return saved
