"""The guide's controls: a random-reward and a random-selection arm beside the real one, compared on held-out
pass@1. The slow proofs: the real arm beats its random-reward control on a built-in task, and with the reward
made pure noise the two arms are not told apart."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

import whileai as wai
from whileai.cli import main
from whileai.envs import Taskset, load_taskset
from whileai.loop.controls import RandomRewardTaskset, train_with_controls

SHORT = dict(steps=2, rollouts_per_step=8, warm_start_steps=0, eval_tasks=4, eval_samples=2, export=False)


# ----------------------------------------------------------------------------- the random reward, exactly
def test_random_reward_keeps_held_out_grading_and_draws_training_rewards_from_earned_ones():
    tasks = load_taskset("builtin:case", test_size=4, train_size=40)
    wrapped = RandomRewardTaskset(tasks, seed=3, memory=1000)
    test_task = tasks.split("test")[0]
    for completion in ("abcd", "AB", "zz9z"):  # held out: the real grader, every time
        assert wrapped.grade(test_task, completion) == tasks.grade(test_task, completion)
    train = tasks.split("train")
    completions = ["abcd", "abc", "ab", "a", "", "ABCD"] * 20
    earned, drawn = [], []
    for i, text in enumerate(completions):
        task = train[i % len(train)]
        earned.append(tasks.grade(task, text))
        drawn.append(wrapped.grade(task, text))
    # the first draw is its own reward; every later one is a reward earned earlier (never this one's alone)
    assert drawn[0] == earned[0]
    assert all(d in earned[:i] for i, d in enumerate(drawn) if i)
    # uncoupled from the completion: the reward of "abcd" (1.0) is not what "abcd" rows get back
    own = [d for d, e in zip(drawn, earned) if e == 1.0]
    assert 0.1 < sum(1 for d in own if d == 1.0) / len(own) < 0.5
    # the same distribution: each value's share among the draws is within 0.12 of its share among earned
    shares_e, shares_d = Counter(earned), Counter(drawn)
    assert all(abs(shares_e[v] - shares_d[v]) / len(earned) < 0.12 for v in shares_e)
    assert wrapped.max_tokens == tasks.max_tokens and wrapped.split("train") == train


def test_on_rows_the_random_reward_control_permutes_the_rows_rewards_and_nothing_else():
    from whileai.loop.controls import _control_arm

    rows = [{"task_id": f"t{i}", "prompt": "ab", "completion": "x" * i, "reward": float(i)} for i in range(20)]
    arm = _control_arm("random-reward", {"rows": rows, "method": "sft"}, None, None, seed=2)
    shuffled = arm["rows"]
    assert sorted(r["reward"] for r in shuffled) == [r["reward"] for r in rows]  # the same rewards
    assert [{**r, "reward": 0} for r in shuffled] == [{**r, "reward": 0} for r in rows]  # the same rows
    assert sum(a["reward"] != b["reward"] for a, b in zip(shuffled, rows)) >= 15  # moved
    assert arm["method"] == "sft" and rows[3]["reward"] == 3.0  # the input is not touched


# ----------------------------------------------------------------------------- bad requests
@pytest.mark.parametrize(("controls", "kwargs", "says"), [
    (["random-rewards"], {}, "give a list of one or more of 'random-reward', 'random-selection'"),
    ("random-reward", {}, "give a list of one or more"),
    (["random-selection"], {}, "give the selected rows (rows=, --rows KEPT) and the pool"),
    (["random-reward"], {"select_from": "pool.jsonl"}, "select_from is read only by the random-selection"),
    (["random-reward"], {"seeds": 0}, "need at least one seed"),
    (["random-reward"], {"seeds": [1, 1]}, "each a distinct integer"),
])
def test_a_bad_request_is_refused_before_any_model_is_built(tmp_path, controls, kwargs, says):
    with pytest.raises(wai.ConfigError) as err:
        train_with_controls(controls, run_dir=str(tmp_path / "c"), **kwargs)
    assert says in str(err.value)
    assert not (tmp_path / "c").exists()


def test_random_selection_refuses_pairs_and_a_pool_smaller_than_the_selection(tmp_path):
    kept = [{"prompt": "ab", "completion": "ab", "task_id": "t"}] * 3
    with pytest.raises(wai.ConfigError, match="select_from holds only 2"):
        train_with_controls(["random-selection"], rows=kept, select_from=kept[:2], method="sft",
                            taskset="builtin:case", run_dir=str(tmp_path / "c"), **SHORT)
    pairs = [{**kept[0], "pair": 0, "chosen": True}, {**kept[0], "pair": 0, "chosen": False}]
    with pytest.raises(wai.ConfigError, match="preference pairs"):
        train_with_controls(["random-selection"], rows=pairs, select_from=kept, method="dpo",
                            taskset="builtin:case", run_dir=str(tmp_path / "c"), **SHORT)
    with pytest.raises(wai.ConfigError, match="--eval-taskset with --rows"):
        train_with_controls(["random-selection"], rows=kept, select_from=kept, method="sft",
                            run_dir=str(tmp_path / "c"), **SHORT)
    assert not (tmp_path / "c").exists()


def test_cli_refuses_resume_with_a_control_and_an_unknown_control(capsys):
    assert main(["train", "--resume", "runs/x", "--control", "random-reward"]) == 2
    assert "--resume cannot take --control" in capsys.readouterr().err
    with pytest.raises(SystemExit) as code:
        main(["train", "--control", "random"])
    assert code.value.code == 2
    err = capsys.readouterr().err
    assert "argument --control: invalid choice: 'random'" in err and "random-selection" in err


# ----------------------------------------------------------------------------- one short controlled run
def test_a_controlled_run_trains_each_arm_on_one_budget_and_records_the_comparison(tmp_path):
    report = train_with_controls(["random-reward"], seeds=[4], run_dir=str(tmp_path / "c"), **SHORT)
    real, control = report.runs["real"][0], report.runs["random-reward"][0]
    assert (real.dir, control.dir) == (tmp_path / "c" / "real-seed4", tmp_path / "c" / "random-reward-seed4")
    assert real.config.seed == control.config.seed == 4
    assert real.summary["resolved"] == control.summary["resolved"]
    assert control.config.taskset == "<taskset passed in Python>"
    # the held-out rows compared are the runs' own: 4 tasks x 2 samples each
    for run in (real, control):
        rows = [json.loads(x) for x in (run.dir / "heldout.jsonl").read_text().splitlines()]
        assert len(rows) == 8 and len({r["task_id"] for r in rows}) == 4
        assert run.summary["eval_after"]["pass_at_1"] == pytest.approx(wai.pass_at(rows, threshold=1.0).pass_at_1)
    comparison = report.comparisons["random-reward"]
    expected = wai.compare(control.dir / "heldout.jsonl", real.dir / "heldout.jsonl", threshold=1.0)
    assert comparison.delta == pytest.approx(expected.delta) and comparison.ci95 == pytest.approx(expected.ci95)
    saved = json.loads((tmp_path / "c" / "controls.json").read_text())
    assert saved["comparisons"]["random-reward"]["delta"] == pytest.approx(comparison.delta)
    assert (tmp_path / "c" / "controls.txt").read_text().strip() == str(report)
    assert "1 seed per arm (4)" in str(report)


# ----------------------------------------------------------------------------- the proofs (slow)
PROOF = dict(steps=40, eval_tasks=64, eval_samples=4, export=False)


@pytest.mark.slow
def test_the_real_arm_beats_its_random_reward_control(tmp_path):
    report = train_with_controls(["random-reward"], seeds=2, run_dir=str(tmp_path / "c"), **PROOF)
    c = report.comparisons["random-reward"]
    print(report)
    assert c.ci95[0] > 0.2 and c.verdict == "gain shown"


def _noise_on_train(spec: str) -> Taskset:
    """The built-in task with pure-noise training rewards; held-out tasks keep the real grader."""
    real = load_taskset(spec)
    held_out = {t.task_id for t in real.split("test")}
    rng = random.Random(0)

    def grader(task, completion):
        return real.grade(task, completion) if task.task_id in held_out else rng.random()

    return Taskset(f"{spec} (noise)", real.split("train"), real.split("test"), grader, real.max_tokens)


@pytest.mark.slow
def test_with_a_pure_noise_reward_the_arms_are_not_told_apart(tmp_path):
    report = train_with_controls(["random-reward"], seeds=2, taskset=_noise_on_train("builtin:case"),
                                 warm_start_steps=14, run_dir=str(tmp_path / "c"), **PROOF)
    c = report.comparisons["random-reward"]
    print(report)
    assert c.ci95[0] <= 0 <= c.ci95[1] and c.verdict == "unresolved"
    assert "does not beat its random-reward control" in str(report)


@pytest.mark.slow
def test_sft_on_selected_passes_beats_sft_on_a_random_subset_of_the_same_size(tmp_path):
    tasks = load_taskset("builtin:case")
    rng = random.Random(1)
    pool = []
    for task in tasks.split("train")[:400]:  # a pass (the reference answer) or a fail (digits) per task
        text = str(task.answer) if rng.random() < 0.3 else "".join(rng.choice("0123456789") for _ in range(4))
        pool.append({"task_id": task.task_id, "prompt": task.prompt, "completion": text,
                     "reward": tasks.grade(task, text)})
    kept = list(wai.select(pool, mode="sft", threshold=1.0))
    report = train_with_controls(["random-selection"], seeds=2, method="sft", rows=kept, select_from=pool,
                                 taskset="builtin:case", warm_start_steps=0, run_dir=str(tmp_path / "c"),
                                 **{**PROOF, "steps": 30})
    print(report)
    assert report.comparisons["random-selection"].verdict == "gain shown"
    assert len(report.runs["random-selection"]) == 2


@pytest.mark.slow
def test_the_cli_runs_a_control_and_prints_the_comparison(tmp_path, capsys):
    code = main(["train", "--control", "random-reward", "--control-seeds", "1", "--steps", "4", "--eval-tasks", "8",
                 "--no-export", "--no-progress", "--run-dir", str(tmp_path / "c")])
    out = capsys.readouterr().out
    assert code == 0
    assert "random-reward  random-reward, " in out and "1 seed per arm (0)" in out
    assert out.strip().endswith(Path(tmp_path / "c" / "controls.txt").read_text().strip())


def test_the_checks_before_a_run_do_not_feed_the_random_reward_controls_draws():
    """The grader probe before the warm start grades through the control's wrapper; its grades are no training
    rollouts, so the control's draws must be those of a wrapper the probe never touched (they were not: seeded
    with the probe's reference answers, seed 0's random-reward arm of the proof above collapsed to 0.008)."""
    from whileai.loop.plan import inputs

    tasks = load_taskset("builtin:case", test_size=4, train_size=40)
    probed, fresh = RandomRewardTaskset(tasks, seed=5), RandomRewardTaskset(tasks, seed=5)
    assert inputs.grader_probe(probed) == ([], [])
    train = tasks.split("train")
    completions = ["abcd", "ab", "", "x", "ABCD"] * 8
    assert [probed.grade(train[i], c) for i, c in enumerate(completions)] == \
        [fresh.grade(train[i], c) for i, c in enumerate(completions)]
