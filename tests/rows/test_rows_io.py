"""Loading graded rows: good files load exactly, bad lines fail with file, line, field and fix."""

from __future__ import annotations

import json
import os
import tracemalloc

import numpy as np
import pytest

from whileai import BatchError
from whileai.rows.io import GradedRows, as_graded, atomic_write, iter_rows, load_graded, load_rows

from ._rowkit import make_rows, write_jsonl


def test_load_rows_round_trips_and_skips_blank_lines(tmp_path):
    rows = make_rows([1, 0], 2)
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in rows[1:]))
    assert load_rows(path) == rows
    assert list(iter_rows(path, fields=("task_id", "reward"))) == [
        {"task_id": r["task_id"], "reward": r["reward"]} for r in rows]


def test_load_graded_columns_by_hand(tmp_path):
    # tasks in first-seen order: b -> 0, a -> 1; model "m" -> 0, a row without model -> -1
    path = write_jsonl(tmp_path / "r.jsonl", [
        {"task_id": "b", "reward": 1, "model": "m"},
        {"task_id": "a", "reward": 0.25, "truncated": True},
        {"task_id": "b", "reward": 0.0, "model": "m", "logprobs": [-0.1] * 1000},
    ])
    graded = load_graded(path, lines=True)
    assert graded.task_ids == ("b", "a")
    assert graded.task_R.tolist() == [0, 1, 0]
    assert graded.reward_R.tolist() == [1.0, 0.25, 0.0]
    assert graded.truncated_R.tolist() == [False, True, False]
    assert graded.models == ("m",) and graded.model_R.tolist() == [0, -1, 0]
    assert graded.line_R is not None and graded.line_R.tolist() == [1, 2, 3]


@pytest.mark.parametrize("line, field, says", [
    ('{"task_id": "t", "reward": 1.0', None, "not valid JSON"),
    ('[1, 2]', None, "JSON object was expected"),
    ('{"reward": 1.0}', "'task_id' is missing", "rows of one prompt share it"),
    ('{"task_id": "t"}', "'reward' is missing", "grade the row first"),
    ('{"task_id": "t", "reward": "abc"}', "'reward' is 'abc' (str)", "must be a number"),
    ('{"task_id": "t", "reward": true}', "'reward' is True (bool)", "must be a number"),
    ('{"task_id": "t", "reward": NaN}', "'reward' is nan", "must be finite"),
    ('{"task_id": "t", "reward": 1.0, "truncated": "yes"}', "'truncated' is 'yes'", "true or false"),
    ('{"task_id": [1], "reward": 1.0}', "'task_id' is [1]", "a task_id is a string"),
    ('{"task_id": 1.5, "reward": 1.0}', "'task_id' is 1.5 (float)", "a task_id is a string"),
    ('{"task_id": "t", "reward": 1.0, "model": 2.0}', "'model' is 2.0 (float)", "a model is a string"),
])
def test_bad_line_names_file_line_field_and_fix(tmp_path, line, field, says):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task_id": "t", "reward": 0.0}\n\n' + line + "\n")
    with pytest.raises(BatchError) as err:
        load_graded(path)
    message = str(err.value)
    assert f"{path}, line 3:" in message  # line 2 is blank and still counted
    assert says in message and ("Fix" in message or "fix" in message)
    if field:
        assert field in message


def test_load_rows_checks_types_where_present_and_required(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"reward": 1.0}\n{"reward": "x"}\n')
    with pytest.raises(BatchError, match=r"r.jsonl, line 2: field 'reward' is 'x'"):
        load_rows(path)
    path.write_text('{"reward": 1.0}\n')
    with pytest.raises(BatchError, match=r"line 1: field 'task_id' is missing"):
        load_rows(path, require=("task_id", "reward"))


def test_as_graded_from_dicts_names_the_row():
    with pytest.raises(BatchError, match=r"row 1: field 'reward' is None"):
        as_graded([{"task_id": "a", "reward": 1.0}, {"task_id": "a", "reward": None}])
    with pytest.raises(BatchError, match="no rows"):
        as_graded([])


def test_empty_file_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(BatchError, match="no rows"):
        load_graded(path)


def test_parquet_loads_like_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = make_rows([2, 0, 3], 3, truncated_passes=1)
    jsonl = write_jsonl(tmp_path / "r.jsonl", rows)
    parquet = tmp_path / "r.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    a, b = load_graded(jsonl, lengths=True), load_graded(parquet, lengths=True)
    for name in ("task_R", "reward_R", "truncated_R", "model_R", "length_R"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.task_ids == b.task_ids
    assert load_rows(parquet) == rows
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"task_id": "t", "reward": "1.0"}, {"task_id": "t", "reward": "x"}]), bad)
    with pytest.raises(BatchError, match=r"bad.parquet: 2 bad rows, in order .*: row 1: field 'reward' is '1.0' "
                                         r"\(str\).* \| row 2: field 'reward' is 'x'"):
        load_graded(bad)
    pq.write_table(pa.Table.from_pylist([{"reward": 1.0}]), bad)
    with pytest.raises(BatchError, match=r"bad.parquet, row 1: field 'task_id' is missing"):
        load_graded(bad)
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(BatchError, match=r"bad.parquet: not a readable Parquet file .* Fix:"):
        load_graded(bad)


def test_bytes_that_are_not_utf8_name_their_line(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'{"task_id": "a", "reward": 1.0}\n' * 3 + b'{"task_id": "caf\xe9", "reward": 0.0}\n')
    for load in (load_graded, load_rows):
        with pytest.raises(BatchError, match=r"latin.jsonl, line 4: not UTF-8 text .* Fix: write the file as UTF-8"):
            load(path)


def test_atomic_write_leaves_old_file_and_no_temp_on_error(tmp_path):
    out = tmp_path / "kept.jsonl"
    out.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_write(out) as handle:
        handle.write("half of the new file\n")
        raise RuntimeError("failed mid-write")
    assert out.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["kept.jsonl"]
    with atomic_write(out) as handle:
        handle.write("new\n")
    assert out.read_text() == "new\n" and os.listdir(tmp_path) == ["kept.jsonl"]


def test_columns_stay_small_when_rows_carry_long_token_lists(tmp_path):
    """1,500 rows of 400 log-probabilities each: the file is ~5 MB, the columns ~30 KB, and the
    peak while loading is one parsed line plus the columns, far under the file size."""
    tail = json.dumps({"reward": 1.0, "logprobs": [-0.123456] * 400})[1:]
    path = tmp_path / "long.jsonl"
    path.write_text("".join(f'{{"task_id": "t{i % 100}", {tail}\n' for i in range(1500)))
    size = path.stat().st_size
    tracemalloc.start()
    graded = load_graded(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert isinstance(graded, GradedRows) and graded.n_rows == 1500 and graded.n_tasks == 100
    assert peak < size / 20, (peak, size)
