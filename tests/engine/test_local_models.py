"""Local model directories beyond the built-ins: tied embeddings and GPT-2's Conv1D layers.

The models are built here from transformers configs (no hub), saved, and loaded by path the way a user
loads a checkpoint of their own.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from whileai.engine import AdamParams, TrainingEngine, make_datum
from whileai.engine.logprobs import naive_logprobs
from whileai.engine.models import byte_tokenizer
from whileai.errors import ConfigError

DATA = [make_datum([1, 10, 11], [12, 13, 2]), make_datum([1, 40], [41, 42, 2])]
PROBE = [1, 10, 11, 12, 13, 2, 40, 41, 42]
HIDDEN, LAYERS, VOCAB = 32, 2, 259


def save_local(path, kind: str, tied: bool) -> str:
    """A 2-layer, hidden-32 Qwen2 or GPT-2 with the byte tokenizer, randomly initialised, saved to ``path``."""
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    tokenizer = byte_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if kind == "qwen2":
            model = Qwen2ForCausalLM(Qwen2Config(
                vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                tie_word_embeddings=tied, pad_token_id=0, bos_token_id=1, eos_token_id=2))
        else:
            model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=4,
                                               n_positions=64, tie_word_embeddings=tied, bos_token_id=1,
                                               eos_token_id=2))
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="module")
def local_dirs(tmp_path_factory) -> dict[tuple[str, bool], str]:
    root = tmp_path_factory.mktemp("local_models")
    return {(kind, tied): save_local(root / f"{kind}-{tied}", kind, tied)
            for kind in ("qwen2", "gpt2") for tied in (True, False)}


def trained(path: str, **kwargs) -> TrainingEngine:
    engine = TrainingEngine(path, seed=0, **kwargs)
    for _ in range(5):
        engine.forward_backward(DATA, "cross_entropy")
        engine.optim_step(AdamParams(learning_rate=5e-2))
    return engine


def probe_logprobs(model) -> np.ndarray:
    ids, targets = torch.tensor([PROBE[:-1]]), torch.tensor([PROBE[1:]])
    with torch.no_grad():
        return naive_logprobs(model.eval(), ids, targets)[0].numpy()


# ----------------------------------------------------------------------------- merged export
@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("lora_rank", [0, 4])
def test_merged_export_reproduces_the_engines_logprobs(local_dirs, tmp_path, kind, tied, lora_rank):
    """Before the fix, a LoRA on the tied output layer was merged into the shared matrix, which moved the
    input embeddings too: Qwen2 tied + LoRA differed by ~2 nats here (9-20 nats on a real GPT-2)."""
    from transformers import AutoModelForCausalLM

    engine = trained(local_dirs[kind, tied], lora_rank=lora_rank)
    want = np.array(engine.compute_logprobs(PROBE)["logprobs"][1:])
    assert np.max(np.abs(want - probe_logprobs(AutoModelForCausalLM.from_pretrained(local_dirs[kind, tied])))) > 0.1
    path = engine.export(str(tmp_path / "merged"), merged=True)
    merged = AutoModelForCausalLM.from_pretrained(path)
    assert np.max(np.abs(probe_logprobs(merged) - want)) <= 1e-4
    head, embedding = merged.get_output_embeddings().weight, merged.get_input_embeddings().weight
    assert (head.data_ptr() == embedding.data_ptr()) == (tied and lora_rank == 0)  # untied only when needed


def test_the_engine_keeps_the_tie_while_training_a_lora_on_the_head(local_dirs):
    engine = trained(local_dirs["qwen2", True], lora_rank=4)
    base = engine.model.get_base_model()
    assert base.lm_head.base_layer.weight is base.model.embed_tokens.weight


# ----------------------------------------------------------------------------- GPT-2 Conv1D under LoRA
def test_lora_on_gpt2_adapts_its_conv1d_attention_and_mlp_layers(local_dirs):
    engine = TrainingEngine(local_dirs["gpt2", False], lora_rank=4, seed=0)
    info = engine.info()
    assert info["lora"]["target_modules"] == ["c_attn", "c_proj", "c_fc", "lm_head"]
    assert info["adapted_modules"] == {"transformer.h.*.attn.c_attn": 2, "transformer.h.*.attn.c_proj": 2,
                                       "transformer.h.*.mlp.c_fc": 2, "transformer.h.*.mlp.c_proj": 2,
                                       "lm_head": 1}
    # r (in + out) per layer: c_attn 32->96, attn.c_proj 32->32, c_fc 32->128, mlp.c_proj 128->32, lm_head 32->259
    per_layer = 4 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32))
    assert info["trainable_parameters"] == LAYERS * per_layer + 4 * (32 + VOCAB)
    assert info["notes"] == []
    before = np.array(engine.compute_logprobs(PROBE)["logprobs"][1:])
    for _ in range(3):
        engine.forward_backward(DATA, "cross_entropy")
        engine.optim_step(AdamParams(learning_rate=5e-2))
    moved = {n for n, p in engine.model.named_parameters() if "lora_B" in n and p.abs().max() > 0}
    assert any(".attn.c_attn." in n for n in moved) and any(".mlp.c_fc." in n for n in moved)
    assert np.max(np.abs(np.array(engine.compute_logprobs(PROBE)["logprobs"][1:]) - before)) > 0.1


def test_attention_only_on_gpt2_picks_the_attention_c_proj_not_the_mlps(local_dirs):
    engine = TrainingEngine(local_dirs["gpt2", False], lora_rank=2, seed=0, train_mlp=False, train_unembed=False)
    assert engine.info()["lora"]["target_modules"] == ["c_attn", "attn.c_proj"]
    assert engine.info()["adapted_modules"] == {"transformer.h.*.attn.c_attn": 2, "transformer.h.*.attn.c_proj": 2}


def test_conv1d_layers_can_be_named_and_a_bad_name_lists_the_adaptable_ones(local_dirs):
    engine = TrainingEngine(local_dirs["gpt2", True], lora_rank=2, seed=0, target_modules=["c_attn", "mlp.c_proj"])
    assert engine.info()["adapted_modules"] == {"transformer.h.*.attn.c_attn": 2, "transformer.h.*.mlp.c_proj": 2}
    with pytest.raises(ConfigError, match=r"target_modules \['q_proj'\] name no layer .* end in "
                                          r"\['c_attn', 'c_fc', 'c_proj', 'lm_head', 'wpe', 'wte'\]"):
        TrainingEngine(local_dirs["gpt2", True], lora_rank=2, target_modules=["q_proj"])


def test_an_adapter_on_the_output_layer_only_says_so(local_dirs):
    with pytest.warns(UserWarning, match=r"LoRA adapts only the output layer 'lm_head'"):
        engine = TrainingEngine(local_dirs["gpt2", False], lora_rank=2, train_attn=False, train_mlp=False)
    assert engine.info()["adapted_modules"] == {"lm_head": 1}
    assert len(engine.info()["notes"]) == 1 and "only the output layer" in engine.info()["notes"][0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default discovery on Qwen2 warns about nothing
        assert TrainingEngine("builtin:tiny", lora_rank=2).info()["notes"] == []


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")  # PEFT's own, on reload
def test_an_exported_gpt2_adapter_reloads_with_peft(local_dirs, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    engine = trained(local_dirs["gpt2", True], lora_rank=4)
    want = np.array(engine.compute_logprobs(PROBE)["logprobs"][1:])
    path = engine.export(str(tmp_path / "adapter"))
    base = AutoModelForCausalLM.from_pretrained(local_dirs["gpt2", True])
    assert np.max(np.abs(probe_logprobs(PeftModel.from_pretrained(base, path)) - want)) <= 1e-4
