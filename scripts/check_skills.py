"""Run every code block of every skill offline and fail on an error or on output that differs from the shown one.

    python scripts/check_skills.py                  # every skill, fast blocks only
    python scripts/check_skills.py --slow           # also the blocks marked slow
    python scripts/check_skills.py dpo-pairs        # one skill (a folder name under skills/)

The conventions a skill's markdown follows (docs/skills.md):

* A ```python block runs in the skill's own namespace, shared with the skill's earlier python blocks, in a
  fresh temporary folder holding a copy of the skill's files (so ``data/rows.jsonl`` reads its fixture).
  The ```text block right after it, if any, is what the block must print.
* A ```console block holds commands (``$ wai ...``), each followed by what it prints (stdout and stderr).
  A command must exit 0 unless its shown output is an error (a first line ``wai CMD: ...``), then 2. A plain
  ``wai`` command runs in this process through ``whileai.cli.main`` (the function the ``wai`` script calls);
  one with shell syntax (pipes, ``&&``, ``$VAR``) runs in bash.
* In shown output, a line that is only ``...`` stands for any number of lines, and ``...`` inside a line
  for any text on that line (timings, run directories). Trailing spaces and blank lines at the end are
  ignored; everything else must match exactly.
* ``<!-- check: slow -->`` on the line before a block runs it only with ``--slow``; ``<!-- check: skip REASON
  -->`` never runs it (REASON says why, e.g. it installs from the network).

Blocks run in the order the file shows them; a skill stops at its first failure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

SKILLS = Path(__file__).resolve().parents[1] / "skills"
FENCE = re.compile(r"(?:<!-- check: (?P<mark>[^>]*?) -->\n)?```(?P<lang>[a-z]*)\n(?P<body>.*?)```\n?", re.S)
RUNS = ("python", "console")


@dataclass
class Block:
    """One fenced block of a skill: its language, text, line number, check mark, and the output it shows."""

    lang: str
    body: str
    line: int
    mark: str = ""
    shown: str | None = None

    @property
    def slow(self) -> bool:
        return self.mark == "slow"

    @property
    def skip(self) -> bool:
        return self.mark.startswith("skip")


def blocks(path: Path) -> list[Block]:
    """The runnable blocks of one markdown file, each with the ```text block that follows it."""
    text = path.read_text(encoding="utf-8")
    found: list[Block] = []
    previous_end = -1
    for match in FENCE.finditer(text):
        lang, mark = match["lang"], (match["mark"] or "").strip()
        line = text.count("\n", 0, match.start("lang")) + 1
        if mark and mark != "slow" and not mark.startswith("skip "):
            raise ValueError(f"{path}:{line}: unknown check mark {mark!r}; use 'slow' or 'skip REASON'")
        if lang == "text" and found and found[-1].lang == "python" and not text[previous_end:match.start()].strip():
            found[-1].shown = match["body"]
        elif lang in RUNS:
            found.append(Block(lang, match["body"], line, mark))
        previous_end = match.end()
    return found


def matches(shown: str, actual: str) -> bool:
    """Whether ``actual`` is what ``shown`` shows (``...`` elides; trailing whitespace ignored)."""
    pattern = ""
    for line in _lines(shown):
        if line.strip() == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += r"[^\n]*?".join(re.escape(part) for part in line.split("...")) + r"\n"
    return re.fullmatch(pattern, "".join(line + "\n" for line in _lines(actual))) is not None


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def console_commands(body: str) -> list[tuple[str, str]]:
    """(command, shown output) pairs of a console block."""
    out: list[tuple[str, list[str]]] = []
    for line in body.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif not out:
            raise ValueError(f"a console block must start with '$ COMMAND', not {line!r}")
        else:
            out[-1][1].append(line)
    return [(command, "\n".join(shown)) for command, shown in out]


class Failure(Exception):
    """A block failed: it raised, exited wrongly, or printed something other than what the skill shows."""


def run_python(block: Block, namespace: dict, where: str) -> str:
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            # padded so a traceback names the line of the markdown file
            exec(compile("\n" * block.line + block.body, where.rsplit(":", 1)[0], "exec"), namespace)
    except Exception:
        raise Failure(f"{where} raised:\n{traceback.format_exc(limit=-3)}\nprinted:\n{buffer.getvalue()}") from None
    if block.shown is not None and not matches(block.shown, buffer.getvalue()):
        raise Failure(_differs(where, block.shown, buffer.getvalue()))
    return buffer.getvalue()


def run_console(block: Block, where: str) -> str:
    printed = ""
    for command, shown in console_commands(block.body):
        code, actual = _wai(command) if _plain_wai(command) else _shell(command)
        error = shown.startswith("wai ") and ":" in shown.split("\n")[0]
        if code != (2 if error else 0):
            raise Failure(f"{where}: `{command}` exited {code} (expected {2 if error else 0}):\n{actual}")
        if shown.strip() and not matches(shown, actual):
            raise Failure(_differs(f"{where}: `{command}`", shown, actual))
        printed += f"$ {command}\n{actual}"
    return printed


def _plain_wai(command: str) -> bool:
    """A `wai` command with no shell syntax: it runs in this process (the same `main` the script calls)."""
    return command.startswith("wai ") and not re.search(r"[|&;<>$`()*?~]", command)


def _wai(command: str) -> tuple[int, str]:
    from whileai.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(shlex.split(command)[1:])
        except SystemExit as stop:  # argparse's usage errors and --help
            code = stop.code if isinstance(stop.code, int) else 2
    return code, out.getvalue()


def _shell(command: str) -> tuple[int, str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(command, shell=True, capture_output=True, text=True, env=env)
    return done.returncode, done.stdout + done.stderr


def _differs(where: str, shown: str, actual: str) -> str:
    return f"{where}: the output differs from the one the skill shows.\n--- shown\n{shown}\n--- printed\n{actual}"


def check(path: Path, slow: bool = False, verbose: bool = False) -> list[str]:
    """Run every block of one markdown file in a fresh folder with the skill's files; what ran, in order.
    Raises ``Failure`` at the first block that fails."""
    ran: list[str] = []
    namespace: dict = {"__name__": "__skill__"}
    previous = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="skill-") as folder:
        shutil.copytree(path.parent, folder, dirs_exist_ok=True)
        os.chdir(folder)
        try:
            for block in blocks(path):
                where = f"{path.relative_to(SKILLS.parent)}:{block.line}"
                if block.skip or (block.slow and not slow):
                    continue
                began = time.perf_counter()
                printed = run_python(block, namespace, where) if block.lang == "python" else run_console(block, where)
                ran.append(f"{where} ({block.lang}, {time.perf_counter() - began:.1f} s)")
                if verbose:
                    print(f"--- {where} printed:\n{printed}", flush=True)
        finally:
            os.chdir(previous)
    return ran


def skill_files() -> list[Path]:
    """skills/README.md, then every skills/*/SKILL.md."""
    return [SKILLS / "README.md", *sorted(SKILLS.glob("*/SKILL.md"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="skill folder names (default: all, and skills/README.md)")
    parser.add_argument("--slow", action="store_true", help="also run the blocks marked slow")
    parser.add_argument("--verbose", action="store_true", help="print what every block printed")
    args = parser.parse_args(argv)
    files = [SKILLS / n / "SKILL.md" for n in args.names] if args.names else skill_files()
    failed = 0
    for path in files:
        try:
            for line in check(path, slow=args.slow, verbose=args.verbose):
                print(f"ok  {line}")
        except (Failure, ValueError) as err:
            failed += 1
            print(f"FAIL {err}")
    print(f"{len(files) - failed} of {len(files)} skill files pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
