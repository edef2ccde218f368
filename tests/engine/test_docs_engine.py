"""The examples in docs/engine.md run as written, and its tables match the code."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "engine.md"


def test_docs_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 3, "docs/engine.md lost an example"
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})


def test_loss_table_lists_every_loss_and_default():
    from whileai.engine import capabilities

    text = DOC.read_text()
    for name, cap in capabilities().items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        for key, spec in cap["config"].items():
            default = spec["default"]
            shown = f'"{default}"' if isinstance(default, str) else str(default)
            assert f"`{key}` ({shown}" in row, (name, key)
