"""docs/cli.md cannot drift: every `$ wai ...` example there is run again through `whileai.cli.main`.

Each ```console block is one command and its documented output. The page writes files under `/tmp/wai/`
(`OUT`); the test runs each command in a fresh folder that sees the repository's `examples/`, with `OUT`
replaced by a temporary folder in the command and put back in the output, and checks that the documented
lines appear in the real output, in order: a line that is only `...` stands for
lines left out, and `...` inside a line stands for any text. The exit status must be 2 when the
documented output is an error (its first line `wai CMD: ...`, on stderr, with no traceback) and 0 otherwise.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from whileai.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "cli.md"
OUT = "/tmp/wai"  # where the page's examples write their files
WRITES = ("--out", "--state")  # the flags that name a file a command writes


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


def test_every_written_file_goes_to_the_temporary_folder():
    """A reader who copies an example never writes into the repository: every --out / --state is under OUT."""
    written = [argv[i + 1] for command, _ in EXAMPLES for argv in [shlex.split(command)]
               for i, arg in enumerate(argv[:-1]) if arg in WRITES]
    assert len(written) >= 7
    assert all(path.startswith(OUT + "/") for path in written), written


def test_docs_trimmed_lines_are_real_matches():
    """The matcher itself: '...' inside a line is a wildcard, lines must come in order."""
    assert matches("a ... c", "a b c") and not matches("a ... c", "a b d")
    assert in_order(["x", "...", "z"], ["x", "y", "z"]) is None
    assert in_order(["z", "x"], ["x", "y", "z"]) == "x"


@pytest.mark.parametrize("command,documented", EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_documented_command_prints_what_the_doc_says(command, documented, tmp_path, monkeypatch, capsys):
    (tmp_path / "examples").symlink_to(REPO / "examples")
    out = tmp_path / "wai"
    out.mkdir()
    monkeypatch.chdir(tmp_path)
    argv = [arg.replace(OUT, str(out)) for arg in shlex.split(command)[1:]]
    try:
        status = main(argv)
    except SystemExit as done:  # --help
        status = int(done.code or 0)
    captured = capsys.readouterr()
    actual = (captured.out + captured.err).replace(str(out), OUT).rstrip("\n").split("\n")
    actual = [line.rstrip() for line in actual]
    error = bool(documented) and re.match(r"wai [\w-]+: ", documented[0]) is not None
    assert status == (2 if error else 0), f"{command}: exit {status}\n{captured.out}{captured.err}"
    if error:  # the first line names the command and the error; more lines may list every problem
        assert captured.err.startswith(documented[0].split(":")[0] + ":") and "Traceback" not in captured.err, \
            captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["examples", "wai"], "a command wrote outside OUT"
    missing = in_order(documented, actual)
    assert missing is None, f"{command}: documented line not in the output (or out of order):\n{missing}\n" \
                            f"--- actual output ---\n" + "\n".join(actual)
