"""build_loss with real runs behind the context: a frozen teacher engine, and DAPO resampling through the client.

The expected advantages are recomputed the slow, obvious way: one ``compute_logprobs`` per sequence on the
teacher, then the formula by hand.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.algorithms.conftest import REQUEST, completion, completion_values, context, group, sample
from whileai.algorithms import Teacher, algorithm
from whileai.engine import TrainingEngine
from whileai.envs import Task, render_prompt


@pytest.fixture(scope="module")
def teacher() -> TrainingEngine:
    return TrainingEngine("builtin:tiny", seed=1)


def slow_scores(engine, prompt, tokens) -> np.ndarray:
    return np.asarray(engine.compute_logprobs(list(prompt) + list(tokens))["logprobs"][-len(tokens):])


def distill_sample():
    g = group([0.25, 0.75])
    comps = [replace(c, logprobs=[-5.0, -6.0], text="ab") for c in g.completions]
    return sample(replace(g, completions=comps))


def test_opd_advantage_is_the_teacher_minus_student_gap(teacher):
    smp = distill_sample()
    algo = algorithm("opd")
    req = algo.build_loss(smp, 0, REQUEST, context(algo.make_options({"kl_coef": 0.5}), teacher=Teacher(teacher)))
    g = smp.groups[0]
    gaps = []
    for datum, c in zip(req.data, g.completions):
        gap = slow_scores(teacher, g.prompt_tokens, c.tokens) - np.asarray(c.logprobs)
        assert completion_values(datum, "advantages", 2) == pytest.approx(0.5 * gap, abs=1e-6)
        gaps.append(gap)
    assert req.loss_fn == "importance_sampling"
    assert req.metrics["teacher_kl"] == pytest.approx(-np.mean(gaps), abs=1e-6)


def test_opsd_teacher_sees_the_answer_and_the_student_datum_does_not(teacher):
    smp = distill_sample()
    algo = algorithm("opsd")
    ctx = context(algo.make_options(), teacher=Teacher(teacher))
    req = algo.build_loss(smp, 0, REQUEST, ctx)
    g = smp.groups[0]
    teacher_prompt = render_prompt(ctx.tokenizer, Task("t", f"{g.task.answer}\n{g.task.prompt}"))
    assert ctx.tokenizer.decode(teacher_prompt, skip_special_tokens=True) == "abca\nabc"
    for datum, c in zip(req.data, g.completions):
        gap = slow_scores(teacher, teacher_prompt, c.tokens) - np.asarray(c.logprobs)
        assert completion_values(datum, "advantages", 2) == pytest.approx(gap, abs=1e-6)
        assert datum["model_input"][:3] == g.prompt_tokens  # the student's own prompt, no answer in it


def test_opsd_refuses_a_task_without_an_answer(teacher):
    smp = distill_sample()
    bare = sample(replace(smp.groups[0], task=Task("q", "abc")))
    algo = algorithm("opsd")
    with pytest.raises(Exception, match="has no answer"):
        algo.build_loss(bare, 0, REQUEST, context(algo.make_options(), teacher=Teacher(teacher)))


def test_sdpo_teacher_sees_each_attempt_and_its_reward(teacher):
    smp = distill_sample()
    algo = algorithm("sdpo")
    ctx = context(algo.make_options(), teacher=Teacher(teacher))
    req = algo.build_loss(smp, 0, REQUEST, ctx)
    g = smp.groups[0]
    for datum, c in zip(req.data, g.completions):
        prompt = render_prompt(ctx.tokenizer, Task("t", f"abcab scored {c.reward:.2f}\nabc"))
        gap = slow_scores(teacher, prompt, c.tokens) - np.asarray(c.logprobs)
        assert completion_values(datum, "advantages", 2) == pytest.approx(gap, abs=1e-6)


def test_reinforce_pp_token_mode_subtracts_each_tokens_k2(teacher):
    """kl_in='token' (the spec file): a_t = (R - mean R) - beta * 1/2 (s_t - r_t)^2 with r from the reference."""
    smp = distill_sample()
    algo = algorithm("reinforce_pp")
    ctx = context(algo.make_options({"kl_in": "token", "kl_coef": 0.1}), teacher=Teacher(teacher))
    req = algo.build_loss(smp, 0, REQUEST, ctx)
    g = smp.groups[0]
    for datum, c, centred in zip(req.data, g.completions, (-0.25, 0.25)):
        ref = slow_scores(teacher, g.prompt_tokens, c.tokens)
        expected = centred - 0.1 * 0.5 * (np.asarray(c.logprobs) - ref) ** 2
        assert completion_values(datum, "advantages", 2) == pytest.approx(expected, abs=1e-6)


def test_dapo_resamples_through_the_client_until_the_group_is_whole(teacher):
    """Three of four completions truncated, min_retained 3: one resampling round of 4 fresh completions from
    the client (the cap is the taskset's answer length here, so the fresh ones are complete)."""
    g = group([1, 0, 0, 1])
    short = replace(g, completions=[g.completions[0]] + [completion(0, truncated=True)] * 3)
    request = replace(REQUEST, sampling_params={"max_tokens": 2, "temperature": 1.0, "seed": 3},
                      cap_is_answer_length=True)
    before = teacher.step
    algo = algorithm("dapo")
    ctx = context(algo.make_options({"min_retained": 3}), client=teacher)
    req = algo.build_loss(sample(short), 0, request, ctx)
    assert req.metrics["resample_rounds"] == 1 and req.metrics["groups_short"] == 0
    assert req.metrics["groups_kept"] == 1 and len(req.data) == 4  # the kept one + 3 of the 4 fresh ones
    fresh = teacher.sample(short.prompt_tokens, 4, {**request.sampling_params, "seed": 3 + 7919}, version=0)
    sent = [d["loss_fn_inputs"]["target_tokens"][-2:] for d in req.data]
    assert sent == [g.completions[0].tokens] + [s.tokens for s in fresh[:3]]  # drawn by the client, same seed
    assert teacher.step == before  # sampling never trains
