"""The end-of-run sentence (``no_gain_reason``) says only what the run measured: each claim on a run built to
show it (real runs where one is cheap to build, the metrics of issue 30's runs where not)."""

from __future__ import annotations

import json
from pathlib import Path

from test_preflight import no_signal_taskset, steps

import whileai as wai
from whileai.loop.hooks.preflight import no_gain_reason

RUN = dict(rollouts_per_step=16, eval_tasks=8, eval_samples=2, progress=False, export=False, threads=1)


def test_a_run_whose_every_rollout_passed_is_told_nothing_was_left_to_learn(tmp_path: Path):
    """Every answer is 'y': after the warm start every rollout passes, every reward is 1 (issue 30: such a run was
    told 'more steps, or a higher learning rate')."""
    tasks = tmp_path / "yes.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"{i:03d}?", "answer": "y"}) + "\n" for i in range(100)))
    run = wai.train(taskset=str(tasks), warm_start_steps=60, steps=4, run_dir=str(tmp_path / "r"), **RUN)
    assert all(r["pass_rate"] == 1.0 for r in run.metrics())
    assert run.summary["no_gain_reason"].startswith("rollouts passed 100.0% of the time over 4 steps after a warm "
                                                    "start of 60 steps: nothing was left for RL to learn")
    assert "higher" not in run.summary["no_gain_reason"]


def test_a_run_that_never_passed_after_a_short_warm_start_is_offered_a_longer_one(tmp_path: Path):
    run = wai.train(taskset=str(no_signal_taskset(tmp_path / "secret.jsonl")), warm_start_steps=3, steps=2,
                    force=True, run_dir=str(tmp_path / "r"), **RUN)
    assert run.summary["no_gain_reason"].startswith("reward was 0 on every one of 2 steps: no rollout ever passed")
    assert "a longer warm start than its 3 steps" in run.summary["no_gain_reason"]


def test_held_out_that_rose_without_a_resolved_interval_is_not_blamed_on_the_rate():
    """sort3 in issue 30: training reward fell from its warm-started high while held-out rose 0.789 -> 0.801; the
    old sentence said the updates undid what the model knew."""
    records = steps(40, reward=lambda k: 0.97 if k < 8 else 0.85, pass_rate=lambda k: 0.9, learning_rate=1e-3)
    compare = {"before": 0.789, "after": 0.801, "delta": 0.012, "ci95": [-0.028, 0.051], "excludes_zero": False,
               "tasks": 64}
    reason = no_gain_reason(records, compare)
    assert reason.startswith("held-out pass@1 rose +0.012 (0.789 -> 0.801) but its 95% interval [-0.028, +0.051] "
                             "includes 0")
    assert "undid" not in reason
    fell = {**compare, "after": 0.70, "delta": -0.089, "ci95": [-0.15, -0.03]}
    assert "held-out pass@1 went 0.789 -> 0.700: the updates undid" in no_gain_reason(records, fell)


def test_a_warm_start_that_left_the_model_near_chance_is_named_not_the_held_out_count():
    """addmod in the lead's newcomer review: the warm start ended with held-out 0.109 (chance for one of ten
    digits), RL moved it +0.02 unresolved, and the sentence asked for more held-out tasks."""
    records = steps(40, reward=lambda k: 0.11, pass_rate=lambda k: 0.11, learning_rate=1e-3)
    compare = {"before": 0.109, "after": 0.129, "delta": 0.02, "ci95": [-0.03, 0.07], "excludes_zero": False,
               "tasks": 64}
    reason = no_gain_reason(records, compare, warm_start_steps=2400)
    assert reason.startswith("the warm start of 2400 steps left held-out pass@1 at 0.109"), reason
    assert "more held-out tasks" not in reason
    # a warm start that taught the task (held-out 0.789) keeps the unresolved-gain sentence
    assert "is not resolved" in no_gain_reason(records, {**compare, "before": 0.789, "after": 0.809},
                                               warm_start_steps=2400)
