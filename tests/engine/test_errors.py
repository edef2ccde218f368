"""One error type: every bad value given to the public engine API raises ``ConfigError`` (a setting)
or ``BatchError`` (data), each naming the field, never a bare ``ValueError`` / ``TypeError`` /
``AttributeError`` that the CLI and the service could not map to a clear message.

(``sample``'s prompt and ``SamplingParams`` checks live in sampling.py and are tested there.)
"""

from __future__ import annotations

import pytest
import torch

from whileai.engine import AdamParams, TrainingEngine, load_model, make_datum, resolve_config
from whileai.engine.critic import Critic
from whileai.engine.reference import model_logprobs
from whileai.errors import BatchError, ConfigError

DATUM = make_datum([1, 10], [11, 2])
ROW = {"prompt_tokens": [1, 10], "tokens": [11, 2], "reward": 1.0}


@pytest.fixture(scope="module")
def engine() -> TrainingEngine:
    return TrainingEngine("builtin:tiny", seed=0)


@pytest.fixture(scope="module")
def lora_engine() -> TrainingEngine:
    return TrainingEngine("builtin:tiny", seed=0, lora_rank=2)


def _weights(engine: TrainingEngine, version: int) -> None:
    with engine.weights(version):
        pass


def _critic_lr(engine: TrainingEngine, value: object) -> None:
    critic = Critic(4, learning_rate=1e-3)
    critic.learning_rate = value  # type: ignore[assignment]


