"""Every method's typed answer to "how must I be run", and loop-owned state (RAE)."""

from __future__ import annotations

import numpy as np
import pytest

import whileai as wai
from whileai.methods.run_spec import FILLABLE, RunSpec


def _every_method() -> list[wai.Method]:
    out = []
    for name in wai.method_names():
        if name == "async":
            out.append(wai.method(name, method="grpo"))
        elif name == "groupwise_grading":
            out.append(wai.GroupwiseGrading(grader=lambda rows: [0.0] * len(rows)))
        elif name == "custom_loss":
            out.append(wai.CustomLoss(advantages=lambda batch: batch.rewards_B))
        else:
            out.append(wai.method(name))
    return out


def test_every_method_answers_with_a_valid_run_spec():
    for method in _every_method():
        spec = method.run_spec()
        assert isinstance(spec, RunSpec), method.name
        assert spec.rollouts_per_prompt >= 1 and spec.temperature > 0
        assert set(spec.needs) <= set(FILLABLE), (method.name, spec.needs)
        assert spec.source in ("rollouts", "rows") and spec.head in ("policy", "score")
        assert spec.stateful == (method.initial_state() is not None), method.name
        # every per-token field the update refuses to run without is one the loop is told to fill
        assert set(method.requires) <= set(spec.needs) | {"values"} or spec.source == "rows", method.name


def test_run_specs_carry_the_methods_own_settings():
    assert wai.GRPO(rollouts_per_prompt=4, temperature=0.7, max_tokens=16).run_spec().rollouts_per_prompt == 4
    assert wai.GRPO(beta=0.04).run_spec().needs == ("ref_logprobs",)
    assert wai.GRPO().run_spec().needs == ()
    assert wai.FlashReinforce(off_policy_steps=3).run_spec().max_lag == 3
    sao = wai.SAO(critic_steps=3, critic_warmup=5, critic_learning_rate=1e-3).run_spec().critic
    assert (sao.learning_rate, sao.steps, sao.warmup, sao.reward_range) == (1e-3, 3, 5, None)
    bpco = wai.BPCO(reward_range=(0.0, 2.0), critic_learning_rate=2e-4, learning_rate=3e-5).run_spec()
    assert bpco.critic.reward_range == (0.0, 2.0) and bpco.critic.learning_rate == 2e-4
    assert bpco.learning_rate == 3e-5
    assert wai.SFT().run_spec().source == "rows" and wai.RM().run_spec().head == "score"
    ada = wai.methods.ReinforceAda(round_size=3).run_spec()
    assert ada.rollouts_per_prompt == 3 and ada.plan is not None
    plan = ada.plan([{"task_id": "a", "reward": 1.0}] * 3, ["a", "b"])
    assert plan.resample == {"a": 3, "b": 3}  # a: 3 passes, no fail yet; b: nothing sampled


def _rows(rewards, agent="x"):
    return [{"reward": r, "logprobs": [-0.5, -0.5], "agent": agent} for r in rewards]


def test_rae_state_is_owned_by_the_caller_and_equals_the_object_held_form():
    method = wai.RAE(decay=0.5)
    state = method.initial_state()
    assert state == {"baselines": {}}
    first = method.update(_rows([1.0, 0.0]), state=state)
    # hand-worked: b=0 -> A=1, b=0.5 -> A=-0.5, b=0.25
    assert first.state == {"baselines": {"x": 0.25}}
    assert state == {"baselines": {}}  # the input is never changed
    second = method.update(_rows([1.0]), state=first.state)
    assert second.advantages[0][0] == pytest.approx(0.75)
    # the object-held form (wai update --state) gives the same numbers
    legacy = wai.RAE(decay=0.5)
    legacy.update(_rows([1.0, 0.0]))
    again = legacy.update(_rows([1.0]))
    np.testing.assert_allclose(again.coefficients[0], second.coefficients[0])
    assert method.baselines == {}  # the loop-owned form leaves the object alone


def test_state_passes_through_async_and_is_refused_by_stateless_methods():
    wrapped = wai.Async(wai.RAE(decay=0.5), correction="tis")
    out = wrapped.update(_rows([1.0]), state=wrapped.initial_state())
    assert out.state == {"baselines": {"x": 0.5}}
    with pytest.raises(wai.ConfigError, match="carries no state"):
        wai.GRPO().update(_rows([1.0, 0.0]), state={})
    with pytest.raises(wai.ConfigError, match="finite number"):
        wai.RAE().update(_rows([1.0]), state={"baselines": {"x": float("nan")}})


def test_rollouts_per_prompt_has_one_name_on_every_method_that_samples_a_group():
    """Every method whose run spec samples rollouts declares its count as the field ``rollouts_per_prompt`` (the
    run spec's and the plan's name), and that field is what the run spec reports."""
    import dataclasses
    import warnings

    for name in wai.method_names():
        needs = {"async": {"method": "grpo"}, "custom_loss": {"advantages": lambda batch: batch.rewards_B}}
        if name == "groupwise_grading":  # a wrapper whose inner method holds the count
            continue
        method = wai.method(name, **needs.get(name, {}))
        fields = {f.name for f in dataclasses.fields(method)}
        assert not fields & {"generations", "samples", "group_size_per_prompt"}, name
        if "rollouts_per_prompt" in fields:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                changed = wai.method(name, rollouts_per_prompt=3, **needs.get(name, {}))
            assert changed.run_spec().rollouts_per_prompt == 3, name


@pytest.mark.parametrize("cls,old", [(wai.GRPO, "generations"), (wai.OPD, "samples"), (wai.OPSD, "samples")])
def test_the_old_names_still_work_for_one_release_with_a_one_line_warning(cls, old):
    with pytest.warns(DeprecationWarning, match=rf"^{cls.__name__}\({old}=\.\.\.\) is deprecated: the knob is "
                      r"rollouts_per_prompt") as caught:
        made = cls(**{old: 3})
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert made == cls(rollouts_per_prompt=3) and made.set_fields() == {"rollouts_per_prompt"}
    with pytest.warns(DeprecationWarning):
        assert cls().replace(**{old: 3}) == made
    with pytest.warns(DeprecationWarning):
        assert wai.method(cls.name, **{old: 3}) == made
    with pytest.raises(wai.ConfigError, match="give rollouts_per_prompt= only"):
        cls(**{old: 3, "rollouts_per_prompt": 3})
