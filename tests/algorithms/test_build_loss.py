"""Each algorithm's build_loss on hand-worked inputs: the advantages, loss name and loss_config it sends.

Completions are 2 tokens after a 3-token prompt unless said otherwise, so a datum has 4 positions:
2 prompt positions (advantage 0) and the completion's 2.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.algorithms.conftest import (
    REQUEST,
    completion_values,
    context,
    group,
    sample,
    tinker_like_capabilities,
)
from whileai.algorithms import algorithm
from whileai.errors import ConfigError


def build(name: str, smp, options=None, **ctx_kwargs):
    algo = algorithm(name)
    ctx = context(algo.make_options(options), **ctx_kwargs)
    return algo.build_loss(smp, 0, REQUEST, ctx)


def scalar_advantages(request) -> list[float]:
    """One number per datum: its completion's advantage (constant over the tokens here)."""
    out = []
    for d in request.data:
        adv = completion_values(d, "advantages", 2)
        assert adv[0] == pytest.approx(adv[1])
        out.append(adv[0])
    return out


def test_grpo_nostd_is_reward_minus_group_mean():
    """rewards [1, 0, 0, 1]: mean 0.5, so A = [0.5, -0.5, -0.5, 0.5] (no division by the std, 0.5)."""
    req = build("grpo_nostd", sample(group([1, 0, 0, 1])))
    assert req.loss_fn == "importance_sampling" and req.loss_fn_config == {}
    assert scalar_advantages(req) == pytest.approx([0.5, -0.5, -0.5, 0.5])
    d = req.data[0]
    assert d["loss_fn_inputs"]["advantages"][:2] == [0.0, 0.0]  # prompt positions carry nothing
    assert "weights" not in d["loss_fn_inputs"]
    assert completion_values(d, "logprobs", 2) == [-1.0, -1.0]  # the sampler's, for the ratio


def test_grpo_nostd_sends_nothing_for_a_unanimous_group():
    req = build("grpo_nostd", sample(group([1, 1, 1, 1]), group([1, 0])))
    assert len(req.data) == 2 and req.metrics["signal_share"] == pytest.approx(2 / 6)


def test_grpo_len_norm_divides_the_std_normalized_advantage_by_own_length():
    """rewards [1, 0], lengths 2 and 4: mean 0.5, std 0.5, A = [1, -1] (up to the 1e-6 in the std);
    per token A / T = [0.5, -0.25]."""
    req = build("grpo_len_norm", sample(group([1, 0], lengths=[2, 4])))
    first, second = req.data
    assert completion_values(first, "advantages", 2) == pytest.approx([0.5, 0.5], rel=1e-5)
    assert completion_values(second, "advantages", 4) == pytest.approx([-0.25] * 4, rel=1e-5)


def test_drgrpo_no_std_and_one_constant_length():
    """rewards [1, 0, 0, 0]: A = [0.75, -0.25, -0.25, -0.25] (no std); L_max = max_tokens = 8, so every
    completion's tokens carry A / 8 = [0.09375, -0.03125, ...], whatever its length (2 or 4 here)."""
    req = build("drgrpo", sample(group([1, 0, 0, 0], lengths=[2, 4, 2, 4])))
    assert [completion_values(d, "advantages", 1)[0] for d in req.data] == pytest.approx(
        [0.09375, -0.03125, -0.03125, -0.03125])
    own = build("drgrpo", sample(group([1, 0, 0, 0], lengths=[2, 4, 2, 4])), {"length": "own"})
    assert [completion_values(d, "advantages", 1)[0] for d in own.data] == pytest.approx(
        [0.375, -0.0625, -0.125, -0.0625])


def test_rloo_leave_one_out():
    """rewards [1, 0, 0, 0]: the others' mean is 0 for the first (A = 1) and 1/3 for the rest (A = -1/3)."""
    req = build("rloo", sample(group([1, 0, 0, 0])))
    assert scalar_advantages(req) == pytest.approx([1, -1 / 3, -1 / 3, -1 / 3])


def test_maxrl_paper_estimator_and_the_spec_files_option():
    """rewards [1, 0, 0, 0], mean 0.25: (R - mean) / mean = [3, -1, -1, -1]; beat-the-best: R_i minus the
    best other reward = [1 - 0, 0 - 1, 0 - 1, 0 - 1]."""
    assert scalar_advantages(build("maxrl", sample(group([1, 0, 0, 0])))) == pytest.approx([3, -1, -1, -1])
    best = build("maxrl", sample(group([1, 0, 0, 0])), {"estimator": "beat_the_best"})
    assert scalar_advantages(best) == pytest.approx([1, -1, -1, -1])
    # a mixed group with mean 0 has no defined MaxRL advantage: nothing sent, and a note says why
    zero_mean = build("maxrl", sample(group([-1, 1])))
    assert zero_mean.data == [] and "mean <= 0" in zero_mean.notes[0]


