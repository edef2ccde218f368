"""docs/algorithms.md cannot drift: its python blocks run (in a fresh folder), the CustomLoss example trains
through the one loop, and the page names no loop that no longer exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_the_page_has_its_example_and_names_only_live_loops():
    text = DOC.read_text(encoding="utf-8")
    assert python_blocks(), "docs/algorithms.md lost its CustomLoss example"
    for gone in ("rl_loop", "teacher_loop", "whileai.algorithms import"):
        assert gone not in text, f"docs/algorithms.md still names {gone!r}, which was removed"


@pytest.mark.parametrize("code", python_blocks())
def test_doc_block_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(DOC), "exec"), {"__name__": "doc_block"})
    assert (tmp_path / "median-run" / "summary.json").is_file()
