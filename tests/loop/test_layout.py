"""The loop's rooms import only downward (docs/decisions.md, "layout"): a module of a room may import its own
room and the rooms below it, never one above, outside ``if TYPE_CHECKING`` (a type named, not a module run).

    types < step < sources < plan < hooks < core < auto < run < controls, judge < __init__
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import whileai.loop
from whileai.loop import types
from whileai.loop.hooks.checkpoints import Checkpoints
from whileai.loop.hooks.held_out import HeldOut
from whileai.loop.hooks.metrics import Record
from whileai.loop.hooks.preflight import PreflightHook
from whileai.loop.hooks.teacher import TeacherHook
from whileai.loop.hooks.traces import TraceHook
from whileai.loop.hooks.warm_start import WarmStart
from whileai.loop.sources.recorder import FeedHook
from whileai.loop.sources.sampler import StopOnServerError
from whileai.loop.sources.sync import PushWeights

ROOT = Path(whileai.loop.__file__).parent
RANK = {"types": 0, "step": 1, "sources": 3, "plan": 4, "hooks": 5, "core": 6, "auto": 7, "run": 8,
        "controls": 9, "judge": 9, "__init__": 10}
ROOMS = ("sources", "plan", "hooks")  # the packages
ALLOWED = {("plan", "whileai.loop.hooks.teacher")}  # the checks run the teacher's own check before anything loads


def room(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else "__init__"


def imports(path: Path) -> list[str]:
    """The whileai.loop modules ``path`` imports at run time (module level or in a function)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("whileai.loop") \
                and id(node) not in typing_only:
            module = node.module or ""
            out += [f"{module}.{a.name}" for a in node.names] if room(module) in ("__init__", *ROOMS) \
                and module.count(".") <= 2 else [module]
    return out


def upward() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        me = room("whileai." + ".".join(path.relative_to(ROOT.parent).with_suffix("").parts))
        for target in imports(path):
            if target == "whileai.loop" or room(target) not in RANK:
                continue
            if RANK[room(target)] > RANK[me] and (me, target) not in ALLOWED:
                found.append(f"{path.relative_to(ROOT)} imports {target}")
    return found


def test_every_room_imports_only_the_rooms_below_it():
    assert RANK.keys() >= {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
                           if p.suffix == ".py" or (p / "__init__.py").is_file()}  # every room is ranked
    assert upward() == []


def test_the_checker_sees_an_upward_import(tmp_path: Path, monkeypatch):
    fake = tmp_path / "loop"
    (fake / "sources").mkdir(parents=True)
    (fake / "sources" / "bad.py").write_text("from whileai.loop.hooks.context import Context\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    assert upward() == ["sources/bad.py imports whileai.loop.hooks.context"]


def test_every_hook_is_a_hook_so_the_loop_calls_each_point_without_looking():
    for hook in (WarmStart, HeldOut, TraceHook, PreflightHook, TeacherHook, Record, Checkpoints, PushWeights,
                 FeedHook, StopOnServerError):
        assert issubclass(hook, types.Hook), hook
    assert "hasattr" not in (ROOT / "core.py").read_text()
