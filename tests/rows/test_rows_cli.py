"""`wai report / route / select / compare` on real files: tables, --json, errors, atomic --out."""

from __future__ import annotations

import json
import os

import pytest

from whileai.cli.rows_cmd import main

from ._rowkit import make_rows, write_jsonl


@pytest.fixture
def rows_file(tmp_path):
    # t0 all fail, t1 2 of 4, t2 all pass, t3 1 of 4; model "m"
    return write_jsonl(tmp_path / "rows.jsonl", make_rows([0, 2, 4, 1], 4, model="m"))


def test_report_table_and_json(rows_file, capsys):
    assert main(["report", str(rows_file), "--k", "2"]) == 0
    out = capsys.readouterr().out
    assert "16 rows, 4 tasks, 4 rollouts per task" in out
    assert "pass@1 0.438" in out and "band: mixed" in out  # (0 + .5 + 1 + .25) / 4 = 0.4375
    assert "split     2      50.0%" in out and "rl    8 rows, 2 tasks" in out
    assert "pass@2 " in out
    assert main(["report", str(rows_file), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pass_at_1"] == pytest.approx(0.4375) and data["band"] == "mixed"
    assert data["keeps"]["rl"] == {"rows": 8, "tasks": 2}


def test_route_table_and_json(rows_file, capsys):
    assert main(["route", str(rows_file), "--model", "m"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("route: grpo  (branch: grpo)")
    assert main(["route", str(rows_file), "--model", "other", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["branch"] == "another model's rows" and data["method"] == "sft"
    assert data["config"]["method"] == "sft"


def test_select_rl_writes_kept_lines_byte_for_byte(rows_file, tmp_path, capsys):
    out = tmp_path / "kept.jsonl"
    assert main(["select", str(rows_file), "--mode", "rl", "--out", str(out)]) == 0
    lines = rows_file.read_text().splitlines(keepends=True)
    assert out.read_text() == "".join(lines[4:8] + lines[12:16])  # tasks t1 and t3
    assert "wrote 8 of 16 rows" in capsys.readouterr().out


def test_select_dpo_writes_pairs(rows_file, tmp_path, capsys):
    out = tmp_path / "pairs.jsonl"
    assert main(["select", str(rows_file), "--mode", "dpo", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    pairs = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["pairs"] == 3 and len(pairs) == 6  # t1: min(2, 2) = 2, t3: min(1, 3) = 1
    assert sorted((p["pair"], p["chosen"]) for p in pairs) == [(n, c) for n in range(3) for c in (False, True)]


def test_bad_file_fails_with_line_and_fix_and_writes_nothing(tmp_path, capsys):
    good = make_rows([1, 2], 4)
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in good[:5]) + '{"task_id": "t1", "reward": "one"}\n')
    out = tmp_path / "kept.jsonl"
    assert main(["select", str(path), "--mode", "rl", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{path}, line 6: field 'reward' is 'one' (str)" in err and "Fix:" in err
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["bad.jsonl"]
    out.write_text("the previous selection\n")
    assert main(["select", str(path), "--mode", "sft", "--out", str(out)]) == 2
    assert out.read_text() == "the previous selection\n"  # an old file is left whole
    path.write_text('{"task_id": "t1", "reward": 1.0}\n{"reward": 0.0}\n')
    assert main(["report", str(path)]) == 2
    assert "line 2: field 'task_id' is missing" in capsys.readouterr().err


def test_compare_prints_the_table_row(tmp_path, capsys):
    base = write_jsonl(tmp_path / "base.jsonl", make_rows([0, 1, 2], 2))
    new = write_jsonl(tmp_path / "new.jsonl", make_rows([1, 1, 2], 2))
    assert main(["compare", str(base), str(new), "--name", "recipe", "--treatment-name", "wai.GRPO()"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["Recipe", "Baseline", "arm"]
    assert out[2].split("  ")[0] == "recipe" and "wai.GRPO(), 0.67" in out[2] and out[2].endswith("unresolved")
    assert main(["compare", str(base), str(new), "--json", "--seeds", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["delta"] == pytest.approx(1 / 6) and data["verdict"] == "unresolved"


def test_missing_file_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope.jsonl'}: no such file. Fix: check the path" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_compare_reads_seeds_from_the_files(tmp_path, capsys):
    """Three seeds per arm in the rows (the fast loader's path): treatment seeds 0.75, 1.0, 1.0 against
    baseline seeds 0.25, 0.5, 0.25 on 30 tasks: per-seed deltas .5, .5, .75, mean 7/12, sd .144338,
    t(.975, 2) * .144338 / sqrt(3) = .358551 -> [+.225, +.942]: gain shown; 3 vs 3 seeds reported."""
    def seeded(per_seed):
        return [dict(r, seed=s) for s, passes in enumerate(per_seed) for r in make_rows([passes] * 30, 4)]

    base = write_jsonl(tmp_path / "base.jsonl", seeded([1, 2, 1]))
    new = write_jsonl(tmp_path / "new.jsonl", seeded([3, 4, 4]))
    assert main(["compare", str(base), str(new), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["baseline_seeds"], data["treatment_seeds"], data["verdict"]) == (3, 3, "gain shown")
    assert data["delta"] == pytest.approx(7 / 12) and data["seed_ci95"][0] == pytest.approx(7 / 12 - 0.358551, abs=1e-5)
    rows = seeded([1, 2])
    del rows[7]["seed"]  # one row with no seed among seeded rows: it would belong to no seed
    write_jsonl(base, rows)
    assert main(["compare", str(base), str(new)]) == 2
    err = capsys.readouterr().err
    assert f"1 row without a 'seed' while others have one (the first: {base}, line 8, task 't1')" in err
    assert "Fix:" in err


def test_select_from_parquet_writes_jsonl(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = make_rows([0, 2, 4, 1], 4, model="m")
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    out = tmp_path / "kept.jsonl"
    assert main(["select", str(path), "--mode", "rl", "--out", str(out)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows[4:8] + rows[12:16]


@pytest.mark.parametrize("command", [["report"], ["route", "--model", "m"], ["select", "--mode", "rl", "--out", "K"]])
def test_a_threshold_that_is_not_finite_is_refused(rows_file, tmp_path, command, capsys):
    """reward >= nan is false for every row: without the check every task would read as a silent floor."""
    argv = [command[0], str(rows_file), *[str(tmp_path / a) if a == "K" else a for a in command[1:]]]
    assert main([*argv, "--threshold", "nan"]) == 2
    assert "threshold=nan must be a finite number" in capsys.readouterr().err
    assert not (tmp_path / "K").exists()


def test_select_out_into_a_missing_folder_says_so(rows_file, tmp_path, capsys):
    out = tmp_path / "no" / "kept.jsonl"
    assert main(["select", str(rows_file), "--mode", "rl", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"the folder {out.parent} does not exist" in err and "Fix:" in err
