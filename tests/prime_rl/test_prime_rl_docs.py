"""The examples in docs/prime-rl.md run: every python block, and every `wai prime-rl` line through main(argv)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from whileai.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "prime-rl.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_python_examples_run(index: int, capsys) -> None:
    exec(compile(_blocks("python")[index], f"{DOC.name}[python {index}]", "exec"), {})


def test_command_line_examples_run(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    commands = [line for block in _blocks("sh") for line in block.replace("\\\n", " ").splitlines()
                if line.startswith("wai prime-rl")]
    assert len(commands) == 3
    for command in commands:
        assert main(shlex.split(command)[1:]) == 0, command
    assert (tmp_path / "rl.toml").exists()
