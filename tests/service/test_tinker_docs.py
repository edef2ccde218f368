"""docs/tinker.md cannot drift: its SDK script runs against a real `wai serve` and prints the doc's output.

The doc's model directory is `TrainingEngine("builtin:tiny").export(DIR, merged=True)`; the test writes the same
directory, serves it, runs the script from the doc (only the URL changed) and compares every printed line but
the first (which names the directory).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")

from whileai.service.launch import start_server  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "tinker.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.slow  # about 20 s: a server, an SDK session and 20 steps
def test_the_sdk_script_in_the_doc_prints_the_doc_output(tmp_path: Path) -> None:
    from whileai.engine import TrainingEngine

    model = TrainingEngine("builtin:tiny").export(str(tmp_path / "model"), merged=True)
    script, expected = blocks("python")[0], blocks("text")[0]
    token = "tml-docs-0123456789abcdef"
    with start_server(tmp_path / "data", token=token, args=["--model", model]) as server:
        (tmp_path / "script.py").write_text(script.replace("http://127.0.0.1:8321", server.url))
        env = {**os.environ, "TINKER_API_KEY": token, "MODEL": model}
        out = subprocess.run([sys.executable, str(tmp_path / "script.py")], capture_output=True, text=True,
                             env=env, timeout=300, check=True)
    printed = out.stdout.splitlines()
    assert printed[0] == repr([model])
    assert printed[1:] == expected.splitlines()[1:]
