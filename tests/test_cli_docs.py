"""docs/cli.md cannot drift: every `$ wai ...` example there is run again through `whileai.cli.main`.

Each ```console block is one command and its documented output. The test runs the command in a fresh
folder that sees the repository's `examples/` (so `--out` files land in the temporary folder) and checks
that the documented lines appear in the real output, in order: a line that is only `...` stands for
lines left out, and `...` inside a line stands for any text. The exit status must be 2 when the
documented output is an error line (`wai CMD: ...`) and 0 otherwise.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from whileai.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "cli.md"


def examples() -> list[tuple[str, list[str]]]:
    blocks = re.findall(r"```console\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    out = []
    for block in blocks:
        first, *rest = block.rstrip("\n").split("\n")
        assert first.startswith("$ wai"), f"docs/cli.md: a console block must start with '$ wai': {first!r}"
        out.append((first[2:], rest))
    return out


def matches(documented: str, actual: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in documented.split("..."))
    return re.fullmatch(pattern, actual) is not None


def in_order(documented: list[str], actual: list[str]) -> str | None:
    """The first documented line missing from ``actual`` (after the previous one matched), or None."""
    position = 0
    for line in documented:
        if line.strip() == "...":
            continue
        while position < len(actual) and not matches(line, actual[position]):
            position += 1
        if position == len(actual):
            return line
        position += 1
    return None


EXAMPLES = examples()


def test_every_subcommand_has_an_example():
    parser = build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    shown = {shlex.split(command)[1] for command, _ in EXAMPLES if len(shlex.split(command)) > 1}
    assert commands <= shown, f"docs/cli.md has no example for: {sorted(commands - shown)}"


def test_docs_trimmed_lines_are_real_matches():
    """The matcher itself: '...' inside a line is a wildcard, lines must come in order."""
    assert matches("a ... c", "a b c") and not matches("a ... c", "a b d")
    assert in_order(["x", "...", "z"], ["x", "y", "z"]) is None
    assert in_order(["z", "x"], ["x", "y", "z"]) == "x"


@pytest.mark.parametrize("command,documented", EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_documented_command_prints_what_the_doc_says(command, documented, tmp_path, monkeypatch, capsys):
    (tmp_path / "examples").symlink_to(REPO / "examples")
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(command)[1:]
    try:
        status = main(argv)
    except SystemExit as done:  # --help
        status = int(done.code or 0)
    captured = capsys.readouterr()
    actual = (captured.out + captured.err).rstrip("\n").split("\n")
    actual = [line.rstrip() for line in actual]
    error = bool(documented) and re.match(r"wai [\w-]+: ", documented[0]) is not None
    assert status == (2 if error else 0), f"{command}: exit {status}\n{captured.out}{captured.err}"
    if error:
        assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    missing = in_order(documented, actual)
    assert missing is None, f"{command}: documented line not in the output (or out of order):\n{missing}\n" \
                            f"--- actual output ---\n" + "\n".join(actual)
