"""route() reaches every branch of the guide on rows made for it, and says which branch decided."""

from __future__ import annotations

import pytest

import whileai as wai
from whileai import ConfigError
from whileai.routing import model_billions, route

from ._rowkit import make_rows

MODEL = "Qwen/Qwen3-8B"
MIXED = [0, 1, 2, 3, 4, 2, 1, 3]  # passes of 4 rollouts per task: 6 of 8 tasks split


def _grader(rows):  # ranks passes by length: a stand-in program for the saturated branch
    return [len(r.get("tokens", ())) for r in rows]


def _check(result, branch, method, question):
    text = str(result)
    assert result.branch == branch and result.method == method
    assert text.splitlines()[0] == f"route: {method or 'nothing yet'}  (branch: {branch})"
    assert f"decided by {question}" in text
    assert result.question == question
    assert result.asked[-1][0] == question  # the deciding question is the last one asked
    return text


BRANCHES = {
    "fix the reward": dict(rows=make_rows(MIXED, 4, model=MODEL, truncated_passes=1), method=None,
                           question="1. Can a cut-off reply pass?"),
    "k = 1": dict(rows=make_rows([1, 0, 1, 0], 1, model=MODEL), method="flash_reinforce",
                  question="2. How many rollouts per prompt?"),
    "floor": dict(rows=make_rows([0] * 6, 4, model=MODEL), method="opsd", question="3. What is the per-task band?"),
    "saturated": dict(rows=make_rows([4] * 6, 4, model=MODEL), method="groupwise_grading",
                      question="3. What is the per-task band?"),
    "strong teacher": dict(rows=make_rows(MIXED, 4, model=MODEL), method="opd",
                           teacher_rows=make_rows([4] * 7 + [3], 4, model="Qwen/Qwen3-32B"),
                           question="4. Is there a stronger teacher?"),
    "dpo pairs": dict(rows=make_rows([1] * 6, 2, model="writer"), method="dpo",
                      question="5. Is every prompt a natural better/worse pair?"),
    "another model's rows": dict(rows=make_rows(MIXED, 4, model="gpt-x") + make_rows([1], 4, model=MODEL, prefix="u"),
                                 method="sft", question="6. Did the model you'll train write these rows?"),
    "grpo": dict(rows=make_rows(MIXED, 4, model=MODEL), method="grpo", question="7. Split tasks, on-policy rows?"),
}


@pytest.mark.parametrize("branch", list(BRANCHES))
def test_route_reaches_every_branch(branch):
    case = BRANCHES[branch]
    result = route(case["rows"], MODEL, case.get("teacher_rows"), grader=_grader)
    _check(result, branch, case["method"], case["question"])
    assert result.next_steps  # every answer says what to do next
    assert result.to_dict()["branch"] == branch


def test_questions_come_in_the_guides_order():
    result = route(BRANCHES["grpo"]["rows"], MODEL)
    assert [q[:2] for q, _ in result.asked] == ["1.", "2.", "3.", "4.", "5.", "6.", "7."]
    text = str(result)
    assert "no: 0 truncated passes" in text and "k = 4" in text and "mixed: 75.0% of tasks split" in text
    assert result.numbers["split_share"] == 0.75


def test_fix_the_reward_trains_nothing_and_names_the_count():
    result = route(BRANCHES["fix the reward"]["rows"], MODEL)
    assert result.config is None and result.numbers["truncated_passes"] == 1
    assert "yes: 1 row cut at the token cap still passes" in str(result)


def test_floor_under_7b_is_sft_from_a_stronger_model():
    result = route(make_rows([0] * 6, 4, model="Qwen/Qwen3-0.6B"), "Qwen/Qwen3-0.6B")
    text = _check(result, "floor", "sft", "3. What is the per-task band?")
    assert "0.6B, under OPSD's ~7B" in text and result.numbers["model_billions"] == 0.6


def test_teacher_that_does_not_clear_falls_through():
    weak = make_rows([1, 1, 2, 3, 4, 2, 1, 3], 4, model="Qwen/Qwen3-32B")  # 0.53 vs the student's 0.5
    result = route(BRANCHES["grpo"]["rows"], MODEL, weak)
    assert result.branch == "grpo"
    teacher_answer = dict(result.asked)["4. Is there a stronger teacher?"]
    assert teacher_answer.startswith("no: teacher 0.531") and "intervals overlap" in teacher_answer


def test_grpo_with_few_split_tasks_points_at_k_and_reinforce_ada():
    rows = make_rows([0] * 18 + [4] + [1], 4, model=MODEL)  # 1 of 20 tasks split
    result = route(rows, MODEL)
    assert result.branch == "grpo" and result.numbers["split_share"] == 0.05
    assert "few split tasks (5.0%)" in result.next_steps[0]
    assert "ReinforceAda" in result.alternatives[0]


