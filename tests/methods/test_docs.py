"""docs/methods.md: its defaults tables are DEFAULTS, and its Python example runs."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from whileai.cli.methods_cmd import render_tables
from whileai.methods.defaults import DEFAULTS

DOC = Path(__file__).resolve().parents[2] / "docs" / "methods.md"


def test_defaults_tables_match_the_defaults_table():
    text = DOC.read_text(encoding="utf-8")
    assert text == render_tables(text), "run: python docs/gen_methods_tables.py"
    documented = set(re.findall(r"<!-- defaults:(\w+) -->", text))
    assert documented == set(DEFAULTS), sorted(set(DEFAULTS) ^ documented)


def test_python_example_runs():
    code = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), {})
    # z = 0.1 * ((-0.4 + 0.5) - (-1.1 + 1.0)) = 0.02; c = 0.1 * sigmoid(-0.02) = 0.1 * 0.4950002 = 0.04950002
    assert "[0.04950002 0.04950002]" in out.getvalue()
    assert "the student's starting weights, frozen" in out.getvalue()


def test_shell_examples_run(tmp_path, monkeypatch, capsys):
    """Every `wai ...` line of the docs' bash block runs (in a scratch copy of examples/) and exits 0."""
    import shlex
    import shutil

    from whileai.cli import main

    block = re.findall(r"```bash\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)[0]
    (tmp_path / "examples").mkdir()
    shutil.copy(DOC.parents[1] / "examples" / "traces.jsonl", tmp_path / "examples" / "traces.jsonl")
    monkeypatch.chdir(tmp_path)
    commands = [shlex.split(line.split("#")[0]) for line in block.splitlines() if line.startswith("wai ")]
    assert len(commands) == 5
    for argv in commands:
        assert main(argv[1:]) == 0, argv
    out = capsys.readouterr().out
    assert "flash_reinforce update: 3 of 4 trajectories admitted" in out
    assert (tmp_path / "coefficients.jsonl").read_text().count("\n") == 4
    assert '"baselines"' in (tmp_path / "rae_state.json").read_text()
