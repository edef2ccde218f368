"""What the writer builds on: the context, one method's plan, and the result object ``PrimeRLConfig``."""

from __future__ import annotations

import os
import shlex
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from whileai.errors import ConfigError
from whileai.methods.base import Method
from whileai.prime_rl import schema
from whileai.prime_rl.schema import PINNED, PINNED_SHORT


@dataclass
class Context:
    """What the writer knows besides the method: the model, an optional frozen endpoint, strictness."""

    model: str
    teacher: Any = None  # wai.Endpoint for SFT's frozen sampler or an OPD without its own teacher
    model_vocab_size: int | None = None
    strict: bool = False


@dataclass
class Plan:
    """What one method writes: its algorithm table, loss, knob-mapped keys, and what it leaves unread."""

    algo: dict[str, Any]
    component: str  # the prime-rl loss component it trains: rl, ref_kl or ce
    keys: dict[str, tuple[Any, str]] = field(default_factory=dict)  # path -> (value, "Class.field")
    loss: dict[str, Any] = field(default_factory=dict)
    owned: set[str] = field(default_factory=set)  # keys an override may not touch
    mapped: dict[str, str] = field(default_factory=dict)  # "Class.field" -> where it went
    ignored: dict[str, str] = field(default_factory=dict)  # "Class.field" -> why prime-rl does not read it
    warnings: list[str] = field(default_factory=list)
    finalize: list[Callable[[dict[str, Any], Plan], None]] = field(default_factory=list)
    async_wrapped: bool = False
    method: Any = None  # the method object whose plan this is (the innermost one under Async)
    teacher_used: bool = False  # whether Context.teacher went into the config
    overridden: set[str] = field(default_factory=set)  # paths an override wrote


def group_size(config: dict[str, Any]) -> int:
    return int(schema.get(config, "orchestrator.group_size", schema.KEYS["orchestrator.group_size"].default))


def put(config: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path, creating tables; ``orchestrator.train.source[]`` addresses the one source."""
    node = config
    parts = path.split(".")
    for part in parts[:-1]:
        if part.endswith("[]"):
            node = node.setdefault(part[:-2], [{}])[0]
        else:
            node = node.setdefault(part, {})
    node[parts[-1]] = value


# ----------------------------------------------------------------- the result object
@dataclass
class PrimeRLConfig:
    """A prime-rl config for one method: ``config`` (nested dict), ``toml``, ``command``, ``ignored``, ``warnings``.

    ``method`` is the whileai method object it was written from; ``mapped`` says where each knob went.
    """

    method: Method
    config: dict[str, Any]
    ignored: dict[str, str]
    warnings: list[str]
    mapped: dict[str, str]
    path: Path | None = None
    pinned: dict[str, str] = field(default_factory=lambda: dict(PINNED))

    @property
    def algorithm(self) -> str:
        """prime-rl's algorithm type, plus its rl loss when not the default."""
        algo = self.config["orchestrator"]["algo"]["type"]
        loss = self.config["trainer"].get("loss", {}).get("type")
        return f"{algo} + {loss} loss" if loss else algo

    @property
    def command(self) -> str:
        """The launch line (the file name is ``rl.toml`` until ``write`` names it)."""
        return _launch(self.path)

    @property
    def toml(self) -> str:
        return self._render(self.path)

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the TOML to ``path`` atomically (a temporary file in the same folder, then a rename).

        The file is readable by all (0644), like any config; ``path`` and ``command`` name it once written.
        """
        target = Path(path)
        if target.is_dir():
            raise ConfigError(f"write: {target} is a folder; name the TOML file to write, e.g. {target / 'rl.toml'}")
        text = self._render(target)  # the header's launch line names the file
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(temporary, 0o644)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self.path = target
        return target

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for JSON."""
        return {"method": repr(self.method), "algorithm": self.algorithm, "command": self.command,
                "path": None if self.path is None else str(self.path), "pinned": self.pinned,
                "config": self.config, "ignored": self.ignored, "mapped": self.mapped, "warnings": self.warnings}

    def __str__(self) -> str:
        head = f"prime-rl config ({PINNED_SHORT}): {self.algorithm}, from {self.method!r}"
        return "\n".join([head, *self._notes(self.path)])

    def _notes(self, path: Path | None) -> list[str]:
        return [f"launch: {_launch(path)}", *(f"ignored {tag}: {why}" for tag, why in self.ignored.items()),
                *(f"warning: {text}" for text in self.warnings)]

    def _render(self, path: Path | None) -> str:
        """The TOML text: a comment header (pin, method, launch line, ignored, warnings), then the config."""
        lines = [f"written by whileai prime_rl_config for {PINNED['repo']} {PINNED['tag']} ({PINNED['commit']})",
                 f"method: {self.method!r}", *self._notes(path)]
        wrapped = [textwrap.fill(line, 108, initial_indent="# ", subsequent_indent="#   ") for line in lines]
        return "\n".join(wrapped) + "\n\n" + tomli_w.dumps(self.config)


def _launch(path: Path | None) -> str:
    return f"uv run rl @ {shlex.quote(str(path or 'rl.toml'))}"
