"""Package-level promises: import cost, the README's code runs, every public name resolves."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import whileai

ROOT = Path(__file__).resolve().parents[1]


def test_import_does_not_import_torch():
    code = "import sys, whileai, whileai.methods, whileai.rows; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_sub_packages_resolve_on_first_touch_without_torch():
    """`wai.methods.ReinforceAda` and friends right after `import whileai as wai`, in a fresh interpreter;
    none of them but the engine imports torch, and the engine resolves too."""
    code = ("import sys, whileai as wai\n"
            "print(wai.methods.ReinforceAda.__name__, wai.rows.__name__, wai.prime_rl.__name__, "
            "wai.simulations.__name__)\n"
            "print('torch' in sys.modules)\n"
            "print(wai.engine.__name__, 'methods' in dir(wai), 'engine' in dir(wai))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["ReinforceAda whileai.rows whileai.prime_rl whileai.simulations", "False",
                                       "whileai.engine True True"]
    assert {"methods", "rows", "engine", "prime_rl", "simulations"} <= whileai._SUBPACKAGES
    assert "nope" not in dir(whileai) and not hasattr(whileai, "nope")


def test_every_exported_name_resolves():
    for name in whileai._EXPORTS:
        assert getattr(whileai, name) is not None, name


def test_readme_python_block_runs_and_prints_the_report():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python block"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md", "exec"), {})
    printed = out.getvalue().splitlines()
    assert printed[0] == "FlashReinforce(trust=0.003, off_policy_steps=8, temperature=1.0, max_tokens=8192)"
    assert printed[1] == "flash_reinforce update: 3 of 4 trajectories admitted"
    assert "  mean ratio: 0.9906" in printed


def test_readme_commands_pin_the_cpu_torch_build():
    text = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    assert len(commands) == 2
    assert all("torch==2.13.0" in c for c in commands)
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = commands[1].split("&&")[-1].strip()
    assert test_command in ci
