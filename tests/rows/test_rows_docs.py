"""The examples in docs/rows.md run: the Python block as written, every `wai` line of the bash block."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from whileai.cli.rows_cmd import main

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "rows.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S)


def test_python_example_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    (code,) = _blocks("python")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/rows.md", "exec"), {})
    text = out.getvalue()
    assert "pass@1 0.509 [0.400, 0.618] over 40 tasks" in text  # the numbers the comments quote
    assert "\n163 157\n" in text
    assert "select(mode='rl'): kept 248 of 320 rows" in text and "\n0.875\n" in text
    assert "route: grpo  (branch: grpo)" in text and "strong teacher" in text


@pytest.mark.parametrize("line", [ln for ln in _blocks("bash")[0].splitlines() if ln.startswith("wai ")])
def test_cli_example_runs(line, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    argv = [a.replace("/tmp/", f"{tmp_path}/") for a in shlex.split(line)[1:]]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0
