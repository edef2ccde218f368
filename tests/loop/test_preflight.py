"""The preflight (whileai.loop.hooks.preflight): the signal numbers of a probe, hand-worked, and `fatal` with its
reason and fixes exactly when the update would be empty; `no_gain_reason` on finished runs' metrics."""

import json
import math
import random

import pytest

from whileai.loop.hooks.preflight import Preflight, no_gain_reason, preflight
from whileai.loop.plan import rules
from whileai.methods.registry import method

ONE = method("flash_reinforce").run_spec()    # one rollout per prompt, a batch baseline
GROUP = method("grpo").run_spec()             # 8 per prompt, at least 2


def rows(*groups):
    """Rows with rewards, one group (a task id) per argument: rows([0, 1], [0, 0]) -> t0: 0, 1; t1: 0, 0."""
    return [{"task_id": f"t{k}", "reward": float(r)} for k, g in enumerate(groups) for r in g]


# ------------------------------------------------------------------------------------- the numbers
def test_the_signal_numbers_by_hand():
    # t0 = [0, 1], t1 = [0, 0], t2 = [1, 0.5]: passes in t0 and t2 -> 2/3 of the tasks, 2/6 of the rollouts;
    # groups split: t0 and t2 -> 2/3; mean 2.5/6 = 0.4167; population sd: sqrt(mean(r^2) - mean^2)
    report = preflight(rows([0, 1], [0, 0], [1, 0.5]), GROUP, cap=5, answer_lengths=[2, 4, 5])
    assert (report.rollouts, report.tasks) == (6, 3)
    assert report.task_pass_share == pytest.approx(2 / 3) and report.pass_rate == pytest.approx(2 / 6)
    assert report.split_group_share == pytest.approx(2 / 3)
    assert report.mean_reward == pytest.approx(2.5 / 6)
    assert report.reward_spread == pytest.approx(math.sqrt(2.25 / 6 - (2.5 / 6) ** 2))
    # answers + EOS (3, 5, 6) under a cap of 5: 3 and 5 fit, 6 does not -> 2/3, a note, not fatal
    assert report.longest_answer == 5 and report.answers_within_cap == pytest.approx(2 / 3)
    assert report.ok and report.notes == ("33% of the reference answers do not fit under the cap of 5 tokens "
                                          "(longest 5, + EOS)",)


def test_a_one_rollout_method_reports_no_groups_and_partial_credit_is_a_signal():
    report = preflight(rows([0.25], [0.5], [0.0]), ONE)
    assert report.split_group_share is None and report.pass_rate == 0.0
    assert report.ok  # no pass, but the rewards differ: a batch baseline has a gradient


def test_str_and_to_dict():
    report = preflight(rows([0], [0]), ONE, cap=8192, answer_lengths=[1], warm_start_steps=0, random_init=True)
    text = str(report)
    assert text.startswith("preflight: NO SIGNAL: 2 rollouts over 2 tasks") and "cap 8192 vs longest answer 1" in text
    out = report.to_dict()
    assert json.loads(json.dumps(out)) == out and out["ok"] is False
    assert out["fatal"][0]["reason"].startswith("no rollout passed")
    assert "--force" in report.stop_message()


# ------------------------------------------------------------------------------------- fatal
def test_no_pass_is_fatal_with_a_warm_start_a_lower_cap_and_more_rollouts():
    report = preflight(rows(*[[0]] * 32), ONE, cap=8192, answer_lengths=[1, 1], warm_start_steps=0,
                       random_init=True)
    (fatal,) = report.fatal
    assert fatal.reason == ("no rollout passed: all 32 probe rows over 32 tasks earned reward 0, so every "
                            "advantage is 0 and every update is empty")
    assert fatal.fixes[0].startswith("a supervised warm start") and fatal.fixes[1].startswith("a lower cap (--max-tokens 3")
    assert "below 0.09 at 95%" in fatal.fixes[2]  # 3 / 32, the rule of three


def test_a_longer_warm_start_when_there_was_one_and_none_for_a_loaded_model():
    """A warm start that ran and left no pass: the fix names a longer one with the steps it had (a newcomer who
    shortened it got no such hint); a loaded model is offered no warm start at all."""
    (fatal,) = preflight(rows([0], [0]), ONE, cap=3, answer_lengths=[1], warm_start_steps=20,
                         random_init=True).fatal
    assert fatal.fixes[0] == "a longer warm start (--warm-start-steps N; this run had 20)"
    assert not any("supervised warm start" in f or "lower cap" in f for f in fatal.fixes)
    (fatal,) = preflight(rows([0], [0]), ONE, cap=3, answer_lengths=[1], warm_start_steps=0,
                         random_init=False).fatal
    assert not any("warm start" in f or "lower cap" in f for f in fatal.fixes)


