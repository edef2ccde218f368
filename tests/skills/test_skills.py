"""The skills for coding agents: every code block runs and prints what the skill shows (scripts/check_skills.py),
the checker itself catches drift, every skill has front matter an agent can index, and `wai skills` lists and
installs them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from whileai.cli import main
from whileai.cli.skills_cmd import available, front_matter, skills_dir

ROOT = Path(__file__).resolve().parents[2]
SIBLINGS = ("audit-your-judge", "dpo-pairs", "grpo-verifier", "pick-a-method", "sft-from-traces",
            "stale-rollouts", "strengthen-your-evals")


def _checker():
    spec = importlib.util.spec_from_file_location("check_skills", ROOT / "scripts" / "check_skills.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_skills"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check_skills = _checker()
FILES = [*check_skills.skill_files(), ROOT / "docs" / "skills.md"]


# ----------------------------------------------------------------------------- every block of every skill
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.parent.name if p.name == "SKILL.md" else p.name)
def test_every_fast_block_runs_and_prints_what_the_skill_shows(path):
    ran = check_skills.check(path)
    assert ran, f"{path} has no block the check runs"


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.parent.name if p.name == "SKILL.md" else p.name)
def test_every_block_including_the_slow_ones(path):
    check_skills.check(path, slow=True)


# ----------------------------------------------------------------------------- the checker can fail
def _skill(tmp_path: Path, body: str) -> Path:
    folder = tmp_path / "skills" / "demo"
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "data" / "x.txt").write_text("fixture\n")
    path = folder / "SKILL.md"
    path.write_text(body)
    return path


def _check(tmp_path, monkeypatch, body, **kw):
    monkeypatch.setattr(check_skills, "SKILLS", tmp_path / "skills")
    return check_skills.check(_skill(tmp_path, body), **kw)


def test_shown_output_that_differs_fails(tmp_path, monkeypatch):
    body = "```python\nprint(open('data/x.txt').read().strip(), 1 + 1)\n```\n\n```text\nfixture 3\n```\n"
    with pytest.raises(check_skills.Failure, match="the output differs"):
        _check(tmp_path, monkeypatch, body)
    assert _check(tmp_path, monkeypatch, body.replace("fixture 3", "fixture 2"))  # the fixture was read


def test_a_block_that_raises_fails_and_names_its_line(tmp_path, monkeypatch):
    body = "# demo\n\n```python\nx = 1\n```\n\n```python\nraise ValueError('nope')\n```\n"
    with pytest.raises(check_skills.Failure, match=r"(?s)demo/SKILL.md:7 raised.*SKILL.md\", line 8.*ValueError: nope"):
        _check(tmp_path, monkeypatch, body)


def test_blocks_share_a_namespace_and_console_output_and_status_are_checked(tmp_path, monkeypatch):
    ok = ("```python\nanswer = 42\n```\n```python\nprint(answer)\n```\n```text\n42\n```\n"
          "```console\n$ wai skills install here\ncopied 7 skills to here: ...\n...\n```\n")
    assert len(_check(tmp_path, monkeypatch, ok)) == 3
    wrong_status = "```console\n$ wai report missing.jsonl\n...\n```\n"
    with pytest.raises(check_skills.Failure, match="exited 2 \\(expected 0\\)"):
        _check(tmp_path, monkeypatch, wrong_status)
    error = "```console\n$ wai report missing.jsonl\nwai report: missing.jsonl: no such file. ...\n```\n"
    assert _check(tmp_path, monkeypatch, error)


def test_slow_and_skip_marks(tmp_path, monkeypatch):
    body = ("<!-- check: slow -->\n```python\nraise SystemExit('slow ran')\n```\n"
            "<!-- check: skip needs the network -->\n```console\n$ pip install whileai\n```\n")
    assert _check(tmp_path, monkeypatch, body) == []
    with pytest.raises(BaseException, match="slow ran"):
        _check(tmp_path, monkeypatch, body, slow=True)
    with pytest.raises(ValueError, match="unknown check mark 'later'"):
        _check(tmp_path, monkeypatch, "<!-- check: later -->\n```python\npass\n```\n")


@pytest.mark.parametrize(("shown", "actual", "ok"), [
    ("a\nb", "a\nb\n\n", True),
    ("a\n...\nd", "a\nb\nc\nd", True),
    ("a\n...\nd", "a\nd", True),          # ... may stand for no line at all
    ("run dir ... done", "run dir /tmp/x done", True),
    ("run dir ... done", "run dir /tmp/x\ndone", False),  # ... inside a line stays on the line
    ("a\nb", "a\nb\nc", False),           # a line printed but not shown fails
    ("0.712", "0.713", False),
])
def test_elision_rules(shown, actual, ok):
    assert check_skills.matches(shown, actual) is ok


# ----------------------------------------------------------------------------- front matter
@pytest.mark.parametrize("name", SIBLINGS)
def test_each_skill_has_front_matter_an_agent_can_index(name):
    import yaml

    path = ROOT / "skills" / name / "SKILL.md"
    text = path.read_text()
    parsed = yaml.safe_load(text.split("---\n")[1])
    ours = front_matter(path)
    assert parsed["name"] == ours["name"] == name
    assert parsed["metadata"]["version"] == ours["version"] and ours["version"].count(".") == 2
    assert " ".join(parsed["description"].split()) == ours["description"] and len(ours["description"]) > 100
    for heading in ("**Use it**", "**Don't use it**", "## What the output should look like"):
        assert heading in text, f"{name}: no {heading!r}"
    assert "../README.md" in text


def test_front_matter_problems_are_named(tmp_path):
    bad = tmp_path / "SKILL.md"
    bad.write_text("# no front matter\n")
    with pytest.raises(ValueError, match="no front matter"):
        front_matter(bad)
    bad.write_text("---\nname: x\n---\n")
    with pytest.raises(ValueError, match="lacks description, version"):
        front_matter(bad)


# ----------------------------------------------------------------------------- wai skills
def test_list_names_every_skill_with_its_version(capsys):
    assert [s.name for s in available()] == list(SIBLINGS)
    assert main(["skills", "list"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name} 1.0.0\n" in out for name in SIBLINGS)
    assert out.rstrip().endswith(f"7 skills in {skills_dir()}; install them with: wai skills install DIR")


def test_install_copies_refuses_to_overwrite_and_replaces_with_force(tmp_path, capsys):
    target = tmp_path / "agent" / "skills"
    assert main(["skills", "install", str(target)]) == 0
    assert f"copied 7 skills to {target}: audit-your-judge, dpo-pairs" in capsys.readouterr().out
    for name in SIBLINGS:
        assert (target / name / "SKILL.md").read_bytes() == (ROOT / "skills" / name / "SKILL.md").read_bytes()
    assert (target / "README.md").is_file() and (target / "pick-a-method" / "data" / "rows.jsonl").is_file()
    (target / "dpo-pairs" / "SKILL.md").write_text("edited by hand")
    assert main(["skills", "install", str(target)]) == 2
    err = capsys.readouterr().err
    assert "already holds audit-your-judge" in err and "nothing was copied. Add --force" in err
    assert (target / "dpo-pairs" / "SKILL.md").read_text() == "edited by hand"
    assert main(["skills", "install", str(target), "--force"]) == 0
    assert (target / "dpo-pairs" / "SKILL.md").read_bytes() == (ROOT / "skills/dpo-pairs/SKILL.md").read_bytes()


@pytest.mark.slow
def test_a_built_wheel_carries_every_skill_file(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("whileai-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    source = {f"whileai/skills/{p.relative_to(ROOT / 'skills')}" for p in (ROOT / "skills").rglob("*")
              if p.is_file() and "__pycache__" not in p.parts}
    assert source and source <= inside, sorted(source - inside)
