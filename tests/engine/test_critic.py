"""The value head: BPCO's bound, the squared-error loss with PPO's value clip, its own optimizer."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from whileai.engine.critic import Critic, ValueHead, bound, value_loss
from whileai.engine.logprobs import hidden_states


def tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=53, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64))


@pytest.mark.parametrize("z, reward_range, expected", [
    (0.0, (0.0, 1.0), 0.5),                   # arctan 0 = 0: the midpoint
    (1.0, (0.0, 1.0), 0.75),                  # arctan 1 = pi/4: 1/2 + 1/4
    (-1.0, (0.0, 1.0), 0.25),                 # arctan -1 = -pi/4: 1/2 - 1/4
    (math.sqrt(3), (0.0, 1.0), 5 / 6),        # arctan sqrt(3) = pi/3: 1/2 + 1/3
    (1.0, (-1.0, 3.0), 2.0),                  # -1 + 4 * 3/4
    (-math.sqrt(3), (-1.0, 3.0), -1 + 4 / 6), # -1 + 4 * (1/2 - 1/3)
])
def test_bound_by_hand(z, reward_range, expected):
    assert bound(z, reward_range) == pytest.approx(expected, abs=1e-12)
    assert bound(torch.tensor([z], dtype=torch.float64), reward_range).item() == pytest.approx(expected, abs=1e-12)


def test_bound_never_leaves_the_range():
    z = torch.tensor([-1e6, -50.0, 0.0, 50.0, 1e6], dtype=torch.float64)
    values = bound(z, (-2.0, 5.0))
    assert (values > -2.0).all() and (values < 5.0).all()
    assert values[0] == pytest.approx(-2.0, abs=1e-5) and values[-1] == pytest.approx(5.0, abs=1e-5)
    assert torch.all(values[1:] > values[:-1])  # monotone in z


def test_bounded_head_stays_inside_even_with_huge_weights():
    head = ValueHead(8, reward_range=(0.0, 1.0))
    assert head(torch.randn(3, 8)).tolist() == [0.5, 0.5, 0.5]  # zero init: the midpoint
    with torch.no_grad():
        head.linear.weight.fill_(1e4)
    values = head(torch.randn(4, 5, 8))
    assert values.shape == (4, 5) and ((values > 0) & (values < 1)).all()


def test_value_clip_by_hand():
    """V = (0.5, 0.5, 9), V_old = (0.2, 0.45, 0), R = (1, 0, 0), clip 0.1, mask (1, 1, 0).

    Position 0: unclipped (0.5 - 1)^2 = 0.25; V_clip = 0.2 + clamp(0.3, +-0.1) = 0.3, (0.3 - 1)^2 = 0.49;
    the max is 0.49. Position 1: V - V_old = 0.05 is inside the clip, both terms are 0.25.
    Position 2 is masked. Loss = (0.49 + 0.25) / 2 = 0.37. Without the clip: (0.25 + 0.25) / 2 = 0.25.
    """
    values = torch.tensor([0.5, 0.5, 9.0], dtype=torch.float64)
    old = torch.tensor([0.2, 0.45, 0.0], dtype=torch.float64)
    targets = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    mask = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    assert value_loss(values, targets, mask, value_clip=0.1, old_values=old).item() == pytest.approx(0.37)
    assert value_loss(values, targets, mask).item() == pytest.approx(0.25)


def test_critic_loss_matches_the_formula_on_its_own_values():
    torch.manual_seed(1)
    critic = Critic(16, learning_rate=1e-2, reward_range=(0.0, 1.0))
    torch.nn.init.normal_(critic.head.linear.weight)
    hidden = torch.randn(2, 6, 16)
    targets, old = torch.rand(2, 6), torch.rand(2, 6)
    mask = (torch.rand(2, 6) > 0.3).float()
    values = critic.values(hidden)
    expected = torch.maximum((values - targets) ** 2,
                             (old + (values - old).clamp(-0.05, 0.05) - targets) ** 2)
    expected = (expected * mask).sum() / mask.sum()
    got = critic.loss(hidden, targets, mask, value_clip=0.05, old_values=old)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("reward_range", [None, (0.0, 1.0)])
def test_squared_error_falls_on_a_tiny_models_hidden_states(reward_range):
    """Value targets constant per sequence (BPCO's V_hat = R); 60 steps cut the loss at least 4x."""
    model = tiny_model()
    torch.manual_seed(0)
    input_ids = torch.randint(0, 53, (8, 10))
    targets = torch.rand(8, 1).expand(8, 10)
    with torch.no_grad():
        hidden = hidden_states(model, input_ids)
    critic = Critic.for_model(model, learning_rate=3e-2, reward_range=reward_range)
    losses = [critic.train_step(hidden, targets) for _ in range(60)]
    assert losses[-1] < losses[0] / 4
    final = critic.loss(hidden, targets).item()
    assert final < losses[0] / 4


def test_critic_optimizer_is_separate_from_the_policy():
    model = tiny_model()
    critic = Critic.for_model(model, learning_rate=1e-3)
    policy_optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    critic_ids = {id(p) for group in critic.optimizer.param_groups for p in group["params"]}
    policy_ids = {id(p) for group in policy_optimizer.param_groups for p in group["params"]}
    assert critic_ids == {id(p) for p in critic.head.parameters()} and not critic_ids & policy_ids
    before = [p.detach().clone() for p in model.parameters()]
    hidden = hidden_states(model, torch.randint(0, 53, (2, 5)))  # with a graph into the policy
    assert hidden.requires_grad
    critic.train_step(hidden, torch.ones(2, 5))
    assert all(p.grad is None for p in model.parameters())  # detached: nothing flows into the trunk
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert critic.head.linear.weight.abs().sum() > 0  # while the head did move
    critic.learning_rate = 5e-4
    assert critic.learning_rate == 5e-4 and policy_optimizer.param_groups[0]["lr"] == 1e-3


def test_state_dict_round_trip_gives_the_same_next_step():
    torch.manual_seed(0)
    hidden, targets = torch.randn(3, 4, 8), torch.rand(3, 4)
    critic = Critic(8, learning_rate=1e-2, reward_range=(0, 1))
    for _ in range(3):
        critic.train_step(hidden, targets)
    copy = Critic(8, learning_rate=1e-2, reward_range=(0, 1))
    copy.load_state_dict(critic.state_dict())
    assert critic.train_step(hidden, targets) == copy.train_step(hidden, targets)
    torch.testing.assert_close(critic.values(hidden), copy.values(hidden), rtol=0, atol=0)
    with pytest.raises(ValueError, match="reward_range"):
        Critic(8, learning_rate=1e-2).load_state_dict(critic.state_dict())


def test_bad_critic_input_is_refused():
    critic = Critic(4, learning_rate=1e-3, reward_range=(0.0, 1.0))
    hidden = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match=r"targets\[1, 2\] = 1.5 is outside the bounded critic's reward_range"):
        critic.loss(hidden, [[0.0, 0.1, 0.2], [0.3, 0.4, 1.5]])
    with pytest.raises(ValueError, match=r"targets has shape \(2, 2\) but the values have shape \(2, 3\)"):
        critic.loss(hidden, torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"targets\[0, 1\] = nan is not finite"):
        critic.loss(hidden, [[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="at least one positive entry"):
        critic.loss(hidden, torch.zeros(2, 3), mask=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="old_values=None with value_clip=0.2: the clip needs"):
        critic.loss(hidden, torch.zeros(2, 3), value_clip=0.2)
    with pytest.raises(ValueError, match="learning_rate=0"):
        Critic(4, learning_rate=0)
    with pytest.raises(ValueError, match="R_min < R_max"):
        Critic(4, learning_rate=1e-3, reward_range=(1.0, 0.0))