def test_every_group_unanimous_is_fatal_for_a_group_method_not_when_one_splits():
    (fatal,) = preflight(rows([0, 0, 0], [1, 1, 1]), GROUP).fatal
    assert fatal.reason.startswith("every one of the 2 groups is unanimous")
    assert fatal.fixes[0] == "more rollouts per prompt (--set rollouts_per_prompt=16)"
    assert preflight(rows([0, 0, 0], [1, 0, 1]), GROUP).ok


def test_a_group_method_with_one_rollout_per_task_cannot_compare():
    (fatal,) = preflight(rows([0], [1]), GROUP).fatal
    assert "needs 2 rollouts per prompt" in fatal.reason and fatal.fixes[0] == "--set rollouts_per_prompt=2 or more"


def test_everything_passing_is_fatal():
    (fatal,) = preflight(rows([1, 1], [1, 1]), GROUP).fatal
    assert fatal.reason.startswith("every one of the 4 probe rows passes")


def test_everything_passing_after_a_warm_start_is_a_note_not_a_stop():
    """The warm start solved the task: the run goes on to measure and export it (it used to stop, losing both)."""
    report = preflight(rows([1], [1], [1]), ONE, warm_start_steps=200)
    assert report.ok and report.notes[0].startswith("every one of the 3 probe rollouts passes after the warm start")


def test_a_memorised_warm_start_is_named_when_training_tasks_pass_far_more_than_held_out():
    """sort3 in issue 30: the first RL batch passed 0.97 of its training tasks, held-out 0.79, and it said ok."""
    batch = rows(*([[1]] * 31 + [[0]]))  # 31/32 = 0.97
    note = next(n for n in preflight(batch, ONE, warm_start_steps=800, held_out=0.79).notes)
    assert note.startswith("the warm start overfit: the first batch of training tasks passes 0.97, held-out tasks "
                           "0.79 (a gap of 0.18)")
    assert not preflight(batch, ONE, warm_start_steps=800, held_out=0.92).notes  # a gap of 0.05: within noise
    assert not preflight(batch, ONE, warm_start_steps=0, held_out=0.5).notes  # no warm start: not its doing


def test_a_log_mostly_from_another_model_stops_and_a_partly_stale_one_is_named_with_its_share():
    (fatal,) = preflight(rows([0], [1]), ONE, admitted_share=0.02, drift=0.1).fatal
    assert fatal.reason.startswith("the method admits only 2% of the logged traces at step 0 (drift 0.1)")
    report = preflight(rows([0], [1]), ONE, admitted_share=0.42, drift=0.05)
    assert report.ok and report.notes[0].startswith("the method admits only 42% of the logged traces at step 0 "
                                                    "(mean drift 0.05)")


def test_every_trace_dropped_at_step_0_is_fatal_and_names_the_model():
    report = preflight(rows([0], [1]), ONE, admitted_share=0.0, drift=5.3)
    (fatal,) = report.fatal
    assert "dropped every logged trace at step 0 (drift 5.3)" in fatal.reason
    assert fatal.fixes[0].startswith("--model the model the logs came from")
    assert preflight(rows([0], [1]), ONE, admitted_share=0.6).ok  # a note (a partly stale log), not a stop


def test_no_answer_under_the_cap_is_fatal():
    (fatal,) = preflight([], ONE, cap=4, answer_lengths=[4, 6]).fatal
    assert fatal.reason.startswith("no reference answer fits under the cap of 4 tokens (longest 6")
    assert fatal.fixes == ("--max-tokens 8 or more",)


def test_a_taskset_cap_as_long_as_its_answers_fits_them():
    # builtin:copy: cap 3 = the answers' length, ended by the cap, no EOS: all fit
    report = preflight(rows([0, 1]), GROUP, cap=3, answer_lengths=[3, 3], cap_ends_answer=True)
    assert report.answers_within_cap == 1.0 and report.ok
    assert preflight(rows([0, 1]), GROUP, cap=3, answer_lengths=[3, 3]).answers_within_cap == 0.0


def test_a_rows_method_is_not_judged_on_rewards():
    sft = method("sft").run_spec()
    report = preflight(rows([0], [0]), sft)
    assert report.ok and report.rollouts == 0 and report.mean_reward is None