# (what, error type, text the message must contain, call)
CASES = [
    # ------------------------------------------------------------------ building
    ("micro_batch_tokens", ConfigError, "micro_batch_tokens=0", lambda e: TrainingEngine(micro_batch_tokens=0)),
    ("logprob_chunk", ConfigError, "logprob_chunk='8'", lambda e: TrainingEngine(logprob_chunk="8")),
    ("name not a string", ConfigError, "name_or_path=123", lambda e: load_model(123)),
    ("unknown builtin", ConfigError, "builtin:huge", lambda e: load_model("builtin:huge")),
    ("missing directory", ConfigError, "./no/such/dir", lambda e: load_model("./no/such/dir")),
    ("lora_rank", ConfigError, "lora_rank=-1", lambda e: load_model("builtin:tiny", lora_rank=-1)),
    ("lora_alpha", ConfigError, "lora_alpha=-2", lambda e: load_model("builtin:tiny", lora_rank=2, lora_alpha=-2)),
    ("lora_dropout", ConfigError, "lora_dropout=1.5", lambda e: load_model("builtin:tiny", lora_dropout=1.5)),
    ("seed", ConfigError, "seed=-1", lambda e: load_model("builtin:tiny", seed=-1)),
    ("train flag", ConfigError, "train_mlp='no'", lambda e: load_model("builtin:tiny", train_mlp="no")),
    ("dtype", ConfigError, "dtype 'float8'", lambda e: load_model("builtin:tiny", dtype="float8")),
    ("autocast", ConfigError, "autocast 'fp8'", lambda e: load_model("builtin:tiny", autocast="fp8")),
    ("target_modules", ConfigError, "target_modules ['qkv']",
     lambda e: load_model("builtin:tiny", lora_rank=2, target_modules=["qkv"])),
    # ------------------------------------------------------------------ forward / forward_backward
    ("data not a list", BatchError, "data must be a list", lambda e: e.forward_backward("x", "cross_entropy")),
    ("empty data", BatchError, "data is empty", lambda e: e.forward_backward([], "cross_entropy")),
    ("token outside vocab", BatchError, "token 999", lambda e: e.forward([make_datum([1, 999], [2])])),
    ("unknown loss", ConfigError, "unknown loss 'nope'", lambda e: e.forward_backward([DATUM], "nope")),
    ("unknown config key", ConfigError, "'clip'", lambda e: e.forward([DATUM], "ppo", {"clip": 0.2})),
    ("bad config value", ConfigError, "clip_low_threshold", lambda e: resolve_config("ppo", {"clip_low_threshold": -1})),
    ("config not a dict", ConfigError, "loss_fn_config", lambda e: e.forward([DATUM], "ppo", 0.2)),
    ("value loss, no critic", ConfigError, "add_critic", lambda e: e.forward_backward([DATUM], "ppo_critic")),
    ("sampling_params type", ConfigError, "sampling_params=0.7", lambda e: e.forward([DATUM], sampling_params=0.7)),
    ("sampling_params field", ConfigError, "top_p", lambda e: e.forward([DATUM], sampling_params={"top_p": 2.0})),
    ("sampling_params unknown", ConfigError, "['temp']", lambda e: e.forward([DATUM], sampling_params={"temp": 1})),
    ("greedy scoring", ConfigError, "temperature=0",
     lambda e: e.forward_backward([DATUM], "cross_entropy", sampling_params={"temperature": 0})),
    ("no reference", ConfigError, "reference=True", lambda e: e.forward([DATUM], reference=True)),
    # ------------------------------------------------------------------ optimizer
    ("learning_rate", ConfigError, "AdamParams.learning_rate=-1", lambda e: e.optim_step({"learning_rate": -1})),
    ("adam field", ConfigError, "unknown fields ['lr']", lambda e: e.optim_step({"lr": 1e-3})),
    ("adam type", ConfigError, "adam_params must be", lambda e: e.optim_step(1e-3)),
    ("eps 0", ConfigError, "AdamParams.eps=0", lambda e: AdamParams(eps=0)),
    ("beta1 1", ConfigError, "AdamParams.beta1=1.0", lambda e: AdamParams(beta1=1.0)),
    ("beta2 string", ConfigError, "AdamParams.beta2='0.9'", lambda e: AdamParams(beta2="0.9")),
    # ------------------------------------------------------------------ log-probabilities, versions
    ("empty sequence", BatchError, "tokens must be", lambda e: e.compute_logprobs([])),
    ("sequence token", BatchError, "token 999", lambda e: e.compute_logprobs([1, 999])),
    ("top_k", ConfigError, "top_k=-1", lambda e: e.compute_logprobs([1, 2], top_k=-1)),
    ("top_k type", ConfigError, "top_k='2'", lambda e: e.compute_logprobs([1, 2], top_k="2")),
    ("version", ConfigError, "no sampler weights of version 99", lambda e: _weights(e, 99)),
    # ------------------------------------------------------------------ critic
    ("critic lr", ConfigError, "learning_rate=0", lambda e: e.add_critic(learning_rate=0)),
    ("critic range", ConfigError, "reward_range=(1.0, 0.0)", lambda e: e.add_critic(1e-3, reward_range=(1.0, 0.0))),
    ("critic option", ConfigError, "'bogus'", lambda e: e.add_critic(1e-3, bogus=1)),
    ("critic betas", ConfigError, "betas=(2.0, 0.9)", lambda e: e.add_critic(1e-3, betas=(2.0, 0.9))),
    ("critic lr setter", ConfigError, "learning_rate='x'", lambda e: _critic_lr(e, "x")),
    ("critic targets", BatchError, "targets is not an array",
     lambda e: Critic(4, learning_rate=1e-3).loss(torch.zeros(2, 4), [[0.0], [0.0, 1.0]])),
    ("critic value_clip", ConfigError, "value_clip=-1",
     lambda e: Critic(4, learning_rate=1e-3).loss(torch.zeros(2, 4), [0.0, 0.0], value_clip=-1, old_values=[0, 0])),
    # ------------------------------------------------------------------ state, export, reference helpers
    ("no state", ConfigError, "no saved state", lambda e: e.load_state("/nonexistent/whileai-state")),
    ("adapter of a full model", ConfigError, "no adapter to export", lambda e: e.export("/tmp/whileai-x")),
    ("reference shapes", BatchError, "input_ids (1, 2) and targets (1, 1)",
     lambda e: model_logprobs(e.model, [[1, 2]], [[1]])),
    ("reference ids", BatchError, "input_ids is not a rectangular array",
     lambda e: model_logprobs(e.model, [[1, 2], [3]], [[1, 2], [3]])),
    ("make_datum", BatchError, "make_datum needs a non-empty prompt", lambda e: make_datum([], [1])),
]


@pytest.mark.parametrize("what, error, text, call", CASES, ids=[c[0] for c in CASES])
def test_every_bad_value_raises_config_or_batch_error(engine, what, error, text, call):
    with pytest.raises(Exception) as caught:
        call(engine)
    assert type(caught.value) is error, f"{what}: {type(caught.value).__name__}: {caught.value}"
    assert text in str(caught.value)


def test_a_named_adapter_directory_that_exists_is_refused(lora_engine, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "file").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not empty; pass overwrite=True"):
        lora_engine.export(str(tmp_path / "out"))
