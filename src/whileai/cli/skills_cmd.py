"""`wai skills`: the skills for coding agents that ship with whileai: list them, or copy them into an agent's
skills folder.

    wai skills list                          name, version and description of every skill
    wai skills install ~/.claude/skills      copy every skill (and the README they end with) there
    wai skills install DIR --force           replace skills already there

A skill is a folder with a SKILL.md (front matter: name, description, metadata.version) and the fixture data
its code blocks read. The source of truth is skills/ in the repository; the package carries it as
whileai/skills (docs/skills.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whileai.errors import ConfigError

SHARED = ("README.md", "data")  # beside the skills: the README every skill ends with, and the data it reads


@dataclass(frozen=True)
class Skill:
    """One skill folder and its front matter."""

    name: str
    version: str
    description: str
    path: Path


def skills_dir() -> Path:
    """Where the installed package keeps its skills."""
    return Path(__file__).resolve().parents[1] / "skills"  # whileai/cli/skills_cmd.py -> whileai/skills


def front_matter(path: Path) -> dict[str, str]:
    """name, description and version from a SKILL.md's front matter (the subset of YAML the skills use:
    `key: value`, a folded `key: >` block, and `metadata:` with an indented `version:`)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    if not lines or lines[0].strip() != "---" or "---" not in [x.strip() for x in lines[1:]]:
        raise ConfigError(f"{path}: no front matter; a SKILL.md starts with '---', then name, description and "
                          "metadata.version, then '---'")
    block = lines[1:1 + [x.strip() for x in lines[1:]].index("---")]
    found: dict[str, str] = {}
    key = None
    for line in block:
        if line.startswith("  ") and key is not None:  # a continued value, or metadata's fields
            name, sep, value = line.strip().partition(":")
            if key == "metadata" and sep:
                found[name.strip()] = value.strip().strip('"')
            else:
                found[key] = f"{found.get(key, '')} {line.strip()}".strip()
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        found[key] = "" if value in (">", "|") else value.strip('"')
    missing = [k for k in ("name", "description", "version") if not found.get(k)]
    if missing:
        raise ConfigError(f"{path}: front matter lacks {', '.join(missing)}; give name, description and "
                          "metadata.version")
    return found


def available(root: Path | None = None) -> list[Skill]:
    """Every skill under ``root`` (default: the package's), sorted by name."""
    root = root or skills_dir()
    if not root.is_dir():
        raise ConfigError(f"no skills folder at {root}: this install of whileai lacks its skills; reinstall it "
                          "(pip install whileai, or pip install -e . from the repository)")
    out = []
    for path in sorted(root.glob("*/SKILL.md")):
        meta = front_matter(path)
        out.append(Skill(meta["name"], meta["version"], meta["description"], path.parent))
    return out


def install(target: Path | str, force: bool = False, root: Path | None = None) -> list[str]:
    """Copy every skill, the README and the shared data into ``target``; the names copied, in order.
    Refuses, naming every clash, when something is already there and ``force`` is false."""
    target = Path(target).expanduser()
    root = root or skills_dir()
    names = [s.path.name for s in available(root)] + [n for n in SHARED if (root / n).exists()]
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{target} is a file, not a folder: give the folder a coding agent reads skills from")
    clashes = [n for n in names if (target / n).exists()]
    if clashes and not force:
        raise ConfigError(f"{target} already holds {', '.join(clashes)}; nothing was copied. Add --force to "
                          "replace them, or pick another folder")
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        source, dest = root / name, target / name
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        elif dest.exists() or dest.is_symlink():
            dest.unlink()
        if source.is_dir():
            shutil.copytree(source, dest)
        else:
            shutil.copy2(source, dest)
    return names


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("skills", help="list the skills for coding agents, or install them into a folder",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="skills_command", metavar="ACTION", required=True,
                         help="list: show every skill; install DIR: copy them into a folder")
    listing = sub.add_parser("list", help="name, version and description of every skill")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a listing")
    listing.set_defaults(func=cmd_list)
    put = sub.add_parser("install", help="copy every skill into DIR (a coding agent's skills folder)")
    put.add_argument("dir", type=Path, metavar="DIR", help="the folder to copy into (created if missing)")
    put.add_argument("--force", action="store_true", help="replace skills already in DIR")
    put.set_defaults(func=cmd_install)


def cmd_list(args: argparse.Namespace) -> int:
    skills = available()
    if args.json:
        print(json.dumps([{"name": s.name, "version": s.version, "description": s.description,
                           "path": str(s.path)} for s in skills], indent=2))
        return 0
    for s in skills:
        print(f"{s.name} {s.version}")
        print(textwrap.fill(_first_sentence(s.description), 100, initial_indent="  ", subsequent_indent="  "))
    print(f"{len(skills)} skills in {skills_dir()}; install them with: wai skills install DIR")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    names = install(args.dir, force=args.force)
    skills = [n for n in names if n not in SHARED]
    print(f"copied {len(skills)} skills to {args.dir}: {', '.join(skills)}")
    print(f"  and {' and '.join(n for n in names if n in SHARED)} (the checks every skill ends with, and their data)")
    return 0


def _first_sentence(text: str) -> str:
    head, dot, _ = text.partition(". ")
    return head + ("." if dot else "")
