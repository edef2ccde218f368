"""Scored positions only (issue 29, item 3): the output layer projects the positions whose log-probability is
needed (the loss's, and what the caller asks for), in ``forward``, ``forward_backward``,
``forward_backward_custom`` and the loop's step; the answers at those positions and the gradients do not change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import whileai as wai
from whileai.engine import TrainingEngine, make_datum
from whileai.errors import BatchError, ConfigError
from whileai.loop.step import policy_step


class Projected:
    """Counts the positions that go through the engine's output layer (forward calls of the head)."""

    def __init__(self, engine: TrainingEngine) -> None:
        self.rows = 0
        engine.model.get_output_embeddings().register_forward_hook(self.hook)

    def hook(self, module, inputs, output) -> None:
        self.rows += int(np.prod(inputs[0].shape[:-1]))


def rows(prompt_length: int, completion: int, count: int = 4) -> list[dict]:
    generator = np.random.default_rng(0)
    return [{"task_id": f"t{i // 2}", "prompt_tokens": generator.integers(3, 250, prompt_length).tolist(),
             "tokens": generator.integers(3, 250, completion).tolist(), "reward": float(i % 2),
             "behavior_logprobs": [-1.0] * completion} for i in range(count)]


def grads(engine: TrainingEngine) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in engine.named_params.items() if p.grad is not None}


def test_forward_projects_only_the_last_positions_asked_for_and_they_equal_every_position():
    engine = TrainingEngine("builtin:tiny", seed=0)
    data = [make_datum(list(range(3, 40)), [5, 6, 7], weights=[0.0, 0.0, 0.0]),
            make_datum([9, 8], [4, 4, 4, 4], weights=[0.0] * 4)]
    counter = Projected(engine)
    every = engine.forward(data)
    assert counter.rows == 39 + 5  # every position of both
    counter.rows = 0
    last = engine.forward(data, logprobs_for=[3, 4])
    assert counter.rows == 3 + 4  # the prompts' positions never reach the output layer
    for a, b, n in zip(every.loss_fn_outputs, last.loss_fn_outputs, [3, 4]):
        np.testing.assert_array_equal(a["logprobs"][-n:], b["logprobs"][-n:])
        assert np.isnan(b["logprobs"][:-n]).all()  # not asked for: not computed, and not a plausible number
    assert last.to_dict()["loss_fn_outputs"][0]["logprobs"][0] is None  # JSON: null, not NaN


def test_forward_backward_scored_projects_the_loss_positions_once_with_the_same_gradient():
    engine = TrainingEngine("builtin:tiny", seed=0)
    data = [make_datum(list(range(3, 60)), [5, 6, 7], weights=[1.0, 0.5, 1.0])]
    counter = Projected(engine)
    out_every = engine.forward_backward(data, "cross_entropy")
    every, projected_every = grads(engine), counter.rows
    engine.zero_grad()
    counter.rows = 0
    out_scored = engine.forward_backward(data, "cross_entropy", logprobs_for="scored")
    scored = grads(engine)
    assert counter.rows == 2 * 3  # forward + the chunk's recompute in the backward; nothing for the prompt
    assert projected_every == 56 + 2 * 3  # before: the 56 prompt positions too, without a gradient
    assert out_every.metrics["loss:sum"] == out_scored.metrics["loss:sum"]
    for name in every:
        torch.testing.assert_close(scored[name], every[name], atol=0, rtol=0)
    np.testing.assert_array_equal(out_scored.loss_fn_outputs[0]["logprobs"][-3:],
                                  out_every.loss_fn_outputs[0]["logprobs"][-3:])


def test_the_loops_rl_step_projects_about_the_replies_not_the_prompts():
    """One GRPO step (score -> update -> forward_backward -> optimizer) on 4 rows of 60-token prompts and
    3-token replies: the head sees the replies' positions (scoring, the loss, its recompute), not the prompts'
    240; the step's scores, coefficients, loss and gradient norm equal those of the step that projects every
    position (to float rounding: the output layer's matrix products have other shapes)."""
    batch = rows(60, 3)
    engines = [TrainingEngine("builtin:tiny", seed=0) for _ in range(2)]
    counter = Projected(engines[0])
    adam = wai.engine.AdamParams(learning_rate=1e-2)
    fast = policy_step(engines[0], wai.GRPO(), batch, adam=adam)
    assert counter.rows <= 3 * 4 * 3  # 36: scoring + loss + recompute of 12 reply positions
    every = engines[1]  # the same step with every position projected (the engine's Tinker default)
    original = every.forward, every.forward_backward
    every.forward = lambda *a, logprobs_for="every", **k: original[0](*a, **k)  # type: ignore[method-assign]
    every.forward_backward = lambda *a, logprobs_for="every", **k: original[1](*a, **k)  # type: ignore[method-assign]
    counter = Projected(every)
    slow = policy_step(every, wai.GRPO(), batch, adam=adam)
    assert counter.rows >= 4 * 62  # every position of every row
    for a, b in zip(fast.update.coefficients, slow.update.coefficients):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    for key in ("loss", "grad_norm"):
        assert fast.metrics[key] == pytest.approx(slow.metrics[key], rel=1e-6)


