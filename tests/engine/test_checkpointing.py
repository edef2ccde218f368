"""Activation checkpointing: the same gradients with and without it; on by the rule only where it pays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from whileai.engine import TrainingEngine, make_datum
from whileai.engine.training import _checkpointing
from whileai.errors import ConfigError
from whileai.loop.plan.config import build, check_ranges
from whileai.loop.plan.run_plan import RunPlan, make_plan

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
    with pytest.raises(ConfigError, match="activation_checkpointing='yes' must be one of 'auto', 'on', 'off'"):
        TrainingEngine("builtin:tiny", activation_checkpointing="yes")
    assert check_ranges(build(taskset="builtin:add", activation_checkpointing="yes")) == [
        "activation_checkpointing = 'yes' must be one of 'auto', 'on', 'off'"]
    remote = check_ranges(build(taskset="builtin:add", activation_checkpointing="on", url="http://127.0.0.1:9"))
    assert len(remote) == 1 and "applies to the in-process trainer" in remote[0]


def qwen_folder(tmp_path: Path, layers: int) -> str:
    """A Qwen2.5-1.5B-shaped config.json (1.54B parameters at 28 layers); no weights: the plan reads only this."""
    config = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=1536, intermediate_size=8960,
                  num_hidden_layers=layers, num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                  tie_word_embeddings=True, max_position_embeddings=32768)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def plan_of(**settings: object) -> RunPlan:
    config = build(taskset="builtin:add", **settings)
    return make_plan(config, {name: "user" for name in settings}, None, None)


def test_the_plan_row_shows_the_value_and_where_it_came_from(tmp_path: Path):
    """auto resolves in the plan by the one rule, with its reason; a given value is the user's; the table and the
    rules section print both (what `wai train` shows at start)."""
    big = qwen_folder(tmp_path, layers=28)
    on = plan_of(model=big, device="cuda")
    assert on.activation_checkpointing == "on"
    assert on.source("activation_checkpointing") == "rule: on: 1.54B parameters on cuda (on from 1B on a GPU)"
    assert "activation_checkpointing on [rule]" in on.table()
    assert "  activation_checkpointing: on: 1.54B parameters on cuda" in on.table()
    cpu = plan_of(model=big, device="cpu")
    assert (cpu.activation_checkpointing, cpu.source("activation_checkpointing")) == (
        "off", "rule: off on cpu (on only for a model of at least 1B parameters on a GPU)")
    small = plan_of(model=qwen_folder(tmp_path, layers=2), device="cuda")  # 0.33B with its embedding
    assert small.activation_checkpointing == "off" and "0.33B parameters on cuda" in small.source(
        "activation_checkpointing")
    assert plan_of(device="cuda").source("activation_checkpointing").startswith("rule: off: a built-in model")
    given = plan_of(model=big, device="cuda", activation_checkpointing="off")
    assert (given.activation_checkpointing, given.source("activation_checkpointing")) == ("off", "user")
    assert "activation_checkpointing off [user]" in given.table()
    remote = make_plan(build(taskset="builtin:add", url="http://127.0.0.1:9"), {}, None, None)
    assert remote.activation_checkpointing is None and "activation_checkpointing" not in remote.table()


def test_the_run_trains_with_the_plans_setting():
    """The in-process trainer a run builds has checkpointing exactly as its plan says."""
    from whileai.loop.run import trainer_for

    for setting in ("on", "off"):
        config = build(taskset="builtin:add", model="builtin:tiny", activation_checkpointing=setting)
        plan = make_plan(config, {}, None, None)
        engine = trainer_for(config, plan, None, None)
        assert engine.activation_checkpointing is (setting == "on")
