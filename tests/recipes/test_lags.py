"""The lag table: each cell is its runs' held-out pass@1, its share is per seed over the same method's lag-0
run, the interval is Student's t over seeds, the drift is the runs' recorded metrics, and a finished run is
read back instead of trained again (and a folder holding another run is refused, not overwritten).

The fast tests need no model; the slow one trains builtin:tiny (2 methods x 2 lags x 2 seeds, 4 steps).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

import whileai as wai
from whileai.cli import main
from whileai.errors import ConfigError
from whileai.evidence.lags import (
    AREAL_SHARE,
    LAG_METHODS,
    LAGS,
    _cell,
    lag_arm,
    run_lag_table,
    share_interval,
)
from whileai.evidence.papers import NEVER, recipe
from whileai.evidence.runner import ArmContext, drift_reached

# a tiny budget on builtin:case (14 warm-up steps, lr 1e-2), not the table's default builtin:count
TINY = {"steps": 4, "eval_tasks": 8, "eval_samples": 2, "rollouts_per_step": 16, "taskset": "builtin:case"}


# ----------------------------------------------------------------------------- the rows, no model needed
def test_the_issue_s_lags_methods_and_anchor():
    assert LAGS == (0, 2, 4, 8, 16) and AREAL_SHARE == {8: 0.976, 16: 0.921}
    assert LAG_METHODS == ("flash_reinforce", "sao", "bpco", "grpo", "reinforce")


def test_one_rollout_per_prompt_except_grpo_s_group():
    per_prompt = {m: wai.method(lag_arm(m, 0).method, **lag_arm(m, 0).knobs).run_spec().rollouts_per_prompt
                  for m in LAG_METHODS}
    assert per_prompt == {"flash_reinforce": 1, "sao": 1, "bpco": 1, "grpo": 8, "reinforce": 1}


def test_uncorrected_reinforce_is_the_flash_recipe_s_baseline_and_every_lag_is_allowed():
    for lag in LAGS:
        baseline = recipe("flash_reinforce").arms(ArmContext(lag, 4))[0]
        assert (lag_arm("reinforce", lag).method, dict(lag_arm("reinforce", lag).knobs)) == \
            (baseline.method, dict(baseline.knobs))
        assert lag_arm("reinforce", lag).knobs["trust"] == NEVER
        for m in LAG_METHODS:
            spec = wai.method(lag_arm(m, lag).method, **lag_arm(m, lag).knobs).run_spec()
            assert spec.max_lag is None or spec.max_lag >= lag, (m, lag)


def test_share_interval_is_student_t_over_seeds():
    """Shares 0.9, 1.0, 1.1: mean 1.0, sd 0.1, t(0.975, 2) = 4.3027: half-width 4.3027 * 0.1 / sqrt 3 = 0.2484."""
    lo, hi = share_interval([0.9, 1.0, 1.1])
    assert (lo, hi) == pytest.approx((1.0 - 0.24841, 1.0 + 0.24841), abs=1e-4)
    assert all(math.isnan(v) for v in share_interval([0.8]))  # one seed: no spread to speak of
    assert share_interval([0.1, 1.9])[0] == 0.0  # a share is never below 0


def fake_run(seed: int, after: float, drift: float = 0.0, folder: Path | None = None):
    """A finished run's summary, metrics and (with ``folder``) held-out rows: 20 tasks, the first after * 20 pass."""
    if folder is not None:
        folder.mkdir(parents=True)
        passes = round(after * 20)
        (folder / "heldout.jsonl").write_text("".join(json.dumps({"task_id": f"t{i}", "reward": float(i < passes)})
                                                      + "\n" for i in range(20)))
    return SimpleNamespace(config=SimpleNamespace(seed=seed), summary={"eval_after": {"pass_at_1": after}},
                           metrics=lambda: [{"policy_trained": True, "drift": drift, "admitted_share": 1.0}], dir=folder)


def test_a_cell_s_share_is_per_seed_over_the_same_method_s_lag_zero(tmp_path):
    """Lag 0 scores 0.8 (seed 0) and 0.5 (seed 1); lag 4 scores 0.6 and 0.5: shares 0.75 and 1.0, mean 0.875
    (not the ratio of means, 0.55 / 0.65 = 0.846). A seed whose lag-0 score is 0 has no share. Its verdict against
    lag 0 is compare's paired by seed: deltas -0.2, 0, +0.25 (mean 0.05 / 3), an interval that holds 0."""
    def run(seed, after, drift=0.0, lag=0):
        return fake_run(seed, after, drift, tmp_path / f"lag{lag}-seed{seed}")

    runs = {("grpo", 0): [run(0, 0.8), run(1, 0.5), run(2, 0.0)],
            ("grpo", 4): [run(0, 0.6, 0.1, 4), run(1, 0.5, 0.3, 4), run(2, 0.25, 0.2, 4)]}
    cell = _cell(("grpo", 4), runs, [0, 4])
    assert cell.comparison.paired_seeds == 3 and cell.comparison.seed_delta == pytest.approx(0.05 / 3)
    assert cell.comparison.verdict == "unresolved" and _cell(("grpo", 0), runs, [0, 4]).comparison is None
    assert cell.scores == {0: 0.6, 1: 0.5, 2: 0.25}
    assert cell.shares == {0: pytest.approx(0.75), 1: pytest.approx(1.0)}
    assert cell.share == pytest.approx(0.875) and cell.score == pytest.approx(0.45)
    assert cell.drift == drift_reached(runs["grpo", 4])
    assert cell.drift["drift"] == pytest.approx(0.2) and cell.drift["drift max"] == pytest.approx(0.3)


