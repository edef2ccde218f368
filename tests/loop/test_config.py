"""A bad config fails before any model loads, listing every problem with its key and a fix."""

from __future__ import annotations

from pathlib import Path

import pytest

import whileai as wai
from whileai.cli import main
from whileai.loop.plan.config import TrainConfig, build, check_ranges, field_docs
from whileai.methods.run_spec import RunSpec


def test_every_field_has_a_doc_line_and_the_toml_round_trips(tmp_path: Path):
    docs = field_docs()
    assert set(docs) == set(TrainConfig.__dataclass_fields__)
    path = tmp_path / "run.toml"
    path.write_text('[train]\nmethod = "grpo"\nsteps = 7\nknobs = {rollouts_per_prompt = 4}\nlearning_rate = 0.001\n')
    config = build(str(path), steps=9, knobs={"clip": 0.3})
    assert (config.method, config.steps, config.learning_rate) == ("grpo", 9, 0.001)  # the flag wins
    assert config.knobs == {"rollouts_per_prompt": 4, "clip": 0.3}  # tables merge key by key


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
        wai.train(method="grpo", knobs={"rollouts_per_prompt": 1}, rollouts_per_step=3, lag=0, model="./no-such-model",
                  run_dir=str(run_dir), steps=2)
    assert "every advantage 0" in str(info.value) and "rollouts_per_prompt=2" in str(info.value)
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
    code = main(["train", "--method", "grpo", "--set", "rollouts_per_prompt=1", "--lag", "0", "--run-dir",
                 str(tmp_path / "x"), "--model", "./no-such-model"])
    err = capsys.readouterr().err
    assert code == 2 and "ConfigError" in err and "rollouts_per_prompt" in err and "Traceback" not in err
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no config.toml there" in capsys.readouterr().err


# ----------------------------------------------------------------------------- settings left empty
def test_the_learning_rate_rule_is_one_function_with_its_source():
    """The method's declared rate first; a built-in model: the taskset's recommendation, else 1e-2 (random init);
    a loaded model: 2e-4 under LoRA, 1e-5 for full fine-tuning. The rule says where its value came from."""
    from whileai.envs import Recommended
    from whileai.loop.plan.run_plan import learning_rate_rule

    class Declares:
        def __init__(self, rate):
            self.rate = rate

        def run_spec(self):
            return RunSpec(learning_rate=self.rate)

    class Tasks:
        max_tokens = None

        def __init__(self, rate):
            self.recommended = Recommended(learning_rate=rate)

    cases = [  # (model, lora_rank, declared, recommended) -> (rate, source)
        (("builtin:tiny", 0, None, None), (1e-2, "model rule")), (("builtin:tiny", 4, None, None), (1e-2, "model rule")),
        (("builtin:tiny", 0, None, 1e-3), (1e-3, "taskset")), (("builtin:tiny", 0, 5e-5, 1e-3), (5e-5, "method")),
        (("./my-model", 8, None, None), (2e-4, "model rule")), (("./my-model", 0, None, None), (1e-5, "model rule")),
        (("./my-model", 0, None, 1e-3), (1e-5, "model rule")),  # a recommendation is for a random-init model only
        (("./my-model", 8, 3e-6, None), (3e-6, "method")),
    ]
    for (model, rank, declared, recommended), want in cases:
        config = build(model=model, lora_rank=rank)
        got = learning_rate_rule(config, Declares(declared), Tasks(recommended), {})
        assert got == want, (model, rank, declared, recommended)


def test_a_tasksets_recommendation_fills_only_the_fields_left_empty():
    """builtin:lookup on a built-in model gets its measured settings; each value the user gives wins alone; a
    loaded model, or a run on rows, gets the loop's rules; builtin:case keeps the embedded default run's."""
    from whileai.envs import load_taskset
    from whileai.loop.plan.run_plan import make_plan

    def resolve(config, taskset, declared_learning_rate=None):
        class Declares:
            def run_spec(self):
                return RunSpec(learning_rate=declared_learning_rate)
        return make_plan(config, {}, Declares(), taskset)

    keys = ("steps", "warm_start_steps", "warm_start_learning_rate", "learning_rate", "lag")
    lookup, case = load_taskset("builtin:lookup"), load_taskset("builtin:case")
    got = resolve(build(taskset="builtin:lookup", lag=2), lookup)
    assert (got.steps, got.warm_start_steps, got.warm_start_learning_rate, got.learning_rate, got.lag) == \
        (60, 200, 3e-3, 1e-3, 2)
    for name, value in (("steps", 7), ("warm_start_steps", 3), ("warm_start_learning_rate", 0.5),
                        ("learning_rate", 0.25)):
        mine = resolve(build(taskset="builtin:lookup", **{name: value}), lookup)
        assert getattr(mine, name) == value and mine.source(name) == "user"
        base = resolve(build(taskset="builtin:lookup"), lookup)
        assert {k: getattr(mine, k) for k in keys if k != name} == {k: getattr(base, k) for k in keys if k != name}
    loaded = resolve(build(taskset="builtin:lookup", model="./my-model"), lookup)
    assert (loaded.steps, loaded.warm_start_steps, loaded.warm_start_learning_rate, loaded.learning_rate) == \
        (40, 0, 1e-2, 1e-5)
    on_rows = resolve(build(rows="traces.jsonl", taskset=None, eval_taskset="builtin:lookup"), lookup)
    assert (on_rows.steps, on_rows.warm_start_steps, on_rows.learning_rate) == (40, 0, 1e-2)
    default = resolve(build(), case)
    assert (default.steps, default.warm_start_steps, default.warm_start_learning_rate, default.learning_rate) == \
        (40, 14, 1e-2, 1e-2)
    assert [default.source(k) for k in ("steps", "warm_start_steps", "learning_rate")] == \
        ["default", "taskset", "model rule"]
    assert resolve(build(method="grpo"), case, declared_learning_rate=3e-4).learning_rate == 3e-4


def test_a_bad_recommendation_is_refused_naming_the_field():
    from whileai.envs import Recommended

    with pytest.raises(wai.ConfigError, match=r"warm_start_steps=-1 must be an integer >= 0; learning_rate=0 must be"):
        Recommended(warm_start_steps=-1, learning_rate=0)


def test_a_rate_far_above_the_range_gets_no_nonsense_suggestion():
    far = " ".join(check_ranges(build(None, learning_rate=1e9)))
    assert "is above" in far and "e-3?" not in far
    assert "(did you mean 3e-3?)" in " ".join(check_ranges(build(None, learning_rate=3)))
