"""A bad config fails before any model loads, listing every problem with its key and a fix."""

from __future__ import annotations

from pathlib import Path

import pytest

import whileai as wai
from whileai.cli import main
from whileai.loop.config import TrainConfig, build, field_docs


def test_every_field_has_a_doc_line_and_the_toml_round_trips(tmp_path: Path):
    docs = field_docs()
    assert set(docs) == set(TrainConfig.__dataclass_fields__)
    path = tmp_path / "run.toml"
    path.write_text('[train]\nmethod = "grpo"\nsteps = 7\nknobs = {generations = 4}\nlearning_rate = 0.001\n')
    config = build(str(path), steps=9, knobs={"clip": 0.3})
    assert (config.method, config.steps, config.learning_rate) == ("grpo", 9, 0.001)  # the flag wins
    assert config.knobs == {"generations": 4, "clip": 0.3}  # tables merge key by key


def test_unknown_keys_and_wrong_types_are_all_listed(tmp_path: Path):
    path = tmp_path / "run.toml"
    path.write_text('stpes = 3\nlag = "two"\nseed = 1.5\n')
    with pytest.raises(wai.ConfigError) as info:
        build(str(path), learning_rat=0.1)
    text = str(info.value)
    assert "4 problems" in text
    assert "unknown key 'stpes'; did you mean 'steps'?" in text
    assert "lag = 'two' is a string; it must be an integer or left out (None)" in text
    assert "seed = 1.5" in text and "learning_rat" in text


def test_impossible_combinations_fail_before_a_model_loads(tmp_path: Path):
    run_dir = tmp_path / "never"
    with pytest.raises(wai.ConfigError) as info:
        # a model that does not exist: if anything tried to load it, the error would be another one
        wai.train(method="grpo", knobs={"generations": 1}, rollouts_per_step=3, lag=0, model="./no-such-model",
                  run_dir=str(run_dir), steps=2)
    assert "every advantage 0" in str(info.value) and "generations=2" in str(info.value)
    assert not run_dir.exists()
    with pytest.raises(wai.ConfigError) as info:
        wai.train(method="flash_reinforce", lag=9, model="./no-such-model", run_dir=str(run_dir))
    assert "lag = 9 is beyond the 8 steps" in str(info.value)
    with pytest.raises(wai.ConfigError) as info:
        wai.train(method="sao", steps=5, model="./no-such-model", run_dir=str(run_dir))
    assert "warm-up" in str(info.value)
    with pytest.raises(wai.ConfigError) as info:
        wai.train(method="sft", model="./no-such-model", run_dir=str(run_dir))
    assert "--rows" in str(info.value) and "lag" not in str(info.value)  # a rows method's lag defaults to 0
    with pytest.raises(wai.ConfigError, match="there is no sampler to lag"):
        wai.train(method="sft", rows=[{"prompt": "a", "completion": "b"}], lag=2, run_dir=str(run_dir))
    assert not run_dir.exists()


def test_a_start_that_fails_leaves_no_run_behind_and_bad_rows_are_listed(tmp_path: Path):
    run_dir = tmp_path / "run"
    with pytest.raises(wai.ConfigError, match="does not exist"):  # the model fails to load after the dir is made
        wai.train(model="./no-such-model", run_dir=str(run_dir), progress=False)
    assert not run_dir.exists()
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "a", "completion": "b"}\nnot json\n[1, 2]\n')
    with pytest.raises(wai.BatchError) as info:  # a bad row is a BatchError (DESIGN.md, "A row")
        wai.train(method="sft", rows=str(rows), run_dir=str(run_dir))
    assert "line 2: not valid JSON" in str(info.value) and "line 3: a list" in str(info.value)
    assert not run_dir.exists()
    mine = tmp_path / "mine"  # a folder the user already had: a failed start removes only what it wrote
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(wai.ConfigError, match="does not exist"):
        wai.train(model="./no-such-model", run_dir=str(mine), progress=False)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_a_toml_file_mixing_a_train_table_and_top_level_keys_is_refused(tmp_path: Path):
    path = tmp_path / "run.toml"
    path.write_text('steps = 3\n[train]\nlag = 0\n')
    with pytest.raises(wai.ConfigError, match="top-level keys"):
        build(str(path))


def test_the_cli_prints_one_error_and_exits_2(capsys, tmp_path: Path):
    code = main(["train", "--method", "grpo", "--set", "generations=1", "--lag", "0", "--run-dir",
                 str(tmp_path / "x"), "--model", "./no-such-model"])
    err = capsys.readouterr().err
    assert code == 2 and "ConfigError" in err and "generations" in err and "Traceback" not in err
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no config.toml there" in capsys.readouterr().err
