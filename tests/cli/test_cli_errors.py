"""Realistic bad input on every `wai` subcommand: one line on stderr naming the problem and the fix,
exit status 2, no traceback, and no output file left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

import whileai as wai
from whileai.cli import main

REPO = Path(__file__).resolve().parents[2]
PRIME = ["prime-rl", "--env", "reverse-text", "--model", "Qwen/Qwen3-0.6B"]
STUDENT = "examples/rows-student.jsonl"
TRACES = "examples/traces.jsonl"

# (argv, a piece of the one error line)
CASES = [
    (["update", "--method", "grpo", "nope.jsonl"], "nope.jsonl: no such file. Fix: check the path"),
    (["update", "--method", "grpo", "folder"], "folder is a folder, not a file. Fix: name a file"),
    (["update", "--method", "grpo", "empty.jsonl"], "the batch is empty"),
    (["update", "--method", "grpo", "broken.jsonl"], "broken.jsonl, line 1: not valid JSON"),
    (["update", "--method", "grpo", "typed.jsonl"], "field 'reward' is 'one' (str); it must be a number"),
    (["update", "--method", "nosuch", TRACES], "unknown method 'nosuch'; valid names: async"),
    (["update", "--method", "flash_reinforce", "--set", "trust", TRACES], "expected KEY=VALUE"),
    (["update", "--method", "flash_reinforce", "--knob", "trust=abc", TRACES], "FlashReinforce.trust='abc' is invalid"),
    (["update", "--method", "flash_reinforce", "--set", "nosuch=1", TRACES], "has no knob 'nosuch'"),
    (["update", "--method", "flash_reinforce", "--out", "folder", TRACES], "folder is a folder; an output must be a file"),
    (["update", "--method", "flash_reinforce", "--out", "no/such/out.jsonl", TRACES], "the folder no/such does not exist"),
    (["update", "--method", "rae", "--state", "folder", TRACES], "folder is a folder"),
    (["update", "--method", "rae", "--out", "rows.jsonl", "rows.jsonl"], "--out rows.jsonl is the rows file itself"),
    (["update", "--method", "async", "--knob", "method=async", TRACES], "Async wraps another method"),
    (["update", "--method", "rm", TRACES], "field 'score' is missing (4 of 4 rows lack it)"),
    (["report", "nope.jsonl"], "no such file"),
    (["report", "empty.jsonl"], "empty.jsonl: no rows. Fix:"),
    (["report", "broken.jsonl"], "not valid JSON"),
    (["report", STUDENT, "--k", "0"], "k=0 must be an integer >= 1"),
    (["report", STUDENT, "--k", "two"], "argument --k: invalid int value: 'two'. See `wai report --help`."),
    (["report", STUDENT, "--threshold", "nan"], "threshold=nan must be a finite number"),
    (["route", STUDENT, "--model", "m", "--teacher-url", "notaurl"], "Endpoint.base_url='notaurl' is invalid"),
    (["route", STUDENT], "the following arguments are required: --model"),
    (["select", STUDENT, "--mode", "rl", "--out", "folder"], "folder is a folder"),
    (["select", STUDENT, "--mode", "bad", "--out", "x.jsonl"], "invalid choice: 'bad'"),
    (["compare", STUDENT, "nope.jsonl"], "no such file"),
    (["compare", "examples/rows-baseline.jsonl", "examples/rows-treatment.jsonl", "--seeds", "0"], "seeds=0"),
    ([*PRIME, "--method", "grpo", "--knob", "nosuch=1"], "grpo has no knob 'nosuch'; its knobs are rollouts_per_prompt"),
    ([*PRIME, "--method", "grpo", "--set", "rollouts_per_prompt=16"], "--knob rollouts_per_prompt=VALUE"),
    ([*PRIME, "--method", "grpo", "--out", "folder"], "folder is a folder"),
    ([*PRIME, "--method", "groupwise_grading"], "refused: prime_rl_config: groupwise_grading ranks the passes"),
    ([*PRIME, "--method", "groupwise_grading", "--knob", "mode=advantage"], "refused: prime_rl_config:"),
    ([*PRIME, "--method", "async"], "'async' cannot be built from its name alone: Async.method=None"),
    ([*PRIME, "--method", "opd", "--teacher-vocab", "abc"], "argument --teacher-vocab: invalid int value"),
]


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "folder").mkdir()
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "broken.jsonl").write_text('{"reward": 1.0, "logprobs": [-0.1\n')
    (tmp_path / "rows.jsonl").write_text((REPO / TRACES).read_text())
    (tmp_path / "typed.jsonl").write_text('{"reward": "one", "logprobs": [-0.1]}\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("argv,expected", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line_with_the_fix_and_status_2(argv, expected, workdir, capsys):
    before = sorted(p.name for p in workdir.rglob("*") if "examples" not in p.parts)
    try:
        status = main(argv)
    except SystemExit as done:  # argparse usage errors
        status = int(done.code or 0)
    captured = capsys.readouterr()
    assert status == 2, (argv, captured.out, captured.err)
    assert expected in captured.err, captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    assert captured.err.startswith(f"wai {argv[0]}: "), captured.err
    after = sorted(p.name for p in workdir.rglob("*") if "examples" not in p.parts)
    assert after == before, "an error must not leave files behind"


def test_method_by_name_refuses_an_unknown_knob_with_the_list():
    with pytest.raises(wai.ConfigError, match=r"grpo has no knob 'nosuch'; its knobs are rollouts_per_prompt, clip"):
        wai.method("grpo", nosuch=1)
    assert wai.method("dr-grpo", rollouts_per_prompt=4).rollouts_per_prompt == 4


def test_prime_rl_refuses_groupwise_grading_by_name_with_the_reason_not_as_unknown():
    """The name is a registry name whose defaults cannot be built (no grader): still a refusal."""
    with pytest.raises(wai.ConfigError, match=r"groupwise_grading ranks the passes") as caught:
        wai.prime_rl_config("reverse-text", "groupwise_grading", model="Qwen/Qwen3-0.6B")
    assert "What you can do:" in str(caught.value) and "unknown method" not in str(caught.value)