# ------------------------------------------------------------------------------------- a user's taskset
def no_signal_taskset(path):
    """A user's JSONL taskset no random-init model passes: six random letters to repeat from a hint."""
    rng = random.Random(0)
    lines = []
    for k in range(200):
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))
        lines.append(json.dumps({"prompt": f"secret {k}?", "answer": word}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_user_taskset_with_no_signal_stops_at_the_preflight(tmp_path):
    """Real parts: the file loads as a user's taskset, a random-init builtin:tiny samples 32 rollouts under
    the rules' cap (6 + 2 + EOS = 9) with no warm start (as today's default gives a JSONL taskset)."""
    from whileai.engine import TrainingEngine
    from whileai.engine.sampling import SamplingParams
    from whileai.envs import load_taskset, render_prompt
    from whileai.loop.sources.rollouts import rollouts

    taskset = load_taskset(str(no_signal_taskset(tmp_path / "secret.jsonl")))
    engine = TrainingEngine("builtin:tiny", seed=0, keep_sampler_versions=1)
    tasks = taskset.split("train")[:32]
    lengths = rules.answer_tokens([t.answer for t in taskset.split("train")],
                                  lambda s: engine.tokenizer.encode(s, add_special_tokens=False))
    cap, _ = rules.generation_cap(taskset_cap=None, answer_lengths=lengths, whole_answer=True, method_cap=8192)
    assert cap == 9
    probe = rollouts(engine, taskset, tasks, [render_prompt(engine.tokenizer, t) for t in tasks], [1] * 32,
                     SamplingParams(max_tokens=cap, temperature=1.0), seed=0, sampler_step=0,
                     cap_is_answer_length=False)
    report = preflight(probe, ONE, cap=cap, answer_lengths=lengths, warm_start_steps=0, random_init=True)
    assert isinstance(report, Preflight) and not report.ok
    assert report.task_pass_share == 0.0 and report.mean_reward == 0.0
    (fatal,) = report.fatal
    assert fatal.reason.startswith("no rollout passed: all 32 probe rows over 32 tasks earned reward 0")
    assert fatal.fixes[0].startswith("a supervised warm start on the reference answers")


# ------------------------------------------------------------------------------------- after the run
def steps(n, **fields):
    return [{"step": k + 1, **{key: (v(k) if callable(v) else v) for key, v in fields.items()}} for k in range(n)]


def test_no_gain_reason_names_what_the_metrics_show():
    assert no_gain_reason(steps(40, reward=0.0, pass_rate=0.0, grad_norm=0.0)) == (
        "reward was 0 on every one of 40 steps: no rollout ever passed, so every update was empty (a warm start, "
        "a lower cap, or easier tasks)")
    assert no_gain_reason(steps(10, reward=lambda k: k % 2, admitted_share=0.0, drift=5.3)).startswith(
        "the method admitted no trace on any of 10 steps (drift 5.3)")
    assert no_gain_reason(steps(10, reward=lambda k: k % 2, grad_norm=0.0)).startswith(
        "the gradient was 0 on every one of 10 steps")
    assert no_gain_reason(steps(10, reward=lambda k: k % 2, reply_tokens=250.0), cap=256).startswith(
        "replies averaged 250 tokens against a cap of 256")
    # pass rate 1/64 on every step: mean 1.6% < 2%
    assert no_gain_reason(steps(10, reward=lambda k: 0.01 * (k % 2), pass_rate=1 / 64)) == (
        "rollouts passed 1.6% of the time over 10 steps: too rare a signal to learn from (a longer warm start, "
        "easier tasks, or more rollouts per step)")
    # first fifth 0.8, last fifth 0.4 at learning rate 0.01
    fell = no_gain_reason(steps(10, reward=lambda k: 0.8 if k < 5 else 0.4, learning_rate=0.01))
    assert fell.startswith("training reward fell from 0.800 to 0.400") and "learning rate 0.01" in fell
    assert no_gain_reason(steps(10, reward=lambda k: 0.5 + 0.01 * (k % 2))).startswith("training reward stayed at")
    assert no_gain_reason([]) == "no training step was recorded: the run stopped before its first update"


def test_no_gain_reason_is_none_after_a_gain():
    compare = {"delta": 0.043, "excludes_zero": True}
    assert no_gain_reason(steps(40, reward=0.0), compare) is None
    assert no_gain_reason(steps(40, reward=0.0), {"delta": 0.0, "excludes_zero": False}).startswith("reward was 0")
