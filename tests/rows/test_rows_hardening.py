"""Places where graded rows were misread in silence: non-binary rewards, unknown fields, task ids of two
types, every bad line at once, passes()/fails(), and route's place above the methods."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

import whileai as wai
from whileai import BatchError, ConfigError
from whileai.cli.rows_cmd import main
from whileai.methods.base import Method
from whileai.routing import route
from whileai.rows.batch import KNOWN_FIELDS, Batch
from whileai.rows.io import MAX_LISTED, GradedRows, as_graded, load_graded, load_rows
from whileai.rows.select import select, selection_report
from whileai.rows.stats import compare, pass_at

from ._rowkit import make_rows, write_jsonl

MODEL = "Qwen/Qwen3-8B"
SRC = Path(__file__).resolve().parents[2] / "src" / "whileai"


def _graded_0_to_10(n_tasks: int = 10, k: int = 4) -> list[dict]:
    """A 0-10 grader: task i's rollouts score i, i+1, ... (capped at 10), never a 0/1 reward only."""
    return [{"task_id": f"t{i}", "reward": float(min(10, i + j)), "model": MODEL}
            for i in range(n_tasks) for j in range(k)]


# --------------------------------------------------------------------------- rewards that are not 0/1
def test_a_0_to_10_grader_is_refused_without_a_threshold_and_read_with_one():
    """Read at the old default 1.0, 39 of 40 rows of this file "pass" (pass@1 0.975); 37 rows are neither 0
    nor 1 (task 0 scores 0, 1, 2, 3 and task 1 scores 1, 2, 3, 4). Without a threshold
    the library must say the rewards are not 0/1 and name threshold=, not report a number.
    With threshold=10 only full marks pass: rows (7,8,9,10) (8,..) (9,..) (10,..) score 10 once, twice,
    three times, four times -> tasks 7..9 pass 1/4, 2/4, 3/4 and no other task passes: pass@1 = 6/4/10 = 0.15."""
    rows = _graded_0_to_10()
    for call in (lambda: pass_at(rows), lambda: selection_report(rows), lambda: route(rows, MODEL),
                 lambda: select(rows, "sft"), lambda: wai.band(rows), lambda: compare(rows, rows)):
        with pytest.raises(ConfigError, match=r"not all 0 or 1 \(37 of 40 rows.*from 0 to 10.*threshold="):
            call()
    assert pass_at(rows, threshold=10).pass_at_1 == pytest.approx(0.15)
    assert [r["reward"] for r in select(rows, "sft", threshold=10).rows] == [10.0] * 6


def test_partial_credit_is_not_routed_to_opsd_on_a_guess():
    """Rewards 0.5-0.99 (partial credit): at the old default every rollout "fails" and route picked OPSD.
    Without a threshold it refuses; with threshold=0.75 the tasks split and it routes to GRPO."""
    rng = np.random.default_rng(0)
    rows = [{"task_id": f"t{i}", "reward": float(rng.uniform(0.5, 0.99)), "model": MODEL}
            for i in range(12) for _ in range(4)]
    with pytest.raises(ConfigError, match="threshold= in Python or --threshold"):
        route(rows, MODEL)
    assert route(rows, MODEL, threshold=0.75).method == "grpo"
    assert route(rows, MODEL, threshold=1.0).method == "opsd"  # said out loud, it is the user's call