def test_ppo_clip_goes_where_the_provider_takes_it():
    """Local (ours): scalar loss_fn_config keys. Tinker-like: per-token loss_fn_inputs, empty config."""
    smp = sample(group([1, 0]))
    options = {"clip_low": 0.7, "clip_high": 1.3}
    local = build("ppo", smp, options)
    assert local.loss_fn == "ppo"
    assert local.loss_fn_config == {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}
    assert "clip_low_threshold" not in local.data[0]["loss_fn_inputs"]
    tinker = build("ppo", smp, options, capabilities=tinker_like_capabilities())
    assert tinker.loss_fn_config == {}
    assert completion_values(tinker.data[0], "clip_low_threshold", 2) == [0.7, 0.7]
    assert completion_values(tinker.data[0], "clip_high_threshold", 2) == [1.3, 1.3]
    assert scalar_advantages(tinker) == pytest.approx([0.5, -0.5])
    # unset: nothing sent, the provider's defaults apply
    plain = build("ppo", smp)
    assert plain.loss_fn_config == {} and "clip_low_threshold" not in plain.data[0]["loss_fn_inputs"]


def test_ppo_fails_closed_when_the_provider_has_no_way_to_take_the_clip():
    caps = tinker_like_capabilities()
    caps["losses"]["ppo"]["optional_inputs"] = ["weights"]
    with pytest.raises(ConfigError, match="neither as a config key nor as a per-token input"):
        build("ppo", sample(group([1, 0])), {"clip_high": 1.3}, capabilities=caps)


@pytest.mark.parametrize("name", ["gspo", "dppo", "sapo"])
def test_losses_the_provider_does_not_advertise_fail_closed(name):
    with pytest.raises(ConfigError, match=f"loss '{name}' is not advertised"):
        build(name, sample(group([1, 0])), capabilities=tinker_like_capabilities())


def test_cispo_gspo_dppo_sapo_loss_names_and_configs():
    smp = sample(group([1, 0]))
    assert build("cispo", smp).loss_fn == "cispo"
    assert build("cispo", smp, {"clip_low": 0.0, "clip_high": 5.0}).loss_fn_config == {
        "clip_low_threshold": 0.0, "clip_high_threshold": 5.0}
    assert build("gspo", smp).loss_fn == "gspo"
    dppo = build("dppo", smp, {"delta_low": 0.1, "divergence": "binary_kl"})
    assert (dppo.loss_fn, dppo.loss_fn_config) == ("dppo", {"delta_low": 0.1, "dppo_type": "binary_kl"})
    sapo = build("sapo", smp, {"tau_pos": 2.0})
    assert (sapo.loss_fn, sapo.loss_fn_config) == ("sapo", {"tau_pos": 2.0})
    for name in ("cispo", "gspo", "dppo", "sapo"):
        assert scalar_advantages(build(name, smp)) == pytest.approx([0.5, -0.5])


def test_dapo_filters_drops_uniform_groups_and_normalizes_by_tokens():
    """Group 1: rewards [1, 0, 0, 1], none truncated, 2 tokens each; mean 0.5, std 0.5 so A = [1, -1, -1, 1],
    over the 8 retained tokens of the batch: +-0.125. Group 2 has equal rewards and is dropped (dynamic sampling).
    Clip-higher bounds 0.8 / 1.28 go in the config."""
    req = build("dapo", sample(group([1, 0, 0, 1]), group([0.5, 0.5])))
    assert req.loss_fn == "ppo" and req.loss_fn_config == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
    assert scalar_advantages(req) == pytest.approx([0.125, -0.125, -0.125, 0.125], rel=1e-5)
    assert req.metrics["groups_uniform"] == 1 and req.metrics["groups_kept"] == 1
    assert req.metrics["resample_rounds"] == 0


def test_dapo_drops_a_group_that_stays_short_with_no_resampling_allowed():
    g = group([1, 0, 0, 1])
    from dataclasses import replace

    from tests.algorithms.conftest import completion

    truncated = replace(g, completions=[g.completions[0]] + [completion(0, truncated=True)] * 3)
    req = build("dapo", sample(truncated, group([1, 0])), {"max_rounds": 0})
    assert req.metrics["groups_short"] == 1 and len(req.data) == 2
    assert "fewer than min_retained=2" in req.notes[0]


def test_reinforce_pp_k2_return_and_batch_normalization():
    """k2 = 1/2 (s - r)^2. One group, two completions of two tokens, beta = 0.5:
    penalties [0.1, 0.2] (R = 1) and [0.0, 0.4] (R = 0). Returns-to-go: [1 - 0.5*0.3, 1 - 0.5*0.2] = [0.85, 0.9]
    and [0 - 0.5*0.4, 0 - 0.5*0.4] = [-0.2, -0.2]; over the 4 tokens mean 0.3375, std 0.537792...,
    so a = [0.95300, 1.04597, -0.99946, -0.99946]."""
    from whileai.algorithms.reinforce_pp import k2, return_advantages

    assert k2(np.array([-1.0, -2.0]), np.array([-1.5, -2.0])) == pytest.approx([0.125, 0.0])
    out = return_advantages([np.array([1.0, 0.0])], [[np.array([0.1, 0.2]), np.array([0.0, 0.4])]], 0.5)
    assert np.concatenate(out[0]) == pytest.approx([0.95300, 1.04597, -0.99946, -0.99946], abs=1e-4)


def test_options_refuse_unknown_keys_and_bad_values():
    with pytest.raises(ConfigError, match="has no option 'clip'.*clip_low, clip_high"):
        algorithm("ppo").make_options({"clip": 0.2})
    with pytest.raises(ConfigError, match="estimator='best'"):
        algorithm("maxrl").make_options({"estimator": "best"})
    with pytest.raises(ConfigError, match="unknown algorithm 'grpo'.*grpo_nostd"):
        algorithm("grpo")
