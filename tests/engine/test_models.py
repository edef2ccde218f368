"""load_model: built-ins from a config and a seed, the byte tokenizer, LoRA, local dirs, hub errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from whileai.engine import BUILTINS, AdamParams, SamplingParams, TrainingEngine, load_model, make_datum
from whileai.engine.models import byte_tokenizer, parameter_count, resolve_precision
from whileai.errors import ConfigError


def test_builtins_are_real_qwen2_models_determined_by_the_seed():
    a, b, c = (load_model("builtin:tiny", seed=s).model for s in (0, 0, 1))
    assert type(a).__name__ == "Qwen2ForCausalLM"
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    # building a model must not consume the caller's random stream
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    load_model("builtin:tiny", seed=5)
    assert torch.equal(torch.rand(1), expected)


def test_builtin_sizes():
    """tiny ~0.1M (tests), mini ~0.85M (demo), small ~26M (the train_step benchmark: 8 layers of
    4 * 512^2 attention + 3 * 512 * 1408 MLP = 3.21M, plus 2 * 259 * 512 embeddings)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    assert parameter_count(load_model("builtin:tiny").model) == 107_456
    with torch.device("meta"):
        small = Qwen2ForCausalLM(Qwen2Config(vocab_size=259, tie_word_embeddings=False, **BUILTINS["small"]))
    assert 25e6 < parameter_count(small) < 27e6


def test_byte_tokenizer_maps_byte_b_to_id_3_plus_b_and_round_trips():
    tok = byte_tokenizer()
    text = "héllo, wörld\n\t😀"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == [3 + b for b in text.encode("utf-8")]
    assert tok.decode(ids) == text
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, len(tok)) == (0, 1, 2, 259)


def test_lora_trains_only_the_adapters_of_the_chosen_modules():
    loaded = load_model("builtin:tiny", lora_rank=4, lora_alpha=8, train_mlp=False, train_unembed=False)
    trainable = [n for n, p in loaded.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert loaded.lora == {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
                           "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    full = load_model("builtin:tiny")
    assert all(p.requires_grad for p in full.model.parameters()) and full.lora is None


def test_bad_model_arguments_say_what_is_valid():
    with pytest.raises(ValueError, match=r"unknown built-in model 'builtin:huge': use one of \['builtin:tiny'"):
        load_model("builtin:huge")
    with pytest.raises(ConfigError, match=r"target_modules \['qkv'\] name no layer LoRA can adapt in this model"):
        load_model("builtin:tiny", lora_rank=2, target_modules=["qkv"])
    with pytest.raises(ValueError, match="lora_rank=-1 must be an integer: 0 for full fine-tuning"):
        load_model("builtin:tiny", lora_rank=-1)
    with pytest.raises(ValueError, match=r"dtype 'float8' is not known"):
        load_model("builtin:tiny", dtype="float8")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda' was asked for but torch sees no CUDA GPU"):
            load_model("builtin:tiny", device="cuda")
    with pytest.raises(ValueError, match="model directory './no/such/dir' does not exist"):
        load_model("./no/such/dir")


def test_an_unreachable_hub_id_fails_fast_with_a_clear_message():
    """Offline (as on this machine), a hub id is refused within seconds (no ~25 s of download retries)
    with what was tried and what to pass instead; also with HF_HUB_OFFLINE set. Where a hub is
    reachable the id does not exist there, which fails fast too, with the same first sentence."""
    code = ("import os, time\nfrom whileai.engine import load_model\nimport transformers, peft  # imports untimed\n"
            "for offline in ('', '1'):\n    os.environ['HF_HUB_OFFLINE'] = offline\n    start = time.time()\n"
            "    try:\n        load_model('no-such-org/no-such-model')\n"
            "    except ValueError as err:\n        print(err)\n    print('seconds', time.time() - start)\n")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    runs = out.stdout.split("seconds")
    assert len(runs) == 3, out.stdout + out.stderr
    for run in runs[:2]:
        assert "could not load model 'no-such-org/no-such-model' from the Hugging Face hub" in run
        assert "a hub id on a machine that can reach the hub" in run and "or one of ['builtin:tiny'" in run
    assert "HF_HUB_OFFLINE is set" in runs[1]
    assert all(float(run.split()[0]) < 10 for run in runs[1:]), out.stdout  # no ~25 s of retries


def test_behind_a_proxy_that_cannot_reach_the_hub_a_hub_id_fails_fast(monkeypatch):
    """A proxy that refuses (here: nothing listens at its address) is tried once, not skipped: a mistyped model
    name fails within seconds instead of ~50 s of transformers' retries (found by a newcomer behind a proxy)."""
    from whileai.engine.models import hub_unreachable

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    start = time.time()
    reason = hub_unreachable()
    assert reason is not None and "through the proxy" in reason
    assert time.time() - start < 5


def test_a_local_directory_loads_the_same_model(tmp_path):
    engine = TrainingEngine("builtin:tiny", seed=9)
    path = engine.export(str(tmp_path / "full"), merged=True)
    tokens = [1, 50, 51, 52, 53]
    again = TrainingEngine(path)
    assert again.compute_logprobs(tokens)["logprobs"] == engine.compute_logprobs(tokens)["logprobs"]
    assert again.tokenizer.encode("abc", add_special_tokens=False) == [100, 101, 102]
    with_lora = load_model(path, lora_rank=2)
    assert sum(p.requires_grad for p in with_lora.model.parameters()) > 0


def test_bfloat16_runs_and_returns_float32_logprobs():
    engine = TrainingEngine("builtin:tiny", dtype="bfloat16", seed=9)
    full = TrainingEngine("builtin:tiny", seed=9)
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    datum = {"model_input": [1, 50, 51], "loss_fn_inputs": {"target_tokens": [50, 51, 52], "weights": [1.0] * 3}}
    low = engine.forward_backward([datum], "cross_entropy").loss_fn_outputs[0]["logprobs"]
    high = full.forward([datum]).loss_fn_outputs[0]["logprobs"]
    assert low.dtype.name == "float32"
    assert low == pytest.approx(high, abs=0.1)  # bf16 weights: ~3 significant digits
    assert engine.optim_step().grad_norm > 0


def test_bf16_lora_keeps_the_trainable_adapters_in_float32():
    """PEFT creates adapters in float32 over a bf16 base, so small AdamW updates are not rounded away."""
    model = load_model("builtin:tiny", lora_rank=2, dtype="bfloat16").model
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}


@pytest.mark.parametrize("device, dtype, autocast, lora, expected", [
    ("cpu", None, "auto", False, (torch.float32, None)),              # the default: CPU float32
    ("cpu", None, "auto", True, (torch.float32, None)),
    ("cuda", None, "auto", True, (torch.bfloat16, None)),             # LoRA: bf16 base, fp32 adapters
    ("cuda", None, "auto", False, (torch.float32, torch.bfloat16)),   # full FT: fp32 weights + bf16 autocast
    ("cuda", None, "off", False, (torch.float32, None)),
    ("cuda", "bfloat16", "auto", False, (torch.bfloat16, None)),      # an explicit dtype is used as given
    ("cpu", None, "bfloat16", False, (torch.float32, torch.bfloat16)),
    ("cpu", "float64", "auto", False, (torch.float64, None)),
])
def test_precision_rules(device, dtype, autocast, lora, expected):
    assert resolve_precision(device, dtype, autocast, lora) == expected


def test_autocast_runs_every_forward_in_bfloat16_and_keeps_float32_weights():
    """The CUDA default for full fine-tuning (float32 weights, bf16 autocast), run here on the CPU:
    the same code path, with torch.autocast's device type taken from the model's device."""
    mixed = TrainingEngine("builtin:tiny", autocast="bfloat16", seed=9)
    full = TrainingEngine("builtin:tiny", seed=9)
    datum = {"model_input": [1, 50, 51], "loss_fn_inputs": {"target_tokens": [50, 51, 52], "weights": [1.0] * 3}}
    low = mixed.forward_backward([datum], "cross_entropy").loss_fn_outputs[0]["logprobs"]
    high = full.forward([datum]).loss_fn_outputs[0]["logprobs"]
    assert low.dtype.name == "float32"
    assert low == pytest.approx(high, abs=0.1) and not np.array_equal(low, high)  # bf16 matmuls ran
    assert mixed.compute_logprobs([1, 50, 51, 52])["logprobs"][1:] == pytest.approx(high.tolist(), abs=0.1)
    before = {n: p.detach().clone() for n, p in mixed.named_params.items()}
    assert mixed.optim_step(AdamParams(learning_rate=1e-3)).grad_norm > 0
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())
    assert all(not torch.equal(before[n], p) for n, p in mixed.named_params.items())
    assert len(mixed.sample([1, 50], 2, SamplingParams(max_tokens=3, seed=0))) == 2
    with pytest.raises(ValueError, match=r"autocast 'fp8' is not known: use one of \['auto', 'off'"):
        load_model("builtin:tiny", autocast="fp8")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("lora_rank", [0, 4])
