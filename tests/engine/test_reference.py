"""The reference policy: LoRA base with adapters off (no second copy), or a frozen copy otherwise."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from whileai.engine.reference import ReferencePolicy, model_logprobs, reference_logprobs

VOCAB = 47


def tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64))


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three sequences of 12 tokens; position i's target is token i + 1."""
    tokens = torch.randint(0, VOCAB, (3, 13), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def train(model: torch.nn.Module, steps: int = 5) -> None:
    """A few steps of SFT on one batch, enough to move every trained weight."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    input_ids, targets = batch(seed=1)
    model.train()
    for _ in range(steps):
        logits = model(input_ids=input_ids).logits
        loss = -torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def naive(model: torch.nn.Module, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model.eval()(input_ids=input_ids).logits
    return torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def parameter_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("lora", [
    LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]),
    LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]),  # a fully trained head too
])
def test_lora_reference_is_the_pretraining_policy_and_costs_no_copy(lora):
    model = get_peft_model(tiny_model(), lora)
    input_ids, targets = batch()
    before = naive(model, input_ids, targets)
    reference = ReferencePolicy(model)
    assert reference.shares_weights and reference.model is model
    assert reference.extra_parameter_bytes(model) == 0
    train(model)
    after = naive(model, input_ids, targets)
    assert (after - before).abs().max() > 1e-2  # training really moved the policy
    model.train()
    torch.testing.assert_close(reference.logprobs(input_ids, targets), before, atol=1e-5, rtol=0)
    assert model.training  # the mode is restored
    torch.testing.assert_close(naive(model, input_ids, targets), after)  # and the adapters are back on


def test_full_finetune_reference_is_a_frozen_copy_made_once():
    model = tiny_model()
    input_ids, targets = batch()
    before = naive(model, input_ids, targets)
    reference = ReferencePolicy(model)
    assert not reference.shares_weights and reference.model is not model
    assert reference.extra_parameter_bytes(model) == parameter_bytes(model)
    assert not any(p.requires_grad for p in reference.model.parameters())
    train(model)
    assert (naive(model, input_ids, targets) - before).abs().max() > 1e-2
    torch.testing.assert_close(reference.logprobs(input_ids, targets), before, atol=1e-5, rtol=0)


def test_model_logprobs_equal_log_softmax_gather_and_handle_right_padding():
    model = tiny_model()
    input_ids, targets = batch()
    torch.testing.assert_close(model_logprobs(model, input_ids, targets), naive(model, input_ids, targets),
                               atol=1e-5, rtol=0)
    # One sequence as a 1-D input gives a 1-D answer.
    torch.testing.assert_close(model_logprobs(model, input_ids[0], targets[0]), naive(model, input_ids, targets)[0],
                               atol=1e-5, rtol=0)
    # Right padding: the real positions match each sequence alone; padded positions are 0.
    mask = torch.ones_like(input_ids)
    mask[1, 7:] = 0
    padded = model_logprobs(model, input_ids, targets, attention_mask=mask)
    alone = naive(model, input_ids[1:2, :7], targets[1:2, :7])[0]
    torch.testing.assert_close(padded[1, :7], alone, atol=1e-5, rtol=0)
    assert padded[1, 7:].tolist() == [0.0] * 5


def test_reference_logprobs_function_on_a_plain_model_is_that_model():
    model = tiny_model()
    input_ids, targets = batch()
    torch.testing.assert_close(reference_logprobs(model, input_ids, targets), naive(model, input_ids, targets),
                               atol=1e-5, rtol=0)


def test_mismatched_shapes_are_refused():
    model = tiny_model()
    input_ids, targets = batch()
    with pytest.raises(ValueError, match=r"input_ids \(3, 12\) and targets \(3, 11\) must have the same shape"):
        model_logprobs(model, input_ids, targets[:, :-1])
    with pytest.raises(ValueError, match=r"attention_mask \(3, 5\) must have the shape of input_ids"):
        model_logprobs(model, input_ids, targets, attention_mask=torch.ones(3, 5))
