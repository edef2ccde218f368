"""Package-level promises: import cost, the README's code runs, every public name resolves."""

from __future__ import annotations

import ast
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


def _facade_imports(path: Path, src: Path = ROOT / "src") -> list[str]:
    """`line: statement` for every import of the `whileai` facade itself in one source file (relative imports
    resolved against the file's package under ``src``); `from whileai.x import y` and `import whileai.x` are not the
    facade."""
    package = ".".join(path.relative_to(src).with_suffix("").parts[:-1] if path.name != "__init__.py"
                       else path.relative_to(src).parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name == "whileai"]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            if module == "whileai":
                found.append(f"{node.lineno}: from {'.' * node.level}{node.module or ''} import "
                             + ", ".join(a.name for a in node.names))
    return found


def test_facade_import_check_sees_every_form(tmp_path):
    """The checker below flags the facade in each spelling, relative ones included, and nothing else."""
    probe = tmp_path / "whileai" / "cli" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("import whileai\nimport whileai as wai\nfrom whileai import train\nfrom .. import rows\n"
                     "import whileai.loop\nfrom whileai.loop import train\nfrom . import skills_cmd\n")
    assert _facade_imports(probe, tmp_path) == ["1: import whileai", "2: import whileai",
                                                "3: from whileai import train", "4: from .. import rows"]


def test_no_package_module_imports_the_facade():
    """Package code imports the module that defines a name, never `whileai` itself (only the facade's own
    __init__.py re-exports): the layering stays visible and no module depends on the whole package."""
    pkg = ROOT / "src" / "whileai"
    offenders = [f"{p.relative_to(ROOT)}:{hit}" for p in sorted(pkg.rglob("*.py")) if p != pkg / "__init__.py"
                 for hit in _facade_imports(p)]
    assert offenders == [], "import the defining module instead of the facade:\n" + "\n".join(offenders)
