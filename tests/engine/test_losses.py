"""Every named loss equals its formula (reference/tinker.md section 2), computed by hand in numpy
from the log-probabilities the engine returns, with ratios far outside the clip range."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from whileai.engine import LOSSES, TrainingEngine, capabilities, resolve_config
from whileai.engine.losses import per_token_loss, scored
from whileai.errors import ConfigError

POLICY_LOSSES = ["importance_sampling", "ppo", "cispo", "dro", "gspo", "dppo", "sapo"]


# ----------------------------------------------------------------------------- numpy references
def np_loss(name: str, p: np.ndarray, q: np.ndarray, a: np.ndarray, cfg: dict) -> float:
    """Sum of the per-token loss of one datum's scored positions, written from tinker.md directly."""
    r = np.exp(p - q)
    if name == "importance_sampling":
        return float(np.sum(-r * a))
    if name == "ppo":
        lo, hi = cfg["clip_low_threshold"], cfg["clip_high_threshold"]
        return float(np.sum(-np.minimum(r * a, np.clip(r, lo, hi) * a)))
    if name == "cispo":
        return float(np.sum(-np.clip(r, cfg["clip_low_threshold"], cfg["clip_high_threshold"]) * p * a))
    if name == "dro":
        return float(np.sum(-(p * a - 0.5 * cfg["beta"] * (p - q) ** 2)))
    if name == "gspo":
        s = np.exp(min(np.mean(p - q), 10.0))  # every token carries the sequence ratio's value
        lo, hi = cfg["clip_low_threshold"], cfg["clip_high_threshold"]
        return float(np.sum(-np.minimum(s * a, np.clip(s, lo, hi) * a)))
    if name == "dppo":
        pi, mu = np.exp(p), np.exp(q)
        lo, hi = cfg["delta_low"], cfg["delta_high"]
        if cfg["dppo_type"] == "binary_tv":
            drop = ((a > 0) & (pi - mu > hi)) | ((a < 0) & (mu - pi > lo))
        else:
            d = mu * (q - p) + (1 - mu) * np.log((1 - mu + 1e-8) / (1 - pi + 1e-8))
            drop = ((a > 0) & (pi > mu) & (d > hi)) | ((a < 0) & (pi < mu) & (d > lo))
        return float(np.sum(-r * a * ~drop))
    if name == "sapo":
        tau = np.where(a > 0, cfg["tau_pos"], cfg["tau_neg"])
        rr = np.exp(np.clip(p - q, -20, 20))
        return float(np.sum(-1 / (1 + np.exp(-tau * (rr - 1))) * 4 / tau * a))
    raise KeyError(name)


# ----------------------------------------------------------------------------- shared data
@pytest.fixture(scope="module")
def engine():
    return TrainingEngine("builtin:tiny", seed=11)


@pytest.fixture(scope="module")
def random_data(engine):
    """Four datums: prompt positions carry A = 0 and q = 0 (Tinker's convention), completion
    positions carry q = learner logprob + N(0, 1.5^2) (ratios from ~0.01 to ~100) and random
    advantages, a few of them exactly 0."""
    rng = np.random.default_rng(5)
    data, ratios = [], []
    for _ in range(4):
        prompt_len, comp_len = int(rng.integers(2, 5)), int(rng.integers(3, 8))
        tokens = rng.integers(3, 259, prompt_len + comp_len).tolist()
        n = len(tokens) - 1
        probe = {"model_input": tokens[:-1], "loss_fn_inputs": {"target_tokens": tokens[1:], "weights": [1.0] * n}}
        learner = engine.forward([probe]).loss_fn_outputs[0]["logprobs"].astype(np.float64)
        q = np.zeros(n)
        adv = np.zeros(n)
        comp = slice(prompt_len - 1, n)
        q[comp] = np.minimum(learner[comp] + rng.normal(0, 1.5, n - prompt_len + 1), -1e-3)
        adv[comp] = rng.normal(0, 1, n - prompt_len + 1) * (rng.random(n - prompt_len + 1) > 0.15)
        data.append({"model_input": tokens[:-1], "loss_fn_inputs": {
            "target_tokens": tokens[1:], "logprobs": q.tolist(), "advantages": adv.tolist()}})
        ratios.append(np.exp(learner[comp] - q[comp]))
    ratios = np.concatenate(ratios)
    assert ratios.max() > 3 and ratios.min() < 0.3  # far outside 0.8 / 1.2
    return data


