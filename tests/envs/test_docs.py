"""docs/tasksets.md cannot drift: every ```python block runs (in a fresh folder), and a plain ``` block
right after one is the output it must print, exactly."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "tasksets.md"
EXTRAS = ("datasets", "math_verify", "reasoning_gym")


def blocks() -> list[tuple[str, str | None]]:
    """(code, expected output or None) for each python block."""
    found = re.findall(r"```(\w*)\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    out = []
    for i, (lang, body) in enumerate(found):
        if lang == "python":
            follows = found[i + 1] if i + 1 < len(found) else None
            out.append((body, follows[1] if follows and follows[0] == "" else None))
    return out


@pytest.mark.parametrize(("code", "expected"), blocks())
def test_doc_block_runs_and_prints_what_the_page_says(code, expected, tmp_path, monkeypatch):
    for extra in EXTRAS:
        if re.search(rf"\b{extra}\b", code) and importlib.util.find_spec(extra) is None:
            pytest.skip(f"needs {extra}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # blocks may add "." for their own grader module
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(DOC), "exec"), {"__name__": "doc_block"})
    sys.modules.pop("my_graders", None)
    if expected is not None:
        assert printed.getvalue() == expected


def test_page_has_the_examples():
    assert len(blocks()) >= 5
