"""`wai update` and `wai methods`: run one method's update on a rows file, or list every method.

``wai update --method NAME rows.jsonl`` prints the update's report (``--json`` the whole Update as
JSON); ``--out FILE`` writes the coefficients, one JSON line per trajectory, to a temporary file that
replaces FILE only once it is complete; ``--state FILE`` carries a stateful method's state (RAE's
baselines) from one run to the next. An error about a row names its file line. ``--set key=value`` changes a knob (the value is read as JSON
when it parses, e.g. ``--set ratio=[0.5,5]``, else as a string). ``wai methods`` lists every method of the
one registry with each default and where it comes from, read from the one defaults table, then the names that
are a method with knobs set (``grpo_nostd``, ``grpo_len_norm``, ``sdpo``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import re
from pathlib import Path
from typing import Any

from whileai.errors import BatchError, ConfigError
from whileai.methods.base import REGISTRY, Method, Update
from whileai.methods.registry import ALIASES, method, method_names
from whileai.rows.io import atomic_write, check_output_path, load_rows


def register(subparsers: Any) -> None:
    names = method_names()
    update = subparsers.add_parser(
        "update", help="run one method's update on a rows file and print what it did",
        description="Validate the rows, run METHOD's update, and print its report (first line: "
                    "'<method> update: A of B trajectories admitted').")
    update.add_argument("rows", type=Path, help="a JSONL file, one trajectory per line with 'reward' and "
                        "'logprobs' (optional: behavior_logprobs, action_mask, values, task_id, ...)")
    update.add_argument("--method", required=True, metavar="NAME",
                        help=f"the method to run; one of: {', '.join(names)}")
    update.add_argument("--set", "--knob", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="change one knob of the method, e.g. --set trust=0.01; the value is read as JSON "
                             "when it parses, else as a string (repeatable; `--knob` is the same flag, as in "
                             "`wai prime-rl`; `wai methods` lists the knobs)")
    update.add_argument("--json", action="store_true", help="print the whole Update as JSON instead of the report")
    update.add_argument("--out", type=Path, default=None, metavar="FILE",
                        help="also write the coefficients to FILE: one JSON line per trajectory "
                             "({\"row\", \"admitted\", \"coefficients\"}), written atomically")
    update.add_argument("--state", type=Path, default=None, metavar="FILE",
                        help="for a method that keeps state across updates (rae's per-agent baselines): load it "
                             "from FILE before the update when FILE exists, and write it back after, atomically")
    update.set_defaults(func=cmd_update)
    methods = subparsers.add_parser("methods", help="list every method with its defaults and their sources",
                                    description="Every method, every knob, its default, the paper it comes from, "
                                                "the paper's own value and why ours differs.")
    methods.add_argument("--json", action="store_true", help="print JSON instead of a listing")
    methods.set_defaults(func=cmd_methods)


# --------------------------------------------------------------------- wai update
def parse_settings(settings: list[str]) -> dict[str, Any]:
    """['trust=0.01', 'ratio=[0.5,5]'] -> {'trust': 0.01, 'ratio': [0.5, 5]}."""
    out: dict[str, Any] = {}
    for item in settings:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set trust=0.01")
        try:
            value: Any = json.loads(text)
        except json.JSONDecodeError:
            value = text
        out[key.strip()] = value
    return out


def build_method(name: str, settings: list[str]) -> Method:
    overrides = parse_settings(settings)
    names = method_names()
    key = name.strip().lower().replace("-", "_")
    if key not in names:
        raise ConfigError(f"unknown method {name!r}; valid names: {', '.join(names)}")
    fields = [f.name for f in dataclasses.fields(REGISTRY[key])] if key in REGISTRY else []
    unknown = sorted(set(overrides) - set(fields)) if fields else []
    if unknown:
        raise ConfigError(f"--set {unknown[0]}: {name} has no knob {unknown[0]!r}; its knobs are {', '.join(fields)}")
    return method(key, **overrides)


def cmd_update(args: argparse.Namespace) -> int:
    chosen = build_method(args.method, args.settings)
    for flag, path in (("--out", args.out), ("--state", args.state)):
        if path is None:
            continue
        check_output_path(path)  # before any work, so a typo does not cost the whole update
        if path.resolve() == args.rows.resolve():
            raise ConfigError(f"{flag} {path} is the rows file itself; writing there would replace your "
                              f"trajectories. Fix: give {flag} another file name")
    if args.state is not None:
        load_state(chosen, args.state)
    rows = load_rows(args.rows, require=("reward",))
    try:
        update = chosen.update(rows)
    except BatchError as err:
        raise BatchError(locate(args.rows, str(err))) from None
    if args.out is not None:
        write_coefficients(args.out, update)
    if args.state is not None:
        save_state(chosen, args.state)
    print(update.to_json() if args.json else str(update))
    return 0


def locate(path: Path, message: str) -> str:
    """'row 3: ...' -> 'rows.jsonl, line 5 (row 3): ...': the file line of the row an error names."""
    match = re.match(r"row (\d+): ", message)
    if match is None:
        return f"{path}: {message}"
    index = int(match.group(1))
    if path.suffix in (".parquet", ".pq"):
        where = f"row {index + 1}"
    else:
        with open(path, encoding="utf-8") as handle:
            lines = (number for number, line in enumerate(handle, start=1) if line.strip())
            where = f"line {next(itertools.islice(lines, index, None), '?')}"
    return f"{path}, {where} (row {index}): {message[match.end():]}"


# --------------------------------------------------------------------- --state
def _stateful(chosen: Method, path: Path) -> Any:
    if not (callable(getattr(chosen, "state_dict", None)) and callable(getattr(chosen, "load_state_dict", None))):
        raise ConfigError(f"--state {path}: {chosen.name} keeps no state across updates (only methods with a "
                          "running statistic do, e.g. rae); drop --state")
    return chosen


def load_state(chosen: Method, path: Path) -> None:
    """Restore the method's state from ``path`` (a file ``save_state`` wrote); a missing file is a fresh start."""
    method: Any = _stateful(chosen, path)
    if not path.exists():
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        state = {key: dict((k, v) for k, v in value) for key, value in saved.items()}
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as err:
        raise ConfigError(f"--state {path}: not a state file written by `wai update --state` ({err}); remove it "
                          "to start fresh, or pass the right file") from None
    try:
        method.load_state_dict(state)
    except ConfigError as err:
        raise ConfigError(f"--state {path}: {err}") from None


