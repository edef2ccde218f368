"""``whileai.trainers`` sits below the loop and the server that use it (docs/decisions.md, "Layout"): none of its
modules imports ``whileai.loop`` or ``whileai.service`` (the ``wai serve`` client is one of the trainers,
``trainers/wai_client.py``); the Tinker SDK's clients are named in one module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import whileai.trainers

ROOT = Path(whileai.trainers.__file__).parent
SRC = ROOT.parent


def imported(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_trainers_import_neither_the_loop_nor_the_service():
    found = {f"{p.name} imports {m}" for p in ROOT.glob("*.py") for m in imported(p)
             if m.startswith(("whileai.loop", "whileai.service"))}
    assert found == set()


def names(path: Path) -> set[str]:
    """The names ``path``'s code uses (not its strings and docstrings): variables, attributes, imported names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            found.update(a.name for a in node.names)
    return found


def test_the_tinker_sdk_is_wrapped_once():
    """Only the trainer names the SDK's clients (its session, training and sampling clients); ``wai serve
    --tinker-url`` opens that trainer (the server's own Tinker front reads the SDK's wire types only)."""
    clients = {"ServiceClient", "TrainingClient", "SamplingClient", "create_lora_training_client"}
    users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if names(p) & clients)
    assert users == ["trainers/tinker.py"]
    assert "new_run" in names(SRC / "service" / "provider.py")


def test_the_plan_names_a_trainer_backend_from_its_api_name():
    """A new --api backend is named in the run plan without an edit to the plan (its title, or its name)."""
    from whileai.trainers.open import title

    assert title("tinker", "http://h:1") == "Tinker API at http://h:1"
    assert title("wai", "http://h:1") == "wai serve at http://h:1"
    assert title("loopback", "loop://here") == "loopback at loop://here"
    assert title("wai", None) == "in-process"
