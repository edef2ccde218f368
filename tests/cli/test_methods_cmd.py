"""`wai update` and `wai methods`, called through main(argv) on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from whileai.cli import main
from whileai.methods.defaults import DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "examples" / "traces.jsonl"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_update_prints_the_lessons_report(capsys):
    code, out, _ = run(capsys, "update", "--method", "flash_reinforce", str(TRACES))
    assert code == 0
    lines = out.splitlines()
    assert lines[:6] == ["flash_reinforce update: 3 of 4 trajectories admitted", "  batch mean reward: 0.5",
                         "  admitted share: 0.75", "  mean sequence kl: 0.1746", "  max sequence kl: 0.6969",
                         "  mean ratio: 0.9906"]
    assert lines[6].startswith("  1 trajectory (3) over trust 0.003 masked whole (max mean KL 0.697)")


def test_update_json_and_out_file(capsys, tmp_path):
    out_file = tmp_path / "c.jsonl"
    code, out, _ = run(capsys, "update", "--method", "flash_reinforce", "--json", "--out", str(out_file), str(TRACES))
    assert code == 0
    update = json.loads(out)
    assert update["admitted"] == [True, True, True, False]
    # trace 0: A = +0.5, T = 3, B = 4, rho_0 = exp(0.01): c_0 = 0.5 * 1.0100502 / 12 = 0.0420854
    assert update["coefficients"][0][0] == pytest.approx(0.5 * 1.0100502 / 12, rel=1e-6)
    assert update["stats"]["mean_ratio"] == pytest.approx(0.9906, abs=5e-5)
    lines = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [line["row"] for line in lines] == [0, 1, 2, 3]
    assert lines[2]["coefficients"][2] == 0.0  # the tool token
    assert lines[3] == {"row": 3, "admitted": False, "coefficients": [0.0, 0.0]}


def test_set_changes_a_knob(capsys):
    code, out, _ = run(capsys, "update", "--method", "flash_reinforce", "--set", "trust=1.0", str(TRACES))
    assert code == 0 and out.startswith("flash_reinforce update: 4 of 4 trajectories admitted")
    assert "mean ratio: 0.8999" in out


def test_errors_exit_2_with_a_message(capsys, tmp_path):
    code, _, err = run(capsys, "update", "--method", "flash_reinforce", "--set", "trsut=1", str(TRACES))
    assert code == 2 and "no knob 'trsut'; its knobs are trust, off_policy_steps" in err
    code, _, err = run(capsys, "update", "--method", "grpoo", str(TRACES))
    assert code == 2 and "unknown method 'grpoo'; valid names:" in err and "flash_reinforce" in err
    code, _, err = run(capsys, "update", "--method", "sao", str(TRACES))
    assert code == 2 and "traces.jsonl, line 1 (row 0): field 'values' is missing" in err and "sao needs it" in err
    bad = tmp_path / "bad.jsonl"
    # a blank line between the rows: row 1 is on line 3 of the file
    bad.write_text('{"reward": 1.0, "logprobs": [-0.1]}\n\n{"reward": 1.0, "logprobs": [0.5]}\n')
    code, _, err = run(capsys, "update", "--method", "sft", str(bad))
    assert code == 2 and "bad.jsonl, line 3 (row 1): field 'logprobs' is 0.5 at token 0, above 0" in err
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"reward": 1.0, "logprobs": [-0.1]}\n{"reward": \n')
    code, _, err = run(capsys, "update", "--method", "sft", str(broken))
    assert code == 2 and "line 2: not valid JSON" in err


def test_out_is_not_written_when_the_update_fails(capsys, tmp_path):
    out_file = tmp_path / "c.jsonl"
    out_file.write_text("old\n")
    code, _, _ = run(capsys, "update", "--method", "sao", "--out", str(out_file), str(TRACES))
    assert code == 2 and out_file.read_text() == "old\n"


def test_methods_lists_every_method_with_defaults_and_sources(capsys):
    code, out, _ = run(capsys, "methods")
    assert code == 0
    for name in DEFAULTS:
        assert f"\n{name} (wai." in "\n" + out, name
    assert "  trust = 0.003  [Hu et al. 2026, FlashREINFORCE (NVIDIA), Eq. 8]" in out
    assert "  beta = 0.1  [Rafailov et al. 2023, DPO, arXiv:2305.18290" in out
    code, out, _ = run(capsys, "methods", "--json")
    table = json.loads(out)
    assert table["opsd"]["knobs"]["anchor"]["value"] == "ema:0.01"
    assert table["sao"]["knobs"]["ratio"]["value"] == [0.7, 6.0]
    assert table["grpo"]["knobs"]["rollouts_per_prompt"]["paper_value"] == 64


def test_rae_state_carries_baselines_across_runs(capsys, tmp_path):
    """Two runs with --state equal one RAE object updating twice (the baselines persist in the file).

    Run 1, agent 'a', decay 0.95: R = 1 against b = 0 gives A = 1, then b = 0.05.
    Run 2: R = 0 against b = 0.05 gives A = -0.05, then b = 0.0475.
    """
    rows = tmp_path / "rows.jsonl"
    state = tmp_path / "rae.json"
    rows.write_text('{"reward": 1.0, "logprobs": [-0.1], "agent": "a"}\n')
    code, out, _ = run(capsys, "update", "--method", "rae", "--json", "--state", str(state), str(rows))
    assert code == 0 and json.loads(out)["advantages"] == [[1.0]]
    assert json.loads(state.read_text()) == {"baselines": [["a", pytest.approx(0.05)]]}
    rows.write_text('{"reward": 0.0, "logprobs": [-0.1], "agent": "a"}\n')
    code, out, _ = run(capsys, "update", "--method", "rae", "--json", "--state", str(state), str(rows))
    assert json.loads(out)["advantages"][0][0] == pytest.approx(-0.05, abs=1e-12)
    assert json.loads(state.read_text())["baselines"][0][1] == pytest.approx(0.0475, abs=1e-12)
    # rows without an agent share one baseline, saved under a null agent and restored as None
    rows.write_text('{"reward": 1.0, "logprobs": [-0.1]}\n')
    shared = tmp_path / "shared.json"
    for _ in range(2):
        code, out, _ = run(capsys, "update", "--method", "rae", "--json", "--state", str(shared), str(rows))
    assert json.loads(out)["advantages"][0][0] == pytest.approx(0.95, abs=1e-12)


def test_state_errors(capsys, tmp_path):
    code, _, err = run(capsys, "update", "--method", "sft", "--state", str(tmp_path / "s.json"), str(TRACES))
    assert code == 2 and "sft keeps no state across updates" in err
    broken = tmp_path / "broken.json"
    broken.write_text('{"baselines": [["a", "high"]]}')
    code, _, err = run(capsys, "update", "--method", "rae", "--state", str(broken), str(TRACES))
    assert code == 2 and "baseline for agent 'a' is 'high'; it must be a finite number" in err
    assert broken.read_text() == '{"baselines": [["a", "high"]]}'  # left as it was
    # an update that fails leaves a good state file as it was
    good = tmp_path / "good.json"
    good.write_text('{"baselines": [["a", 0.5]]}\n')
    bad_rows = tmp_path / "bad.jsonl"
    bad_rows.write_text('{"reward": 1.0, "logprobs": [0.3], "agent": "a"}\n')
    code, _, err = run(capsys, "update", "--method", "rae", "--state", str(good), str(bad_rows))
    assert code == 2 and "bad.jsonl, line 1 (row 0): field 'logprobs' is 0.3" in err
    assert good.read_text() == '{"baselines": [["a", 0.5]]}\n'
