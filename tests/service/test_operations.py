"""The service's operations over real HTTP equal the engine's, called directly in this process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import whileai as wai
from whileai.engine import AdamParams, SamplingParams, TrainingEngine, make_datum
from whileai.engine.losses import LOSSES
from whileai.loop.step import policy_step
from whileai.service import Client, require_advertised_loss

PROBE = [1, 72, 101, 108, 108, 111, 33, 2]  # a fixed sequence whose log-probabilities reveal the weights
ADAM = AdamParams(learning_rate=1e-2)


def _sft_data() -> list[dict]:
    return [make_datum([1, 72 + i, 105], [33 + i, 2]) for i in range(4)]


def _probe(trainer) -> list[list[float]]:
    """The probe's log-probabilities and each position's 16 most likely tokens': they move with any weight."""
    out = trainer.compute_logprobs(PROBE, top_k=16)
    return [out["logprobs"][1:]] + [[lp for _, lp in pos] for pos in out["topk"][1:]]


def _same(a, b, tol: float = 1e-6) -> None:
    flat_a = np.concatenate([np.asarray(x, dtype=np.float64).ravel() for x in a])
    flat_b = np.concatenate([np.asarray(x, dtype=np.float64).ravel() for x in b])
    np.testing.assert_allclose(flat_a, flat_b, rtol=0, atol=tol)


def test_a_supervised_run_loss_falls(client: Client):
    run = client.create_session().create_run("builtin:tiny", seed=0)
    losses = []
    for _ in range(6):
        losses.append(run.forward_backward(_sft_data(), "cross_entropy").metrics["loss:sum"])
        run.optim_step(ADAM)
    assert run.step == 6 and run.last_version == 5  # the sixth step used version 5 and made version 6
    assert losses[-1] < 0.5 * losses[0], losses


def test_forward_backward_and_optim_step_equal_the_engine(client: Client):
    run = client.create_session().create_run("builtin:tiny", seed=3)
    engine = TrainingEngine("builtin:tiny", seed=3)
    _same(_probe(run), _probe(engine), 0.0)  # the same start, bit for bit
    data = _sft_data()
    remote, local = run.forward_backward(data, "cross_entropy"), engine.forward_backward(data, "cross_entropy")
    assert remote.metrics["loss:sum"] == pytest.approx(local.metrics["loss:sum"], abs=1e-6)
    assert float(run.optim_step(ADAM)) == pytest.approx(float(engine.optim_step(ADAM)), rel=1e-6)
    _same(_probe(run), _probe(engine))
    assert run.step == engine.step == 1


def test_forward_backward_custom_equals_the_engines(client: Client):
    """Client-side custom loss (forward, autograd here, cross_entropy with -dloss/dlogp) = the engine's op."""
    run = client.create_session().create_run("builtin:tiny", seed=5)
    engine = TrainingEngine("builtin:tiny", seed=5)

    def loss_fn(data, logprobs):  # a loss no named loss has: squared log-probabilities
        loss = sum((lp ** 2).sum() for lp in logprobs)
        return loss, {"tokens": float(sum(lp.numel() for lp in logprobs))}

    remote = run.forward_backward_custom(_sft_data(), loss_fn)
    local = engine.forward_backward_custom(_sft_data(), loss_fn)
    assert remote.metrics["loss:sum"] == pytest.approx(local.metrics["loss:sum"], rel=1e-6)
    assert remote.metrics["tokens"] == local.metrics["tokens"] == 8.0
    run.optim_step(ADAM)
    engine.optim_step(ADAM)
    _same(_probe(run), _probe(engine))