def hand_total(name: str, data: list, outputs: list, cfg: dict) -> float:
    total = 0.0
    for datum, out in zip(data, outputs):
        q = np.asarray(datum["loss_fn_inputs"]["logprobs"])
        a = np.asarray(datum["loss_fn_inputs"]["advantages"])
        w = np.asarray(datum["loss_fn_inputs"].get("weights", np.ones_like(a)))
        scored = (w != 0) if "weights" in datum["loss_fn_inputs"] else (a != 0) | ((q != 0) & (name in ("dro", "gspo")))
        if name == "gspo" and "weights" not in datum["loss_fn_inputs"]:  # the completion: the tail from its start
            scored[int(np.argmax(scored)):] = True
        p = out["logprobs"].astype(np.float64)
        assert np.all(p < 0)  # forward returns the learner's logprobs at every position, scored or not
        if name in ("gspo",):
            total += np_loss(name, p[scored], q[scored], a[scored] * w[scored], cfg)
        else:
            total += sum(w[t] * np_loss(name, p[t:t + 1], q[t:t + 1], a[t:t + 1], cfg) for t in np.flatnonzero(scored))
    return total


# ----------------------------------------------------------------------------- formulas
@pytest.mark.parametrize("name", POLICY_LOSSES)
def test_loss_equals_its_formula_from_the_returned_logprobs(engine, random_data, name):
    cfg = resolve_config(name, None)
    out = engine.forward(random_data, name)
    assert out.metrics["loss:sum"] == pytest.approx(hand_total(name, random_data, out.loss_fn_outputs, cfg),
                                                    rel=1e-9, abs=1e-9)


def test_dppo_binary_kl_equals_its_formula(engine, random_data):
    cfg = resolve_config("dppo", {"dppo_type": "binary_kl", "delta_low": 0.05, "delta_high": 0.05})
    out = engine.forward(random_data, "dppo", cfg)
    assert out.metrics["loss:sum"] == pytest.approx(hand_total("dppo", random_data, out.loss_fn_outputs, cfg),
                                                    rel=1e-9)


def test_weights_mask_and_scale_a_policy_loss(engine, random_data):
    """With weights, a policy loss is sum_t w_t * l_t over positions with w_t != 0."""
    rng = np.random.default_rng(9)
    weighted = []
    for d in random_data:
        n = len(d["model_input"])
        w = rng.choice([0.0, 0.5, 2.0], n)
        weighted.append({"model_input": d["model_input"], "loss_fn_inputs": {**d["loss_fn_inputs"], "weights": w.tolist()}})
    for name in ("ppo", "dro", "gspo"):
        cfg = resolve_config(name, None)
        out = engine.forward(weighted, name)
        assert out.metrics["loss:sum"] == pytest.approx(hand_total(name, weighted, out.loss_fn_outputs, cfg), rel=1e-9)


def test_ppo_hand_worked_example():
    """p = 0.5, q = 0.25 so r = 2, outside [0.8, 1.2].
    A = +1: min(2 * 1, 1.2 * 1) = 1.2 -> loss -1.2, gradient 0 (the clipped branch is flat).
    A = -1: min(-2, -1.2) = -2 -> loss +2, gradient d(-r A)/d log p = -r A = 2.
    p = q (r = 1), A = 0.5: loss -0.5, gradient -r A = -0.5.  Total: -1.2 + 2 - 0.5 = 0.3."""
    logp = torch.tensor([math.log(0.5), math.log(0.5), math.log(0.3)], dtype=torch.float64, requires_grad=True)
    inputs = {"logprobs": torch.tensor([math.log(0.25), math.log(0.25), math.log(0.3)], dtype=torch.float64),
              "advantages": torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)}
    loss = per_token_loss(LOSSES["ppo"], logp, inputs, resolve_config("ppo", None)).sum()
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.3, abs=1e-12)
    assert logp.grad.tolist() == pytest.approx([0.0, 2.0, -0.5], abs=1e-12)


