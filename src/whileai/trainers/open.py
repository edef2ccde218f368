"""The trainer a run names: in-process without a url, else the one of its ``api`` on the server at the url.

A new kind of server trainer is a module beside this one (a class that satisfies ``Trainer`` and a function of
``SERVERS``' signature) and its line in ``SERVERS``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from whileai.trainers.base import Needs, Trainer


class OpenServer(Protocol):
    def __call__(self, url: str, token: str | None, model: str, *, lora_rank: int, seed: int, needs: Needs,
                 resume: Path | None = None) -> Trainer: ...


def _wai() -> OpenServer:
    from whileai.trainers.wai import over_service

    return over_service


def _tinker() -> OpenServer:
    from whileai.trainers.tinker import over_tinker

    return over_tinker


SERVERS = {"wai": _wai, "tinker": _tinker}
"""--api NAME -> the opener of its trainer (imported when asked for: the SDK is an extra)"""
TITLES = {"wai": "wai serve", "tinker": "Tinker API"}
"""--api NAME -> how the run plan names its server (``trainer wai serve at URL``); the name itself by default"""


def title(api: str, url: str | None) -> str:
    """Where a run's model trains, as the plan shows it."""
    return "in-process" if url is None else f"{TITLES.get(api, api)} at {url}"


def open_trainer(model: str, *, url: str | None, api: str, token: str | None, lora_rank: int, device: str,
                 seed: int, micro_batch_tokens: int, needs: Needs, resume: Path | None = None,
                 activation_checkpointing: str | None = None) -> Trainer:
    """The trainer: ``resume`` is the checkpoint folder a server trainer starts from (the state it names);
    ``activation_checkpointing`` ('on' / 'off', the plan's) is the in-process engine's (a server decides its own)."""
    if url is None:
        from whileai.trainers.engine import in_process

        return in_process(model, lora_rank=lora_rank, device=device, seed=seed,
                          micro_batch_tokens=micro_batch_tokens, needs=needs,
                          activation_checkpointing=activation_checkpointing)
    return SERVERS[api]()(url, token, model, lora_rank=lora_rank, seed=seed, needs=needs, resume=resume)
