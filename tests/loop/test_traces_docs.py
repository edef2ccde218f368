"""docs/traces.md cannot drift: its python blocks run in order (one namespace, a fresh folder) and print
exactly the plain block that follows each; each JSON example line is read as a valid trace of its format."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from whileai.loop.sources.traces import load_vocab, scan

DOC = Path(__file__).resolve().parents[2] / "docs" / "traces.md"


def _blocks() -> list[tuple[str, str]]:
    return re.findall(r"```(\w*)\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_the_python_blocks_print_what_the_page_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    found = _blocks()
    namespace: dict[str, object] = {"__name__": "doc_block"}
    ran = 0
    for i, (lang, body) in enumerate(found):
        if lang != "python":
            continue
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(body, str(DOC), "exec"), namespace)
        ran += 1
        follows = found[i + 1] if i + 1 < len(found) else None
        if follows is not None and follows[0] == "":
            assert printed.getvalue() == follows[1]
    assert ran >= 2


def test_every_json_example_is_a_valid_trace_of_its_format(tmp_path: Path):
    examples = [body for lang, body in _blocks() if lang == "json"]
    vocab = load_vocab("builtin:tiny")
    formats = []
    for k, body in enumerate(examples):
        path = tmp_path / f"example{k}.jsonl"
        path.write_text(body)
        source = scan(path, vocab, trace=True)
        assert source.n == 1
        formats.append(source.fmt)
    assert formats == ["whileai", "openai", "openai", "text"]