def test_route_refuses_unknown_privileged_and_reads_model_sizes():
    with pytest.raises(ConfigError, match="privileged='answer'"):
        route(BRANCHES["grpo"]["rows"], MODEL, privileged="answer")
    assert model_billions("Qwen/Qwen2.5-1.5B-Instruct") == 1.5
    assert model_billions("Qwen/Qwen3-30B-A3B") == 30
    assert model_billions("meta-llama/Llama-3.1-8b") == 8
    assert model_billions("my-model") is None


# --------------------------------------------------------------------------- ready objects
@pytest.mark.parametrize("branch, cls", [
    ("k = 1", "FlashReinforce"), ("floor", "OPSD"), ("saturated", "GroupwiseGrading"),
    ("strong teacher", "OPD"), ("dpo pairs", "DPO"), ("another model's rows", "SFT"), ("grpo", "GRPO")])
def test_route_returns_ready_method_objects(branch, cls):
    case = BRANCHES[branch]
    result = route(case["rows"], MODEL, case.get("teacher_rows"), grader=_grader,
                   teacher="http://127.0.0.1:8001/v1")
    assert type(result.config).__name__ == cls, result.notes
    assert not result.notes or branch == "strong teacher"
    assert f"train with: {result.config!r}" in str(result)
    if branch == "floor":
        assert result.config.privileged == "reference"
    if branch == "grpo":
        assert result.config.rollouts_per_prompt == 4  # the rows' k, not the library default of 8
    if branch == "strong teacher":
        assert result.config.teacher == wai.Endpoint(base_url="http://127.0.0.1:8001/v1", model="Qwen/Qwen3-32B")


def test_k1_route_agrees_with_the_prime_rl_writer():
    """At k = 1 route recommends FlashReinforce (SAO, BPCO) for your own trainer and prime-rl's rae:
    the writer refuses the three, pointing at rae, and writes the rae line route prints, at group size 1."""
    result = route(BRANCHES["k = 1"]["rows"], MODEL)
    assert result.branch == "k = 1" and isinstance(result.config, wai.FlashReinforce)
    (sao, bpco, rae) = result.alternatives
    assert sao.startswith("wai.SAO()") and bpco.startswith("wai.BPCO()")
    with pytest.raises(ConfigError, match="'rae'"):
        wai.prime_rl_config("reverse-text", result.config, model=MODEL)
    for method in (wai.SAO(), wai.BPCO()):
        with pytest.raises(ConfigError, match="own trainer loop"):
            wai.prime_rl_config("reverse-text", method, model=MODEL)
    assert "wai.prime_rl_config(env, 'rae', model=..., **{'orchestrator.group_size': 1})" in rae
    cfg = wai.prime_rl_config("reverse-text", "rae", model=MODEL, **{"orchestrator.group_size": 1})
    assert cfg.config["orchestrator"]["algo"]["type"] == "rae"
    assert cfg.config["orchestrator"]["group_size"] == 1


def test_teacher_with_a_big_gap_but_overlapping_intervals_falls_through():
    """Teacher 0.625 against the student's 0.5 (gap +0.125, over PROVE_EFFECT) on 8 tasks: the
    intervals overlap, so the guide does not pick OPD."""
    teacher = make_rows([1, 2, 3, 4, 4, 3, 2, 1], 4, model="Qwen/Qwen3-32B")  # (1+2+3+4+4+3+2+1)/32 = 0.625
    result = route(BRANCHES["grpo"]["rows"], MODEL, teacher)
    answer = dict(result.asked)["4. Is there a stronger teacher?"]
    assert result.branch == "grpo" and "gap +0.125" in answer and "intervals overlap" in answer


def test_two_rows_per_task_with_a_tie_are_not_dpo_pairs():
    rows = make_rows([1, 1, 1, 1, 1, 2], 2, model="writer")  # the last task passes twice: a tie, no pair
    result = route(rows, MODEL)
    assert result.branch == "another model's rows"
    assert dict(result.asked)["5. Is every prompt a natural better/worse pair?"].startswith("no: 5 of 6 tasks")


def test_saturated_without_a_grader_names_the_method_and_what_it_needs():
    result = route(BRANCHES["saturated"]["rows"], MODEL)
    text = _check(result, "saturated", "groupwise_grading", "3. What is the per-task band?")
    assert result.config is None and "train with: groupwise_grading, not built yet (see next)" in text
    assert result.next_steps[0].startswith("pass grader=")
