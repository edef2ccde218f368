"""The exceptions whileai raises for anything a user can trigger.

Every message names the row or field, the value, why it is wrong and how to fix it.
"""

from __future__ import annotations


class WhileaiError(Exception):
    """Base class of every whileai error."""


class BatchError(WhileaiError, ValueError):
    """A row or batch that breaks the batch contract (see DESIGN.md, "A row")."""


class ConfigError(WhileaiError, ValueError):
    """A method, engine or writer setting outside its valid range."""


class ServerStopped(WhileaiError):
    """A server a training run depends on failed mid-run and the run stopped, resumable from its checkpoint.

    ``role``: the inference server (--sampler-url), the recorder (--rows-from) or the training server (--url);
    ``step``: where a resume starts; ``saved``: what the checkpoint holds, in a sentence. The message names
    the request that failed (``cause``) and ends with the resume line."""

    def __init__(self, role: str, url: str, run_dir: object, step: int, cause: BaseException, saved: str) -> None:
        super().__init__(f"the {role} at {url} failed at step {step}: {cause}. {saved} Restart or fix the server, "
                         f"then resume with: wai train --resume {run_dir}")
        self.role, self.url, self.run_dir, self.step = role, url, run_dir, step
