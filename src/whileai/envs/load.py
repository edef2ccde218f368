"""`load_taskset(spec, **options)`: one entry point for every kind of taskset."""

from __future__ import annotations

import os
from typing import Any

from whileai.envs.builtin import load_builtin
from whileai.envs.core import Taskset
from whileai.envs.files import load_hf, load_jsonl
from whileai.envs.gym import load_reasoning_gym
from whileai.envs.tools import TOOL_TASKSETS, load_tool_taskset
from whileai.errors import ConfigError

FORMS = ("builtin:NAME", "path/to/file.jsonl", "hf:NAME_OR_LOCAL_PATH", "reasoning_gym:NAME")


def load_taskset(spec: str | os.PathLike[str], **options: Any) -> Taskset:
    """The taskset `spec` names: "builtin:NAME", a ".jsonl" file, "hf:NAME_OR_PATH" or "reasoning_gym:NAME".

    Options are the form's own (docs/tasksets.md); an unknown one is a ConfigError listing the valid ones.
    """
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"taskset spec {spec!r} must be a non-empty string of one of the forms {list(FORMS)}")
    kind, sep, rest = spec.partition(":")
    if sep and kind == "builtin":
        return load_tool_taskset(rest, **options) if rest in TOOL_TASKSETS else load_builtin(rest, **options)
    if sep and kind == "hf":
        return load_hf(rest, **options)
    if sep and kind in ("reasoning_gym", "reasoning-gym"):
        return load_reasoning_gym(rest, **options)
    if spec.endswith(".jsonl"):
        return load_jsonl(spec, **options)
    raise ConfigError(f"taskset spec {spec!r} is not understood; use one of the forms {list(FORMS)}")
