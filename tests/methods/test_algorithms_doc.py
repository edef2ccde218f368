"""docs/algorithms.md cannot drift: its table names every service-page algorithm with the loss its method sends,
its Python block runs, and its in-process `wai loop` example prints what the page shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import whileai as wai
from whileai.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"
TEXT = DOC.read_text(encoding="utf-8")
CLASSES = {name: getattr(wai.methods, name) for name in wai.methods.CLASSES}
SECTIONS = ("GRPO without standard deviation", "Length-normalized GRPO", "Dr.GRPO", "PPO", "CISPO", "GSPO", "DPPO",
            "DAPO", "SAPO", "RLOO", "REINFORCE++", "MaxRL", "OPD", "OPSD", "SDPO")


def test_table_has_every_section_with_the_loss_its_method_sends():
    rows = {line.split("|")[1].strip(): line.split("|") for line in TEXT.splitlines() if line.startswith("| ")}
    for section in SECTIONS:
        assert section in rows, f"docs/algorithms.md has no row for {section}"
        shown = rows[section][2].split("`")[1]  # a registry name, a class, or a class with options
        built = wai.method(shown) if shown in wai.method_names() else eval(shown, CLASSES)  # noqa: S307
        built = built() if isinstance(built, type) else built
        assert rows[section][3].strip() == f"`{built.run_spec().loss}`", section


@pytest.mark.slow
def test_python_block_runs():
    blocks = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
    assert len(blocks) == 1, "docs/algorithms.md lost its example"
    exec(compile(blocks[0], str(DOC), "exec"), {})


@pytest.mark.slow
def test_in_process_wai_loop_example_prints_the_page(capsys):
    block = re.findall(r"```console\n(.*?)```", TEXT, flags=re.S)[0]
    command, *documented = block.rstrip("\n").split("\n")
    assert main(command.split()[2:]) == 0
    assert capsys.readouterr().out.rstrip("\n").split("\n") == documented