@pytest.mark.parametrize("bad,match", [({"methods": ["nope"]}, "unknown lag-table method 'nope'"),
                                       ({"methods": "grpo"}, "give a list"),
                                       ({"lags": [0, -1]}, "distinct integers >= 0"),
                                       ({"lags": [0, 2, 2]}, "distinct integers >= 0"),
                                       ({"lags": [2, 4]}, "has no 0: each cell's share is over"),
                                       ({"methods": ["grpo", "GRPO"]}, "names a method twice"),
                                       ({"knobs": {"nope:trust": 1}}, "no method 'nope' in the lag table"),
                                       ({"knobs": {"trust": 0.01}}, "trust"),
                                       ({"lag": 4}, "not lag"),
                                       ({"seed": -1}, "seed=-1: the first seed must be an integer >= 0"),
                                       ({"method": "sao"}, "method"),
                                       ({"eval_tasks": 0}, "eval_tasks")])
def test_bad_requests_are_refused_before_training(bad, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        run_lag_table(seeds=2, run_dir=str(tmp_path / "t"), **bad)
    assert not (tmp_path / "t").exists()


def test_the_loop_s_checks_run_for_every_method_and_lag_before_anything_trains(tmp_path):
    """SAO's critic warm-up (10 steps) leaves no policy step in a 3-step budget: the sweep says so for SAO at
    every lag before the first (FlashReinforce) run starts."""
    with pytest.raises(ConfigError) as caught:
        run_lag_table(methods=["flash_reinforce", "sao"], lags=[0, 2], seeds=2, steps=3, run_dir=str(tmp_path / "t"))
    text = str(caught.value)
    assert "1 problem" in text and "sao at lag 0, sao at lag 2: steps = 3 leaves no policy step" in text
    assert "flash_reinforce" not in text
    assert not (tmp_path / "t").exists()


def test_knobs_reach_only_their_method_and_every_lag():
    """sao:critic_warmup goes to SAO's arm at every lag and nowhere else; a knob with no METHOD goes to every row
    (and a row whose method lacks it is refused when the run is checked); names take '-' for '_'."""
    knobs = {"sao:critic_warmup": 5, "flash-reinforce:trust": 0.01}
    for lag in LAGS:
        assert lag_arm("sao", lag, knobs).knobs == {"critic_warmup": 5}
        assert lag_arm("flash_reinforce", lag, knobs).knobs == {"off_policy_steps": max(8, lag), "trust": 0.01}
        assert lag_arm("reinforce", lag, knobs).knobs["trust"] == NEVER
        assert lag_arm("grpo", lag, knobs).knobs == {}
    assert lag_arm("GRPO", 0, {"temperature": 0.7}).knobs == {"temperature": 0.7}


def test_cli_refuses_bad_lags(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["lags", "--lags", "0,x"])
    assert caught.value.code == 2
    assert "comma-separated integers" in capsys.readouterr().err


# ----------------------------------------------------------------------------- real runs on builtin:tiny
@pytest.mark.slow
def test_a_tiny_sweep_reports_its_runs_and_reads_them_back(tmp_path):
    out = tmp_path / "t"
    table = run_lag_table(methods=["flash_reinforce", "grpo"], lags=[0, 2], seeds=2, run_dir=str(out), **TINY)
    assert table.trained == 8 and len(table.cells) == 4
    for (m, lag), cell in table.cells.items():
        dirs = sorted(out.glob(f"{m.replace('_', '-')}-lag{lag}-seed*"))
        assert len(dirs) == 2
        summaries = {int(d.name[-1]): json.loads((d / "summary.json").read_text()) for d in dirs}
        assert cell.scores == {s: summary["eval_after"]["pass_at_1"] for s, summary in summaries.items()}
        metrics = [json.loads(line) for d in dirs for line in (d / "metrics.jsonl").read_text().splitlines()]
        assert cell.drift["drift max"] == max(r["drift"] for r in metrics if r.get("policy_trained", True))
        config = (dirs[0] / "config.toml").read_text()
        assert f"lag = {lag}\n" in config and "learning_rate = 0.01" in config
    lag0 = table.cells["grpo", 0].scores
    assert table.cells["grpo", 2].shares == {s: v / lag0[s] for s, v in table.cells["grpo", 2].scores.items()
                                             if lag0[s] > 0}
    assert table.cells["flash_reinforce", 0].drift["drift max"] == 0.0  # on-policy: the sampler's weights
    assert table.cells["flash_reinforce", 2].drift["drift max"] > 0.0
    saved = json.loads((out / "lags.json").read_text())
    assert saved["report"] == str(table) and "AReaL decoupled PPO" in saved["report"]

    again = run_lag_table(methods=["flash_reinforce", "grpo"], lags=[0, 2], seeds=2, run_dir=str(out), **TINY)
    assert again.trained == 0
    assert {k: c.to_dict() for k, c in again.cells.items()} == {k: c.to_dict() for k, c in table.cells.items()}

    with pytest.raises(ConfigError, match="holds a run with other settings"):
        run_lag_table(methods=["grpo"], lags=[0, 2], seeds=2, run_dir=str(out), **{**TINY, "steps": 5})
    assert json.loads((out / "grpo-lag0-seed0" / "summary.json").read_text())["steps"] == 4  # left as it was

    Path(out / "grpo-lag2-seed1" / "summary.json").unlink()  # as if stopped after its last checkpoint
    resumed = run_lag_table(methods=["grpo"], lags=[0, 2], seeds=2, run_dir=str(out), **TINY)
    assert resumed.trained == 1 and (out / "grpo-lag2-seed1" / "summary.json").is_file()


@pytest.mark.slow
def test_a_local_model_directory_goes_to_every_run_unchanged(tmp_path):
    """--model PATH reaches wai.train as given; the pinned rate is the loop's for a small loaded model under full
    fine-tuning (1e-3), and the built-in-only critic rate is not applied to it."""
    from whileai.engine.models import build_builtin

    model, tokenizer = build_builtin("tiny")
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    table = run_lag_table(methods=["grpo"], lags=[0, 2], seeds=1, model=str(tmp_path / "model"),
                          run_dir=str(tmp_path / "t"), **{**TINY, "steps": 2})
    # the loop's rule for a small loaded model (an exported built-in, under 100M parameters): 1e-3 (loop.plan.rules)
    assert table.settings["model"] == str(tmp_path / "model") and table.settings["learning_rate"] == 1e-3
    assert "critic_learning_rate" not in table.settings
    for lag in (0, 2):
        saved = (tmp_path / "t" / f"grpo-lag{lag}-seed0" / "config.toml").read_text()
        assert f'model = "{tmp_path / "model"}"' in saved


@pytest.mark.slow
def test_a_stopped_run_is_resumed_a_finished_one_read_back_and_a_foreign_folder_refused(tmp_path):
    """train_or_read: the first call trains; the second reads the same run back (no training); with its summary
    gone (a run stopped after a checkpoint) it is resumed from the checkpoint to the end; a folder holding other
    files, or a run with no checkpoint, is an error naming the folder."""
    from whileai.evidence.plan import train_or_read

    settings = {"method": "grpo", "knobs": {}, "seed": 0, "lag": 2, "steps": 3, "rollouts_per_step": 16,
                "eval_tasks": 4, "eval_samples": 1, "export": False, "progress": False, "save_every": 1,
                "run_dir": str(tmp_path / "run")}
    first, trained = train_or_read(settings)
    assert trained and first.summary["steps"] == 3
    again, trained = train_or_read(settings)
    assert not trained and again.summary == first.summary
    (tmp_path / "run" / "summary.json").unlink()
    resumed, trained = train_or_read(settings)
    assert trained and (tmp_path / "run" / "summary.json").is_file() and resumed.summary["steps"] == 3
    with pytest.raises(ConfigError, match="holds a run with other settings.*'lag': \\(2, 4\\)"):
        train_or_read({**settings, "lag": 4})
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds no run"):
        train_or_read({**settings, "run_dir": str(tmp_path / "junk")})
    assert (tmp_path / "junk" / "notes.txt").read_text() == "mine"
    import shutil
    shutil.rmtree(tmp_path / "run" / "checkpoint")
    (tmp_path / "run" / "summary.json").unlink()
    with pytest.raises(ConfigError, match="stopped before its first checkpoint"):
        train_or_read(settings)


def test_the_table_defaults_to_the_paper_recipes_taskset_at_its_declared_rate():
    """Unless given, the lag table runs builtin:count (the paper recipes' regime) at its declared 1e-3 with 60
    warm-up steps on a built-in model; a taskset given wins."""
    from whileai.evidence.lags import _SETTINGS
    from whileai.evidence.runner import _pinned

    shared = _pinned(_SETTINGS, {"lag": 0})
    assert (shared["taskset"], shared["learning_rate"], shared["warm_start_steps"]) == ("builtin:count", 1e-3, 60)
    assert _pinned(_SETTINGS, {"lag": 0, "taskset": "builtin:case"})["learning_rate"] == 1e-2