def test_cli_names_threshold_for_non_binary_rewards(tmp_path, capsys):
    path = write_jsonl(tmp_path / "graded.jsonl", _graded_0_to_10())
    for command in (["report", str(path)], ["route", str(path), "--model", MODEL]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "not all 0 or 1" in err and "--threshold" in err
    assert main(["report", str(path), "--threshold", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pass_at_1"] == pytest.approx(0.15)


def test_binary_rewards_still_need_no_threshold():
    rows = make_rows([0, 1, 2], 2)
    assert pass_at(rows).threshold == 1.0 and pass_at(rows).pass_at_1 == pytest.approx(0.5)
    ints = [{"task_id": "a", "reward": 1}, {"task_id": "a", "reward": 0}]  # integer 0/1 are binary too
    assert pass_at(ints).pass_at_1 == 0.5


# --------------------------------------------------------------------------- unknown fields
def test_misspelt_field_gets_a_note_with_the_nearest_known_name():
    rows = [{"reward": 1.0, "logprobs": [-0.5, -0.2], "behaviour_logprobs": [-0.4, -0.3], "task_id": "a"}]
    batch = Batch.from_rows(rows)
    assert batch.unknown_fields == ("behaviour_logprobs",)
    (note,) = batch.field_notes
    assert "'behaviour_logprobs' is ignored" in note and "Did you mean 'behavior_logprobs'?" in note
    assert not batch.has("behavior_logprobs")  # still not read: the note is what tells the user


def test_a_training_loops_bookkeeping_fields_are_known():
    row = {"reward": 1.0, "logprobs": [-0.5], "task_id": "a", "prompt_tokens": [1, 2], "tokens": [3],
           "completion": "x", "text": "x", "model": "m", "truncated": False, "sampler_step": 3}
    assert set(row) <= set(KNOWN_FIELDS)
    assert Batch.from_rows([row]).unknown_fields == () and Batch.from_rows([row]).field_notes == ()


def test_unrelated_unknown_fields_are_listed_in_one_note():
    rows = [{"reward": 1.0, "logprobs": [-0.5], "zzz": 1, "qqq_id": 2}]
    assert Batch.from_rows(rows).field_notes == ("2 fields no part of whileai reads, ignored: 'qqq_id', 'zzz'",)


def test_report_and_route_surface_unknown_fields(tmp_path, capsys):
    rows = [dict(r, rewards=r["reward"]) for r in make_rows([1, 2, 3], 4, model=MODEL)]  # 'rewards': a typo
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    assert load_graded(path).unknown_fields == ("rewards",)
    assert as_graded(rows).unknown_fields == ("rewards",)
    assert any("Did you mean 'reward'?" in n for n in selection_report(rows).notes)
    assert any("Did you mean 'reward'?" in n for n in route(rows, MODEL).notes)
    assert main(["report", str(path)]) == 0
    assert "note: field 'rewards' is ignored" in capsys.readouterr().out


# --------------------------------------------------------------------------- task ids are strings
def test_task_id_1_and_1_as_a_string_are_one_task(tmp_path):
    rows = [{"task_id": 1, "reward": 1.0}, {"task_id": "1", "reward": 0.0}, {"task_id": 2, "reward": 1.0},
            {"task_id": "2", "reward": 1.0}]
    p = pass_at(rows)
    assert p.task_ids == ("1", "2") and p.per_task == {"1": 0.5, "2": 1.0}
    assert load_graded(write_jsonl(tmp_path / "r.jsonl", rows)).task_ids == ("1", "2")
    assert GradedRows.from_arrays([1, "1", 2, "2"], [1, 0, 1, 1]).task_ids == ("1", "2")
    assert GradedRows.from_arrays(np.array([1, 1, 2]), [1, 0, 1]).task_ids == ("1", "2")
    assert wai.split_share(rows) == 0.5
    assert select(rows, "rl").kept_R.tolist() == [0, 1]
    ints = [{"task_id": i, "reward": 1.0} for i in (1, 2)]
    strs = [{"task_id": s, "reward": 0.0} for s in ("1", "2")]
    assert compare(ints, strs).n_tasks == 2 and compare(ints, strs).delta == -1.0


def test_batch_groups_task_1_with_task_1_as_a_string():
    rows = [{"task_id": t, "reward": r, "logprobs": [-0.1]} for t, r in ((1, 1.0), ("1", 0.0), (np.int64(2), 1.0))]
    assert Batch.from_rows(rows).row_fields["task_id"].tolist() == ["1", "1", "2"]


@pytest.mark.parametrize("bad", [1.0, True, [1], {"id": 1}])
def test_a_task_id_that_is_not_a_string_or_integer_is_refused(bad):
    with pytest.raises(BatchError, match="row 0: field 'task_id' is .*a task_id is a string"):
        Batch.from_rows([{"task_id": bad, "reward": 1.0, "logprobs": [-0.1]}])
    with pytest.raises(BatchError, match="row 0: field 'task_id'"):
        pass_at([{"task_id": bad, "reward": 1.0}])


# --------------------------------------------------------------------------- passes() and fails()
def _trainable(passes: list[int], k: int) -> list[dict]:
    return [dict(r, logprobs=[-0.5] * len(r["tokens"])) for r in make_rows(passes, k, model=MODEL)]


def test_passes_and_fails_return_whole_rows_in_order(tmp_path):
    rows = _trainable([1, 0, 2], 2)
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    path.write_text(path.read_text().replace("\n", "\n\n", 1))  # a blank line: rows still line up
    for scored in (load_graded(path), as_graded(rows)):
        assert scored.passes() == [rows[0], rows[4], rows[5]]
        assert scored.fails() == [rows[1], rows[2], rows[3]]
    update = wai.SFT().update(load_graded(path).passes())  # what the methods reference says to push
    assert len(update.coefficients) == 3 and update.admitted.all()


def test_passes_need_a_threshold_for_graded_rewards_and_rows_to_return():
    scored = as_graded(_graded_0_to_10())
    with pytest.raises(ConfigError, match="threshold="):
        scored.passes()
    assert len(scored.passes(threshold=10)) == 6 and len(scored.fails(threshold=10)) == 34
    with pytest.raises(ConfigError, match="built from arrays"):
        GradedRows.from_arrays(["a"], [1.0]).passes()


# --------------------------------------------------------------------------- every bad line, in order
def test_every_bad_line_is_listed_in_file_order_up_to_a_limit(tmp_path):
    good = json.dumps({"task_id": "t", "reward": 1.0})
    lines = [good] + ['{"task_id": "t", "reward": "x"}', "not json", good, '{"reward": 1.0}'] \
        + ['{"task_id": 1.5, "reward": 1.0}'] * (MAX_LISTED + 3)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    for load in (load_graded, load_rows, lambda p: load_graded(p, lines=True, seeds=True)):
        with pytest.raises(BatchError) as err:
            load(path)
        text = str(err.value)
        bad = 2 + MAX_LISTED + 3 if load is load_rows else 3 + MAX_LISTED + 3  # load_rows needs no task_id
        assert text.startswith(f"{path}: {bad} bad rows, in order") and "\n" not in text
        listed = text.split(": ", 2)[2].split(" | ")
        numbers = [int(item.split(":")[0].removeprefix("line ")) for item in listed[:-1]]
        assert numbers[:3] == ([2, 3, 6] if load is load_rows else [2, 3, 5])  # 1-based, as an editor counts
        assert numbers == sorted(numbers) and len(numbers) == MAX_LISTED
        assert listed[-1] == f"and {bad - MAX_LISTED} more"


def test_one_bad_line_keeps_the_one_line_message(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task_id": "t", "reward": 1.0}\n{"task_id": "t", "reward": "one"}\n')
    with pytest.raises(BatchError, match=rf"^{path}, line 2: field 'reward' is 'one' \(str\)"):
        load_graded(path)


def test_dict_rows_are_named_by_their_index_and_all_listed():
    rows = [{"task_id": "a", "reward": 1.0}, {"task_id": "a"}, "x", {"task_id": "a", "reward": float("nan")}]
    with pytest.raises(BatchError) as err:
        pass_at(rows)
    text = str(err.value)
    assert text.startswith("rows: 3 bad rows, in order") and "row 1: field 'reward' is missing" in text
    assert text.index("row 2: a str") < text.index("row 3: field 'reward' is nan")


# --------------------------------------------------------------------------- route above the methods
def test_rows_never_imports_methods_or_routing():
    for path in (SRC / "rows").glob("*.py"):
        tree = ast.parse(path.read_text())
        names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [n for n in names if n.startswith(("whileai.methods", "whileai.routing", "whileai.engine"))], path
    assert not (SRC / "rows" / "route.py").exists() and not hasattr(wai.rows, "route")


def test_wai_route_returns_a_method_object_or_none_never_a_dict():
    assert wai.route is route
    result = route(make_rows([0, 1, 2, 3, 4, 2, 1, 3], 4, model=MODEL), MODEL)
    assert isinstance(result.config, Method) and result.config.rollouts_per_prompt == 4
    assert result.to_dict()["config"]["method"] == "grpo"
    floor = route(make_rows([0] * 6, 4, model=MODEL), MODEL)
    assert isinstance(floor.config, Method) and floor.method == "opsd"
