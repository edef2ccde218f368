"""The trainer on a ``wai serve``: a run there, through the service's client (``wai train --url U``).

    trainer = over_service(url, token, "builtin:tiny", lora_rank=8, seed=0, needs=needs)

Its checkpoint is a state saved on the server (named by the step) and, in the run's folder, a pointer to it
(``whileai.trainers.remote``); ``--resume`` starts a new run there from a copy of that state. The server may
itself run its runs on a Tinker-API server (``wai serve --tinker-url``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from whileai.errors import ConfigError
from whileai.trainers.base import Needs, add_critic, refusals
from whileai.trainers.remote import Remote, remote_checkpoint, state_name, write_pointer
from whileai.trainers.wai_client import Client, RunClient, Session


class WaiTrainer(RunClient):
    """A ``RunClient`` that owns its session and its checkpoints."""

    def __init__(self, run: RunClient, session: Session, capabilities: Mapping[str, Any]) -> None:
        super().__init__(run.client, run.info())
        self.session = session
        self.url: str | None = run.client.url
        self.where = f"service at {self.url}"
        self.capabilities: Mapping[str, Any] | None = capabilities

    def save(self, folder: Path) -> str:
        step = self.step
        name = state_name(step)
        path = self.save_state(name)
        write_pointer(folder, Remote(api="wai", url=self.url, run=self.id, name=name, path=path, step=step))
        return path

    def load(self, folder: Path, *, optimizer: bool = True) -> None:
        self.load_state(remote_checkpoint(folder)["name"], optimizer=optimizer)

    def export(self, path: str, merged: bool = False) -> str:
        if Path(path).exists():
            shutil.rmtree(path)
        return self.export_lora(path, merged=merged)

    def close(self) -> None:
        """Close the run's session and the connection; on a server that is gone closing the session fails, and
        must not hide why the run stopped."""
        try:
            self.session.close()
        except Exception:  # noqa: BLE001 - the error that stopped the run is the one to report
            pass
        self.client.close()


def token_for(token: str | None) -> str:
    found = token or os.environ.get("WAI_TOKEN")
    if not found:
        raise ConfigError("--url needs the server's bearer token: give --token T or set WAI_TOKEN (wai serve printed "
                          "it)")
    return found


def over_service(url: str, token: str | None, model: str, *, lora_rank: int, seed: int, needs: Needs,
                 resume: Path | None = None) -> WaiTrainer:
    """A run on the server at ``url``: refused with every unmet need before the run is created. ``resume``: a
    checkpoint folder whose pointer names a state saved there; the new run starts from a copy of it."""
    client = Client(url, token_for(token))
    session = None
    try:
        saved = remote_checkpoint(resume) if resume is not None else None
        offered = _capabilities(client)
        problems = refusals(offered, model, needs)
        if problems:
            raise ConfigError(f"the server at {url} cannot run this: " + "; ".join(problems))
        session = client.create_session()
        source = {} if saved is None else {"from_state": f"{saved['run']}/{saved['name']}"}
        try:
            run = session.create_run(model, lora_rank=lora_rank, seed=seed, reference=needs.reference or None,
                                     **source)
        except ConfigError:
            raise
        except Exception as err:
            if saved is None or getattr(err, "status", None) != 404:
                raise
            raise ConfigError(f"--resume: the checkpoint at step {saved['step']} is the state {saved['name']!r} of "
                              f"run {saved['run']} on the server at {url}, which no longer has it ({err}); it was "
                              "restarted without its data dir, or the run was deleted. The run cannot continue from "
                              "there: start it again in a new --run-dir") from None
        trainer = WaiTrainer(run, session, offered)
        if needs.critic is not None:
            add_critic(trainer, needs.critic)
    except BaseException:
        if session is not None:
            try:
                session.close()
            except Exception:  # noqa: BLE001 - the error that stopped the run is the one to report
                pass
        client.close()
        raise
    return trainer


def _capabilities(client: Client) -> dict[str, Any]:
    """The wai serve's capabilities; a server that does not answer them is named, with --api tinker."""
    try:
        return dict(client.capabilities())
    except ConfigError:
        raise
    except Exception as err:
        if getattr(err, "status", None) != 404:
            raise
        raise ConfigError(f"--url {client.url}: no wai serve answers there (GET /v1/training/capabilities: "
                          f"{err}); for a Tinker-API server (Tinker, SkyRL's) add --api tinker") from None