def hand_gradient(name: str, p: np.ndarray, q: np.ndarray, a: np.ndarray, cfg: dict) -> np.ndarray:
    """d loss / d log p, derived on paper for each loss (checks the stop-gradients)."""
    r = np.exp(p - q)
    lo, hi = cfg.get("clip_low_threshold"), cfg.get("clip_high_threshold")
    if name == "importance_sampling":
        return -r * a
    if name == "ppo":  # the unclipped branch is active unless the clipped one is strictly smaller
        return np.where(r * a <= np.clip(r, lo, hi) * a, -r * a, 0.0)
    if name == "cispo":
        return -np.clip(r, lo, hi) * a
    if name == "dro":
        return -(a - cfg["beta"] * (p - q))
    if name == "gspo":  # d log s_t / d log p_t = 1, so d s_t = s_t
        s = np.exp(np.mean(p - q))
        return np.where(s * a <= np.clip(s, lo, hi) * a, -s * a, 0.0)
    if name == "dppo":
        pi, mu = np.exp(p), np.exp(q)
        drop = ((a > 0) & (pi - mu > cfg["delta_high"])) | ((a < 0) & (mu - pi > cfg["delta_low"]))
        return -r * a * ~drop
    if name == "sapo":
        tau = np.where(a > 0, cfg["tau_pos"], cfg["tau_neg"])
        sig = 1 / (1 + np.exp(-tau * (r - 1)))
        return -sig * (1 - sig) * tau * r * 4 / tau * a
    raise KeyError(name)


