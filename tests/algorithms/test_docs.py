"""docs/algorithms.md cannot drift: its Python blocks run, its table has every algorithm with the loss its
module sends, and its in-process `wai loop` example prints what the page shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from whileai.algorithms import ALGORITHMS
from whileai.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"
TEXT = DOC.read_text(encoding="utf-8")


def test_table_lists_every_algorithm_with_its_loss():
    for name, algo in ALGORITHMS.items():
        row = next((line for line in TEXT.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"docs/algorithms.md has no row for {name}"
        assert row.split("|")[2].strip() == f"`{algo.loss}`", (name, row)


@pytest.mark.slow
def test_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
    assert len(blocks) == 2, "docs/algorithms.md lost an example"
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})


@pytest.mark.slow
def test_in_process_wai_loop_example_prints_the_page(capsys):
    block = next(b for b in re.findall(r"```console\n(.*?)```", TEXT, flags=re.S) if "--serve" not in b)
    command, *documented = block.rstrip("\n").split("\n")
    assert main(command.split()[2:]) == 0
    assert capsys.readouterr().out.rstrip("\n").split("\n") == documented
