"""docs/service.md runs as written against a live server, and prints what the page says it prints.

The page's ```python blocks run in order in one namespace, with the page's address replaced by the test
server's and ``WAI_TOKEN`` set to its token. The ```text block after a python block is that block's
output: each line must appear in order; ``...`` inside a line matches any text (ids, timestamps).
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from whileai.service.launch import LocalServer

DOC = Path(__file__).resolve().parents[2] / "docs" / "service.md"
ADDRESS = "http://127.0.0.1:8321"


def blocks() -> list[tuple[str, list[str] | None]]:
    found = re.findall(r"```(python|text)\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    out: list[tuple[str, list[str] | None]] = []
    for kind, text in found:
        if kind == "python":
            out.append((text, None))
        elif out and out[-1][1] is None:
            out[-1] = (out[-1][0], text.rstrip("\n").split("\n"))
    return out


def matches(documented: str, actual: str) -> bool:
    return re.fullmatch(".*".join(re.escape(p) for p in documented.split("...")), actual) is not None


def test_the_matcher_is_strict():
    assert matches("a ... c", "a b c") and not matches("a ... c", "a b d") and not matches("a", "ab")


@pytest.mark.slow
def test_the_page_runs_and_prints_what_it_says(service: LocalServer, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("WAI_TOKEN", service.token)
    examples = blocks()
    assert len(examples) >= 3 and all(expected for _, expected in examples)
    namespace: dict = {}
    for code, expected in examples:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code.replace(ADDRESS, service.url), str(DOC), "exec"), namespace)
        actual = printed.getvalue().rstrip("\n").split("\n")
        position = 0
        for line in expected or []:
            while position < len(actual) and not matches(line, actual[position]):
                position += 1
            assert position < len(actual), f"docs/service.md: {line!r} not printed (in order) by:\n{code}\n" \
                                           f"--- printed ---\n" + "\n".join(actual)
            position += 1