def test_single_pass_step_projects_only_the_replies():
    batch = rows(50, 4)
    engine = TrainingEngine("builtin:tiny", seed=0)
    counter = Projected(engine)
    policy_step(engine, wai.GRPO(), batch, adam=wai.engine.AdamParams(learning_rate=1e-2), single_pass_tokens=10**6)
    assert counter.rows <= 2 * 4 * 4  # the single pass + its recompute over 16 reply positions


def test_bad_logprobs_for_is_refused_naming_the_datum():
    engine = TrainingEngine("builtin:tiny", seed=0)
    data = [make_datum([3, 4, 5], [6, 7])]
    with pytest.raises(ConfigError, match="logprobs_for='some' must be 'every', 'scored' or a list"):
        engine.forward(data, logprobs_for="some")
    with pytest.raises(ConfigError, match="one integer per datum \\(1\\)"):
        engine.forward(data, logprobs_for=[1, 2])
    with pytest.raises(BatchError, match=r"logprobs_for\[0\]=9 must be an integer in \[0, 4\]"):
        engine.forward(data, logprobs_for=[9])


class HeadRows:
    """Counts the positions that go through the critic's value head."""

    def __init__(self, engine: TrainingEngine) -> None:
        self.rows = 0
        engine.critic.head.register_forward_hook(self.hook)

    def hook(self, module, inputs, output) -> None:
        self.rows += int(np.prod(inputs[0].shape[:-1]))


SEED = 0


def test_the_critic_reads_only_the_replies_positions_with_the_values_and_gradient_of_every_position():
    """The loop's critic calls (the values a critic method's rows get, then the value loss's backward) send the
    replies' positions through the value head, not the prompts'; the values and the head's gradient equal the
    computation over every position: the head on each position's hidden state, the loss masked to the replies."""
    from whileai.engine.logprobs import hidden_states
    from whileai.loop.step import _critic_backward, critic_values

    batch = rows(30, 3)
    engine = TrainingEngine("builtin:tiny", seed=0)
    engine.add_critic(1e-2)
    with torch.no_grad():  # a head that is not zero, so that values and gradients are not trivially equal
        engine.critic.head.linear.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(SEED))
    counter = HeadRows(engine)
    values = critic_values(engine, batch)
    assert counter.rows == 4 * 3  # before: 4 * 32, the prompts' positions too
    counter.rows = 0
    for row, v in zip(batch, values):
        row["values"] = v
    targets = [[1.0, 0.0, 0.5]] * 4
    loss = _critic_backward(engine, batch, targets)
    assert counter.rows == 4 * 3
    got = engine.critic.head.linear.weight.grad.clone()

    head = engine.critic.head
    head.zero_grad()
    reference = []
    total = 0.0
    for row, target in zip(batch, targets):  # every position through the head, then the replies' picked out
        full = torch.tensor([row["prompt_tokens"] + row["tokens"][:-1]])
        with torch.no_grad():
            hidden = hidden_states(engine.model, full)[0]
        every = head(hidden)
        assert every.shape[0] == 32
        reply = every[-3:]
        reference.append(reply.detach().tolist())
        total = total + (0.5 * (reply.double() - torch.tensor(target, dtype=torch.float64)) ** 2).sum()
    total.backward()
    np.testing.assert_allclose(values, reference, rtol=1e-5, atol=1e-6)
    assert loss == pytest.approx(float(total.detach()) / 12, rel=1e-6)
    torch.testing.assert_close(got, head.linear.weight.grad, rtol=1e-4, atol=1e-6)  # float32 sums in another order


def test_values_not_asked_for_read_nan_not_zero():
    engine = TrainingEngine("builtin:tiny", seed=0)
    engine.add_critic(1e-2)
    datum = make_datum([3, 4, 5, 6], [7, 8], values=[0.0, 0.0], returns=[0.0, 0.0])
    del datum["loss_fn_inputs"]["target_tokens"]
    out = engine.forward([datum], "ppo_critic", logprobs_for=[2]).loss_fn_outputs[0]["values"]
    assert np.isnan(out[:3]).all() and np.isfinite(out[3:]).all()