@pytest.mark.parametrize("name", POLICY_LOSSES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_autograd_gradient_equals_the_hand_derivative(name, seed):
    rng = np.random.default_rng(seed)
    p = -rng.exponential(1.0, 12)
    q = np.minimum(p + rng.normal(0, 1.5, 12), -1e-3)
    a = rng.normal(0, 1, 12)
    cfg = resolve_config(name, None)
    logp = torch.tensor(p, requires_grad=True)
    inputs = {"logprobs": torch.tensor(q), "advantages": torch.tensor(a)}
    per_token_loss(LOSSES[name], logp, inputs, cfg).sum().backward()
    np.testing.assert_allclose(logp.grad.numpy(), hand_gradient(name, p, q, a, cfg), rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("name, a, b", [
    ("ppo", {}, {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
    ("cispo", {}, {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5}),
    ("dro", {}, {"beta": 0.5}),
    ("gspo", {}, {"clip_low_threshold": 0.99, "clip_high_threshold": 1.01}),
    ("dppo", {}, {"delta_low": 0.01, "delta_high": 0.01}),
    ("dppo", {"delta_low": 0.01, "delta_high": 0.01},
     {"delta_low": 0.01, "delta_high": 0.01, "dppo_type": "binary_kl"}),
    ("sapo", {}, {"tau_pos": 3.0, "tau_neg": 0.5}),
])
def test_loss_fn_config_changes_the_result(engine, random_data, name, a, b):
    """Two otherwise identical calls with different config give different losses."""
    first = engine.forward(random_data, name, a).metrics["loss:sum"]
    second = engine.forward(random_data, name, b).metrics["loss:sum"]
    assert abs(first - second) > 1e-3


def test_per_token_clip_thresholds_override_the_config(engine, random_data):
    """Tinker also accepts clip_*_threshold as per-position loss_fn_inputs; equal to the config values
    they give the same loss, and different ones change it."""
    same, tight = [], []
    for d in random_data:
        n = len(d["model_input"])
        same.append({**d, "loss_fn_inputs": {**d["loss_fn_inputs"], "clip_low_threshold": [0.7] * n,
                                             "clip_high_threshold": [1.3] * n}})
        tight.append({**d, "loss_fn_inputs": {**d["loss_fn_inputs"], "clip_low_threshold": [1.0] * n,
                                              "clip_high_threshold": [1.0] * n}})
    cfg = {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}
    base = engine.forward(random_data, "ppo", cfg).metrics["loss:sum"]
    assert engine.forward(same, "ppo").metrics["loss:sum"] == pytest.approx(base, rel=1e-12)
    assert abs(engine.forward(tight, "ppo").metrics["loss:sum"] - base) > 1e-3


def test_unknown_loss_and_key_list_the_valid_ones(engine, random_data):
    with pytest.raises(ValueError, match="valid losses are cross_entropy, importance_sampling, ppo, cispo"):
        engine.forward(random_data, "grpo")
    with pytest.raises(ValueError, match="'clip_ratio' is not accepted by loss 'ppo'; valid keys: "
                                         "clip_low_threshold, clip_high_threshold"):
        engine.forward(random_data, "ppo", {"clip_ratio": 0.2})
    with pytest.raises(ValueError, match="this loss takes no config"):
        engine.forward(random_data, "importance_sampling", {"beta": 1.0})
    with pytest.raises(ConfigError, match=r"dppo_type.*one of 'binary_tv', 'binary_kl'"):
        resolve_config("dppo", {"dppo_type": "tv"})
    with pytest.raises(ConfigError, match="clip_low_threshold=1.5 is above clip_high_threshold=1.2"):
        resolve_config("ppo", {"clip_low_threshold": 1.5})
    with pytest.raises(ConfigError, match=r"beta.*a finite number in \[0.0, inf\)"):
        resolve_config("dro", {"beta": float("nan")})


def test_capabilities_list_every_loss_with_its_keys_and_defaults():
    caps = capabilities()
    assert list(caps) == ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo", "dppo",
                          "sapo", "ppo_critic"]
    assert caps["ppo"]["config"]["clip_high_threshold"]["default"] == 1.2
    assert caps["cispo"]["config"]["clip_low_threshold"]["default"] == 0.0
    assert caps["dppo"]["config"]["dppo_type"]["choices"] == ["binary_tv", "binary_kl"]
    assert caps["cross_entropy"]["config"] == {}


# ----------------------------------------------------------------------------- the critic loss
def test_ppo_critic_equals_its_formula_and_only_moves_the_critic():
    """1/2 max((V_clip - R)^2, (V - R)^2) summed; V from the critic head, V_old and R from the datum."""
    engine = TrainingEngine("builtin:tiny", seed=2)
    critic = engine.add_critic(learning_rate=0.1)
    with torch.no_grad():
        critic.head.linear.bias.fill_(0.3)  # V = 0.3 everywhere, so the clip is visible
    datum = {"model_input": [1, 5, 6, 7], "loss_fn_inputs": {
        "values": [0.0, 0.25, 0.5, 0.3], "returns": [1.0, 0.0, 0.2, 0.3]}}
    out = engine.forward_backward([datum], "ppo_critic", {"value_clip": 0.1})
    v = out.loss_fn_outputs[0]["values"]
    np.testing.assert_allclose(v, 0.3, rtol=1e-6)
    # V_clip = V_old + clip(0.3 - V_old, -0.1, 0.1) = [0.1, 0.3, 0.4, 0.3]
    # max((V_clip - R)^2, (V - R)^2) = [max(.81, .49), max(.09, .09), max(.04, .01), 0] = [.81, .09, .04, 0]
    assert out.metrics["loss:sum"] == pytest.approx(0.5 * (0.81 + 0.09 + 0.04), rel=1e-6)
    unclipped = engine.forward([datum], "ppo_critic", {"value_clip": None}).metrics["loss:sum"]
    assert unclipped == pytest.approx(0.5 * (0.49 + 0.09 + 0.01), rel=1e-6)
    assert all(p.grad is None for p in engine.named_params.values())
    assert critic.head.linear.bias.grad is not None
    before = critic.head.linear.bias.item()
    engine.optim_step()
    assert critic.head.linear.bias.item() != before


def test_ppo_critic_without_a_critic_says_how_to_add_one():
    engine = TrainingEngine("builtin:tiny", seed=2)
    datum = {"model_input": [1, 5], "loss_fn_inputs": {"values": [0.0, 0.0], "returns": [1.0, 1.0]}}
    with pytest.raises(ValueError, match="add_critic"):
        engine.forward_backward([datum], "ppo_critic")


def test_gspo_sequence_ratio_counts_zero_advantage_tokens():
    """Token-level advantages, no weights: the sequence ratio is the mean over the whole completion, as SkyRL
    and verl take it over the loss mask. logp [-1, -2, -0.5], old [-1.2, -1, -0.6], A [1, 0, 1]:
    mean(log p - log q) = (0.2 - 1 + 0.1) / 3 = -0.23333, s = 0.79189, inside [0.8, 1.2]? no: below 0.8, so
    for A = 1 min(s A, 0.8 A) = s; loss = -(s + 0 + s) = -1.583779. (Leaving the A = 0 token out of the mean,
    as the engine once did: s = exp(0.15) = 1.16183, loss -2.323668.)"""
    engine = TrainingEngine("builtin:tiny", seed=0)
    tokens = [1, 100, 101, 102]
    probe = {"model_input": tokens[:-1], "loss_fn_inputs": {"target_tokens": tokens[1:], "weights": [1.0] * 3}}
    p = engine.forward([probe]).loss_fn_outputs[0]["logprobs"].astype(np.float64)
    q = p - np.array([-1.0, -2.0, -0.5]) + np.array([-1.2, -1.0, -0.6])  # log p - log q = [0.2, -1, 0.1]
    datum = {"model_input": tokens[:-1], "loss_fn_inputs": {
        "target_tokens": tokens[1:], "logprobs": q.tolist(), "advantages": [1.0, 0.0, 1.0]}}
    assert engine.forward([datum], "gspo").metrics["loss:sum"] == pytest.approx(-1.583779, abs=1e-6)
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    inputs = {"logprobs": torch.tensor([-1.2, -1.0, -0.6], dtype=torch.float64),
              "advantages": torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)}
    loss = per_token_loss(LOSSES["gspo"], logp, inputs, resolve_config("gspo", None)).sum()
    assert float(loss) == pytest.approx(-1.583779, abs=1e-6)


@pytest.mark.parametrize("weights", [None, [1.0, 1.0, 1.0]])
def test_gspo_sequence_ratio_counts_a_greedy_zero_logprob_token(weights):
    """A greedy sampler gives exact 0.0 log-probabilities. log p - log q = [0.2, -0.3, 0.1] with the middle
    token's q = 0.0 and its advantage 0, A = [1, 0, 1], no weights: the sequence mean is over the whole
    completion, 0, so s = 1 and the loss is -(1 + 0 + 1) = -2.000000, as SkyRL / verl give over their loss mask and
    as the same datum with weights 1 gives. (Leaving the token out: s = exp(0.15), loss -2.323668.)"""
    logp = torch.tensor([-1.0, -0.3, -0.5], dtype=torch.float64)
    inputs = {"logprobs": torch.tensor([-1.2, 0.0, -0.6], dtype=torch.float64),
              "advantages": torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)}
    if weights is not None:
        inputs["weights"] = torch.tensor(weights, dtype=torch.float64)
    as_numpy = {k: v.numpy() for k, v in inputs.items()}
    kept = scored(LOSSES["gspo"], as_numpy, 3)
    assert kept.tolist() == [True, True, True]
    loss = per_token_loss(LOSSES["gspo"], logp[kept], {k: v[kept] for k, v in inputs.items()},
                          resolve_config("gspo", None)).sum()
    assert float(loss) == pytest.approx(-2.0, abs=1e-9)


def test_gspo_through_the_engine_counts_a_greedy_zero_logprob_token_after_the_prompt():
    """The same through ``forward``: a one-token prompt (A = 0, q = 0: not scored), then three completion tokens
    whose middle one has q = 0.0 and A = 0 and the other two are chosen so the mean of log p - log q over all
    three is 0: s = 1, loss -2 (with the token left out, s = exp(-p_mid / 2) and the loss would differ)."""
    engine = TrainingEngine("builtin:tiny", seed=0)
    tokens = [1, 7, 100, 101, 102]
    probe = {"model_input": tokens[:-1], "loss_fn_inputs": {"target_tokens": tokens[1:], "weights": [1.0] * 4}}
    p = engine.forward([probe]).loss_fn_outputs[0]["logprobs"].astype(np.float64)
    mid = p[2]  # q_mid = 0.0, so log p - log q there is p_mid; the ends take -p_mid / 2 each
    q = [0.0, p[1] + mid / 2, 0.0, p[3] + mid / 2]
    datum = {"model_input": tokens[:-1], "loss_fn_inputs": {
        "target_tokens": tokens[1:], "logprobs": q, "advantages": [0.0, 1.0, 0.0, 1.0]}}
    assert abs(mid) > 0.1
    assert engine.forward([datum], "gspo").metrics["loss:sum"] == pytest.approx(-2.0, abs=1e-6)
