"""Activation checkpointing: the same gradients with and without it; on by the rule only where it pays."""

from __future__ import annotations

import pytest
import torch

from whileai.engine import TrainingEngine, make_datum
from whileai.engine.training import _checkpointing
from whileai.errors import ConfigError

DATA = [make_datum([3, 14, 15, 92, 65], [35, 89, 79], weights=[1.0, 0.5, 2.0]),
        make_datum([2, 71], [82, 81, 82, 8], weights=[1.0, 1.0, 0.0, 1.0])]


def gradient(engine: TrainingEngine) -> dict[str, torch.Tensor]:
    engine.forward_backward(DATA, "cross_entropy")
    out = {n: p.grad.clone() for n, p in engine.named_params.items() if p.grad is not None}
    engine.zero_grad()
    return out


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_checkpointing_gives_the_same_gradients(lora_rank: int):
    plain = TrainingEngine("builtin:tiny", seed=0, lora_rank=lora_rank, activation_checkpointing=False)
    checked = TrainingEngine("builtin:tiny", seed=0, lora_rank=lora_rank, activation_checkpointing=True)
    base = checked.model.get_base_model() if lora_rank else checked.model
    assert checked.activation_checkpointing
    assert getattr(base, "is_activation_checkpointing", None) or base.is_gradient_checkpointing
    assert not plain.activation_checkpointing
    mlp = base.model.layers[0].mlp
    calls = []
    forward = mlp.forward
    mlp.forward = lambda x: calls.append(1) or forward(x)
    want, got = gradient(plain), gradient(checked)
    assert len(calls) == 2  # the layer ran again in the backward: checkpointing is really on
    assert want.keys() == got.keys() and want
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-7, rtol=1e-6, msg=name)


def test_the_automatic_default_is_off_on_cpu_and_on_for_a_big_model_on_a_gpu():
    small = TrainingEngine("builtin:tiny", seed=0)
    assert small.activation_checkpointing is False
    model = small.model
    assert _checkpointing(model, torch.device("cpu"), None) is False
    assert _checkpointing(model, torch.device("cuda"), None) is False  # 0.1M parameters: not worth it

    class Big(torch.nn.Module):  # a stand-in that reports 1.5B parameters without allocating them
        supports_gradient_checkpointing = True

        def __init__(self) -> None:
            super().__init__()
            self.enabled = False

        def parameters(self):  # type: ignore[override]
            yield torch.empty(1_500_000_000, device="meta")

        def gradient_checkpointing_enable(self, **kwargs: object) -> None:
            self.enabled = True

    big = Big()
    assert _checkpointing(big, torch.device("cuda"), None) is True and big.enabled
    assert _checkpointing(Big(), torch.device("cuda"), False) is False


def test_a_bad_setting_is_refused():
    with pytest.raises(ConfigError, match="activation_checkpointing='yes' must be True, False or None"):
        TrainingEngine("builtin:tiny", activation_checkpointing="yes")  # type: ignore[arg-type]
