"""`wai prime-rl` through main(argv): the file it writes, what it prints, --json, and refusals."""

from __future__ import annotations

import json

import whileai as wai
from whileai.cli import main

from .cases import CLIP_TAGS, QWEN, TEACHER, tomllib


def test_writes_the_same_config_as_the_api_and_prints_the_rest(tmp_path, capsys) -> None:
    out = tmp_path / "rl.toml"
    code = main(["prime-rl", "--env", "reverse-text", "--method", "rae", "--model", QWEN,
                 "--set", "orchestrator.group_size=1", "--set", "max_steps=50", "--out", str(out)])
    assert code == 0
    expected = wai.prime_rl_config("reverse-text", "rae", model=QWEN, max_steps=50, **{"orchestrator.group_size": 1})
    assert tomllib.loads(out.read_text()) == expected.config
    printed = capsys.readouterr().out
    assert f"launch: uv run rl @ {out}" in printed
    assert "ignored RAE.clip: 0.2: prime-rl clips no ratio" in printed
    assert "warning: rae at group_size 1" in printed


def test_knobs_env_fields_and_teacher_flags(tmp_path, capsys) -> None:
    out = tmp_path / "opd.toml"
    code = main(["prime-rl", "--env", "gsm8k", "--env-field", "split=train", "--method", "opd",
                 "--knob", "max_tokens=512", "--knob", "rollouts_per_prompt=2", "--model", QWEN,
                 "--teacher-url", TEACHER.base_url, "--teacher-model", TEACHER.model,
                 "--teacher-vocab", "151669", "--model-vocab", "151669", "--out", str(out)])
    assert code == 0
    config = tomllib.loads(out.read_text())
    assert config["orchestrator"]["group_size"] == 2
    assert config["orchestrator"]["train"]["sampling"]["max_completion_tokens"] == 512
    assert config["orchestrator"]["train"]["source"][0]["env"]["taskset"] == {"id": "gsm8k", "split": "train"}
    assert config["orchestrator"]["algo"]["teacher"] == {"name": "Qwen/Qwen3-8B", "base_url": TEACHER.base_url}


def test_async_from_the_command_line(capsys) -> None:
    code = main(["prime-rl", "--env", "reverse-text", "--method", "async", "--knob", "method=grpo",
                 "--knob", "correction=ipo", "--knob", "threshold=0.2", "--model", QWEN, "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"]["trainer"]["loss"] == {"type": "ipo", "ipo_threshold": 0.2}
    assert data["algorithm"] == "grpo + ipo loss"
    assert tomllib.loads(data["toml"]) == data["config"]
    assert data["command"] == "uv run rl @ rl.toml"
    assert set(data["ignored"]) == {"GRPO.loss_type", "GRPO.truncated"} | CLIP_TAGS


def test_without_out_the_toml_is_printed(capsys) -> None:
    assert main(["prime-rl", "--env", "reverse-text", "--method", "max_rl", "--model", QWEN]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# written by whileai prime_rl_config")
    assert tomllib.loads(printed)["orchestrator"]["algo"] == {"type": "max_rl"}


def test_refusal_exits_2_with_the_reason(tmp_path, capsys) -> None:
    out = tmp_path / "rl.toml"
    assert main(["prime-rl", "--env", "refunds-v1", "--method", "sao", "--model", QWEN, "--out", str(out)]) == 2
    assert "refused: prime_rl_config: wai.SAO needs a value critic" in capsys.readouterr().err
    assert not out.exists()
    assert main(["prime-rl", "--env", "x", "--method", "ppo", "--model", QWEN, "--json"]) == 2
    assert "never clips the ratio" in json.loads(capsys.readouterr().out)["refused"]


def test_bad_set_and_unknown_key(capsys) -> None:
    assert main(["prime-rl", "--env", "x", "--method", "grpo", "--model", QWEN, "--set", "group_size"]) == 2
    assert "--set 'group_size' is invalid: write NAME=VALUE" in capsys.readouterr().err
    assert main(["prime-rl", "--env", "x", "--method", "grpo", "--model", QWEN, "--set", "orchestrator.foo=1"]) == 2
    assert "orchestrator.foo, which is not a key of prime-rl v0.8.1.dev67" in capsys.readouterr().err


def test_strict_flag(capsys) -> None:
    assert main(["prime-rl", "--env", "x", "--method", "grpo", "--model", QWEN, "--strict"]) == 2
    assert "standard deviation" in capsys.readouterr().err


def test_help_lists_every_method_the_writer_knows() -> None:
    from whileai.cli.prime_rl_cmd import methods_help
    from whileai.prime_rl.refusals import WHOLE_METHODS
    from whileai.prime_rl.writer import WRITERS

    text = methods_help()
    written = text.split("written: ")[1].split(";")[0]
    for name in WRITERS:
        assert f" {name}," in f" {written}," or f" {name} (as" in f" {written}", name
    for name in [*WHOLE_METHODS, *wai.method_names()]:
        assert f" {name}," in text or f" {name} " in text or f" {name};" in text, name
    assert "grpo_nostd (as dr_grpo)" in written and "cispo" not in written  # a variant is written as its base