def save_state(chosen: Method, path: Path) -> None:
    """Write the method's state to ``path`` atomically; mappings become [key, value] pairs so that any
    JSON key (a None or integer agent) survives the round trip."""
    state = _stateful(chosen, path).state_dict()
    with atomic_write(path) as handle:
        json.dump({key: [[k, v] for k, v in value.items()] for key, value in state.items()}, handle)
        handle.write("\n")


def write_coefficients(path: Path, update: Update) -> None:
    """One JSON line per trajectory, replacing ``path`` only once every line is written."""
    with atomic_write(path) as handle:
        for i, (admitted, coefficients) in enumerate(zip(update.admitted, update.coefficients)):
            line = {"row": i, "admitted": bool(admitted), "coefficients": (coefficients + 0.0).tolist()}
            handle.write(json.dumps(line) + "\n")


# --------------------------------------------------------------------- wai methods
def describe_methods() -> dict[str, Any]:
    """{name: {"class": ..., "knobs": {field: {value, doc, source, paper_value, why}}}} for every method."""
    method_names()  # imports every method module
    out: dict[str, Any] = {}
    for name in sorted(REGISTRY):
        cls = REGISTRY[name]
        knobs = {}
        for field, spec in cls.knobs().items():
            knobs[field] = {"value": _plain(spec.value), "doc": spec.doc, "source": spec.source,
                            "paper_value": _plain(spec.paper), "why": spec.why}
        out[name] = {"class": cls.__name__, "knobs": knobs}
    return out


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def cmd_methods(args: argparse.Namespace) -> int:
    table = describe_methods()
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    lines = []
    for name, entry in table.items():
        lines.append(f"{name} (wai.{entry['class']})")
        if not entry["knobs"]:
            lines.append("  (no knobs)")
        for field, knob in entry["knobs"].items():
            paper = "" if knob["paper_value"] == knob["value"] else f"; paper: {knob['paper_value']!r}"
            lines.append(f"  {field} = {knob['value']!r}  [{knob['source']}{paper}]")
            if knob["why"]:
                lines.append(f"      why ours differs: {knob['why']}")
        lines.append("")
    for alias, (target, preset) in ALIASES.items():
        shown = ", ".join(f"{k}={v!r}" for k, v in preset.items())
        lines.append(f"{alias} = {target} with {shown}")
    print("\n".join(lines).rstrip())
    return 0


# --------------------------------------------------------------------- docs/methods.md tables
def markdown_table(name: str) -> str:
    """The defaults table of one method as Markdown (docs/methods.md embeds these, checked by a test)."""
    entry = describe_methods()[name]
    lines = ["| knob | default | source | paper's value | why ours differs |", "|---|---|---|---|---|"]
    for field, knob in entry["knobs"].items():
        paper = "same" if knob["paper_value"] == knob["value"] else f"`{knob['paper_value']!r}`"
        lines.append(f"| `{field}` | `{knob['value']!r}` | {knob['source']} | {paper} | {knob['why']} |")
    return "\n".join(lines)


def render_tables(text: str) -> str:
    """Replace every ``<!-- defaults:NAME -->`` ... ``<!-- /defaults -->`` block with the current table."""
    out, rest = [], text
    while (start := rest.find("<!-- defaults:")) >= 0:
        head_end = rest.index("-->", start) + 3
        name = rest[start + len("<!-- defaults:"):head_end - 3].strip()
        stop = rest.index("<!-- /defaults -->", head_end)
        out.append(rest[:head_end] + "\n" + markdown_table(name) + "\n")
        rest = rest[stop:]
    out.append(rest)
    return "".join(out)
