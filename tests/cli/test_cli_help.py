"""Every `wai` flag has help text, and a flag with fixed choices lists them in `--help`."""

from __future__ import annotations

import argparse

import pytest

from whileai.cli import build_parser


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(subparsers()))
def test_every_flag_has_help_and_lists_its_choices(name):
    sub = subparsers()[name]
    assert sub.description, f"wai {name} has no description"
    text = sub.format_help()
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        label = "/".join(action.option_strings) or action.dest
        assert action.help and len(action.help) > 10, f"wai {name} {label} has no help text"
        for choice in action.choices or ():
            assert str(choice) in text, f"wai {name} {label}: choice {choice!r} is not shown in --help"


def test_method_flags_name_every_method():
    """`--method` is free text (names are normalised: 'Dr-GRPO' works), so its help must list the names."""
    from whileai.methods.registry import method_names

    for name in ("update", "prime-rl"):
        text = " ".join(subparsers()[name].format_help().split())
        for method in method_names():
            assert method in text, f"wai {name} --help does not name {method}"