def _rows(trainer, n: int = 6) -> list[dict]:
    prompts = [[1, 70 + i, 71 + i] for i in range(n)]
    samples = trainer.sample(prompts, 1, SamplingParams(max_tokens=5, temperature=0.8, seed=3))
    return [{"prompt_tokens": p, "tokens": s[0].tokens, "behavior_logprobs": s[0].logprobs,
             "task_id": str(i // 2), "reward": float(i % 2)} for i, (p, s) in enumerate(zip(prompts, samples))]


@pytest.mark.parametrize("single_pass_tokens", [0, 10_000])
def test_policy_step_gives_the_same_update_through_the_service(client: Client, single_pass_tokens: int):
    """loop.step.policy_step with the client in the engine's place: same samples, coefficients, weights."""
    run = client.create_session().create_run("builtin:tiny", seed=4)
    engine = TrainingEngine("builtin:tiny", seed=4)
    rows_remote, rows_local = _rows(run), _rows(engine)
    assert [r["tokens"] for r in rows_remote] == [r["tokens"] for r in rows_local]
    params = {"max_tokens": 5, "temperature": 0.8}
    a = policy_step(run, wai.GRPO(rollouts_per_prompt=2), rows_remote, adam=ADAM, sampling_params=params,
                    single_pass_tokens=single_pass_tokens)
    b = policy_step(engine, wai.GRPO(rollouts_per_prompt=2), rows_local, adam=ADAM, sampling_params=params,
                    single_pass_tokens=single_pass_tokens)
    assert any(np.any(c) for c in a.update.coefficients)
    for c1, c2 in zip(a.update.coefficients, b.update.coefficients):
        np.testing.assert_allclose(c1, c2, rtol=1e-6, atol=1e-9)
    assert a.metrics["grad_norm"] == pytest.approx(b.metrics["grad_norm"], rel=1e-5)
    _same(_probe(run), _probe(engine))


@pytest.mark.parametrize("method", [wai.SAO(), wai.BPCO()], ids=["sao", "bpco"])
def test_a_critic_method_steps_through_the_service_as_through_the_engine(client: Client, method):
    """add_critic on a policy run, then the step's critic values, value loss and critic steps over HTTP."""
    run = client.create_session().create_run("builtin:tiny", seed=6)
    engine = TrainingEngine("builtin:tiny", seed=6)
    critic = method.run_spec().critic
    for trainer in (run, engine):
        trainer.add_critic(1e-2, reward_range=critic.reward_range)
    rows_remote, rows_local = _rows(run), _rows(engine)
    params = {"max_tokens": 5, "temperature": 1.0}
    a = policy_step(run, method, rows_remote, adam=ADAM, sampling_params=params, critic_steps=2)
    b = policy_step(engine, method, rows_local, adam=ADAM, sampling_params=params, critic_steps=2)
    assert "critic_loss" in a.metrics
    assert a.metrics["critic_loss"] == pytest.approx(b.metrics["critic_loss"], rel=1e-5)
    for c1, c2 in zip(a.update.coefficients, b.update.coefficients):
        np.testing.assert_allclose(c1, c2, rtol=1e-5, atol=1e-9)
    _same(_probe(run), _probe(engine))
    again = policy_step(run, method, rows_remote, adam=ADAM, sampling_params=params, critic_steps=2)
    assert again.metrics["critic_loss"] != a.metrics["critic_loss"]  # the value head moved


def _rl_datum(advantage: float) -> dict:
    return make_datum([1, 72, 105], [33, 40, 2], logprobs=[-1.2, -0.9, -2.0], advantages=[advantage] * 3)


# For every loss with config keys, one value far enough from the default to change this batch's loss.
CHANGED = {"ppo": {"clip_low_threshold": 0.999, "clip_high_threshold": 1.001},
           "cispo": {"clip_low_threshold": 0.5, "clip_high_threshold": 4.0},
           "gspo": {"clip_low_threshold": 0.999, "clip_high_threshold": 1.001},
           "dro": {"beta": 5.0}, "dppo": {"delta_low": 0.0, "delta_high": 0.0},
           "sapo": {"tau_pos": 8.0, "tau_neg": 8.0}, "ppo_critic": {"value_clip": 0.001}}


def test_loss_config_reaches_the_loss_for_every_loss_that_takes_one(client: Client):
    """The spec's smoke test: two requests that differ only in loss_config give different results."""
    caps = client.capabilities()
    with_config = [name for name, spec in caps["losses"].items() if spec["config"]]
    assert sorted(with_config) == sorted(CHANGED) == sorted(n for n, s in LOSSES.items() if s.keys)
    run = client.create_session().create_run("builtin:tiny", seed=1, kind="critic", critic_learning_rate=1e-3)
    for name in with_config:
        require_advertised_loss(caps, name, CHANGED[name])
        if name == "ppo_critic":
            data = [{"model_input": [1, 72, 105], "loss_fn_inputs": {"values": [-2.0, -2.0, -2.0],
                                                                     "returns": [2.0, 2.0, 2.0]}}]
        else:
            data = [_rl_datum(1.0), _rl_datum(-0.5)]
        default = run.forward(data, name).metrics["loss:sum"]
        changed = run.forward(data, name, CHANGED[name]).metrics["loss:sum"]
        assert abs(default - changed) > 1e-3, (name, default, changed)


def test_export_lora_downloads_an_adapter(client: Client, tmp_path: Path):
    run = client.create_session().create_run("builtin:tiny", lora_rank=4, seed=2)
    run.forward_backward(_sft_data(), "cross_entropy")
    run.optim_step(ADAM)
    folder = Path(run.export_lora(tmp_path / "adapter"))
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == 4
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "adapter_model.safetensors"))
    lora_b = [t for n, t in tensors.items() if "lora_B" in n]
    assert lora_b and any(float(t.abs().sum()) > 0 for t in lora_b)  # B starts at 0: one step moved it


def test_sampling_a_saved_version_after_training_on(client: Client):
    run = client.create_session().create_run("builtin:tiny", seed=6)
    version = run.save_weights_for_sampler()
    params = {"max_tokens": 6, "seed": 11}
    before = run.sample([1, 72], 2, params)
    for _ in range(3):
        run.forward_backward(_sft_data(), "cross_entropy")
        run.optim_step(ADAM)
    assert run.sample([1, 72], 2, params, version=version) == before and run.last_version == version
    assert run.sample([1, 72], 2, params) != before and run.last_version == 3


def test_a_critic_run_trains_its_value_head(client: Client):
    run = client.create_session().create_run("builtin:tiny", kind="critic", critic_learning_rate=1e-2)
    data = [{"model_input": [1, 72, 105], "loss_fn_inputs": {"values": [0.0] * 3, "returns": [1.0] * 3}}]
    first = run.forward(data, "ppo_critic", {"value_clip": None}).metrics["loss:sum"]
    for _ in range(5):
        run.forward_backward(data, "ppo_critic", {"value_clip": None})
        run.optim_step(ADAM)
    assert run.forward(data, "ppo_critic", {"value_clip": None}).metrics["loss:sum"] < 0.5 * first