def test_cuda_defaults_train_and_agree_with_the_cpu(lora_rank):
    """On a GPU with the defaults (full FT: fp32 weights + bf16 autocast; LoRA: bf16 base), one SFT step
    runs, logprobs agree with the CPU float32 ones to bf16 accuracy, and a seeded sample repeats."""
    gpu = TrainingEngine("builtin:tiny", lora_rank=lora_rank, seed=9)
    cpu = TrainingEngine("builtin:tiny", lora_rank=lora_rank, seed=9, device="cpu")
    assert gpu.device.type == "cuda" and (gpu.loaded.autocast is not None) == (lora_rank == 0)
    datum = make_datum([1, 50, 51], [52, 53, 2])
    low = gpu.forward_backward([datum], "cross_entropy").loss_fn_outputs[0]["logprobs"]
    high = cpu.forward([datum]).loss_fn_outputs[0]["logprobs"]
    assert low == pytest.approx(high, abs=0.1)
    assert gpu.optim_step(AdamParams(learning_rate=1e-3)).grad_norm > 0
    params = SamplingParams(max_tokens=5, seed=2)
    assert gpu.sample([1, 50], 2, params) == gpu.sample([1, 50], 2, params)


def test_model_problem_names_what_is_wrong_without_loading(tmp_path):
    from whileai.engine.models import model_problem

    assert model_problem("builtin:tiny") is None and model_problem("Qwen/Qwen3-0.6B") is None  # a hub id: later
    assert "not a built-in model; the built-ins are ['builtin:tiny'" in model_problem("builtin:huge")
    assert "does not exist" in model_problem(str(tmp_path / "missing"))
    assert "has no config.json" in model_problem(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert model_problem(str(tmp_path)) is None


def test_wai_serve_refuses_a_model_it_could_never_load_before_starting(tmp_path, capsys):
    from whileai.cli import main

    assert main(["serve", "--model", str(tmp_path / "missing"), "--port", "0", "--data-dir", str(tmp_path / "d")]) == 2
    assert "--model: model folder" in capsys.readouterr().err and not (tmp_path / "d").exists()
