"""What the Tinker SDK documents, held by `wai serve` (issue 22): stops as strings / token ids / `[]`,
`max_tokens=None`, `cross_entropy` without weights, logprobs at every position of `forward_backward`, a pending
gradient across `load_state`, per-run initialisation under concurrent creation, the RestClient's training run.
Official SDK, server in its own process; every expected number comes from the server's own other answers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

tinker = pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
from tinker import types  # noqa: E402

from whileai.engine.models import byte_tokenizer  # noqa: E402

PROMPT = [1, 57, 46, 54, 64]          # bos + "6+3=" in the built-in byte tokenizer (id = 3 + byte)
ANSWER = [60, 2]                      # "9" + eos
ADAM = types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
pytestmark = pytest.mark.filterwarnings("ignore:DEPRECATED:FutureWarning")


def datum(**inputs: Any) -> Any:
    tokens = PROMPT + ANSWER
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], **inputs})


SFT_WEIGHTS = [0.0] * (len(PROMPT) - 1) + [1.0] * len(ANSWER)


def decode(tokens: list[int]) -> str:
    return byte_tokenizer().decode(tokens)  # type: ignore[no-any-return]


def first_containing(tokens: list[int], text: str) -> int:
    """The length of the shortest prefix of ``tokens`` whose decoded text contains ``text``."""
    return next(n for n in range(1, len(tokens) + 1) if text in decode(tokens[:n]))


def printable_run(tokens: list[int], length: int) -> int:
    """The first index where ``length`` consecutive tokens are printable ASCII bytes (id = 3 + byte)."""
    return next(i for i in range(len(tokens) - length) if all(35 <= t - 3 < 127 for t in tokens[i:i + length]))


def test_string_and_token_stops_end_a_sample_where_the_decoded_text_first_holds_them(sdk: Any) -> None:
    """With one seed the draws are the same with or without stops, so a stopped sample is a prefix of the free
    one: it ends at the first token after which the decoded completion contains the stop string (kept at the
    end of the tokens, as the cookbook's renderers expect), with stop_reason "stop"."""
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4)
    sampler = training.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints(PROMPT)

    def draw(stop: Any) -> Any:
        params = types.SamplingParams(max_tokens=40, seed=5, temperature=1.0, stop=stop)
        return sampler.sample(prompt, 1, params).result().sequences[0]

    free = draw(None)
    assert free.stop_reason == "length" and len(free.tokens) == 40
    i = printable_run(free.tokens, 3)
    multi = decode(free.tokens[i:i + 3])                         # a three-token string
    single = decode(free.tokens[i + 2:i + 3])                   # a one-token string
    for stop in (multi, [multi], [single, "never-seen"]):
        texts = [stop] if isinstance(stop, str) else stop
        n = min(first_containing(free.tokens, t) for t in texts if t in decode(free.tokens))
        got = draw(stop)
        assert (got.tokens, got.stop_reason) == (free.tokens[:n], "stop"), stop
        assert got.logprobs == pytest.approx(free.logprobs[:n], abs=1e-6)
    by_id = draw([free.tokens[7]])                               # token ids still work
    assert by_id.tokens == free.tokens[:free.tokens.index(free.tokens[7]) + 1] and by_id.stop_reason == "stop"


def trained_to_stop(sdk: Any) -> Any:
    """A client whose model answers "9" then eos (SFT steps), and its sampler."""
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=8)
    for _ in range(20):
        training.forward_backward([datum(weights=SFT_WEIGHTS)], "cross_entropy")
        training.optim_step(ADAM)
    return training, training.save_weights_and_get_sampling_client()


def test_stop_none_keeps_the_eos_stop_an_empty_list_drops_it_and_max_tokens_none_runs_to_the_context(
        sdk: Any) -> None:
    _, sampler = trained_to_stop(sdk)
    prompt = types.ModelInput.from_ints(PROMPT)
    eos = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=8, seed=0, temperature=0.0)).result().sequences[0]
    assert (eos.tokens, eos.stop_reason) == (ANSWER, "stop")
    free = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=8, seed=0, temperature=0.0, stop=[])).result()
    seq = free.sequences[0]
    assert seq.tokens[:2] == ANSWER and len(seq.tokens) == 8 and seq.stop_reason == "length"  # past its eos
    # the SDK's default max_tokens=None: no cap but the model's context (builtin:tiny: 256 positions)
    to_context = sampler.sample(prompt, 1, types.SamplingParams(stop=[], seed=0)).result().sequences[0]
    assert len(to_context.tokens) == 256 - len(PROMPT) and to_context.stop_reason == "length"


def test_bad_sampling_params_are_refused_with_a_readable_message(sdk: Any) -> None:
    sampler = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4) \
        .save_weights_and_get_sampling_client()
    with pytest.raises(tinker.RequestFailedError) as err:
        sampler.sample(types.ModelInput.from_ints(PROMPT), 1,
                       types.SamplingParams(max_tokens=0, stop=["ok", ""])).result(timeout=60)
    message = str(err.value)
    assert "max_tokens=0 is invalid: it must be an integer >= 1" in message
    assert "stop=['ok', ''] is invalid: it must be non-empty stop strings, but stop[1] is ''" in message
    assert "__init__()" not in message and "holds text" not in message


def test_cross_entropy_without_weights_counts_every_position(sdk: Any) -> None:
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4)
    ones = training.forward([datum(weights=[1.0] * (len(PROMPT) + 1))], "cross_entropy").result()
    bare = training.forward([datum()], "cross_entropy").result()  # as the SDK's own forward example sends it
    logprobs = bare.loss_fn_outputs[0]["logprobs"].tolist()
    assert bare.metrics["loss:sum"] == pytest.approx(ones.metrics["loss:sum"], rel=1e-6)
    assert bare.metrics["loss:sum"] == pytest.approx(-sum(logprobs), rel=1e-5)


@pytest.mark.parametrize("loss_fn, inputs", [
    ("cross_entropy", {"weights": SFT_WEIGHTS}),
    ("importance_sampling", {"logprobs": [-1.0] * 6, "advantages": [0.0] * 4 + [1.0, 0.0]}),
    ("ppo", {"logprobs": [-1.0] * 6, "advantages": [0.0] * 4 + [0.0, -1.0]}),
    ("cispo", {"logprobs": [-1.0] * 6, "advantages": [0.0] * 5 + [2.0]}),
])
def test_forward_backward_returns_the_logprob_of_every_position_whatever_the_loss_reads(
        sdk: Any, loss_fn: str, inputs: dict[str, Any]) -> None:
    """The cookbook's kl_sample_train metrics read forward_backward's logprobs at every action token, also where
    the advantage is 0: they must equal forward's (the same weights), not 0."""
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4)
    scored = training.forward([datum(weights=[1.0] * 6)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    out = training.forward_backward([datum(**inputs)], loss_fn).result().loss_fn_outputs[0]["logprobs"]
    assert all(v < 0 for v in scored.tolist())
    np.testing.assert_allclose(out.tolist(), scored.tolist(), rtol=1e-5, atol=1e-6)


def test_a_gradient_pending_when_a_state_is_loaded_is_dropped(sdk: Any) -> None:
    """save_state, forward_backward (no optim_step), load_state: the next optim_step has no gradient to apply,
    so the weights stay the saved ones."""
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4)
    training.forward_backward([datum(weights=SFT_WEIGHTS)], "cross_entropy")
    training.optim_step(ADAM).result()
    saved = training.save_state("before").result().path
    probe = [datum(weights=[1.0] * 6)]
    before = training.forward(probe, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    training.forward_backward([datum(weights=SFT_WEIGHTS)], "cross_entropy").result()
    training.load_state_with_optimizer(saved).result()
    step = training.optim_step(ADAM).result()
    assert step.metrics["grad_norm"] == 0.0
    after = training.forward(probe, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-6)


def one_step_loss(sdk: Any, seed: int) -> float:
    training = sdk.create_lora_training_client(base_model="builtin:mini", rank=4, seed=seed)
    training.forward_backward([datum(weights=SFT_WEIGHTS)], "cross_entropy")
    training.optim_step(ADAM)
    return float(training.forward([datum(weights=SFT_WEIGHTS)], "cross_entropy").result().metrics["loss:sum"])


def test_runs_created_at_once_with_one_seed_start_from_the_same_weights(sdk: Any) -> None:
    """The loss after one step depends on the base weights and the LoRA initialisation: four runs created
    concurrently with seed 3 must give the one a run created alone gives; seed 4 another."""
    alone = one_step_loss(sdk, 3)
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda _: one_step_loss(sdk, 3), range(4)))
    assert together == [alone] * 4
    assert one_step_loss(sdk, 4) != alone


def test_the_rest_client_reads_a_training_run_by_its_tinker_path(sdk: Any) -> None:
    """What tinker-cookbook reads on resume: the run behind a checkpoint path, with the user_metadata it was
    created with (the renderer name) and its latest saved state."""
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4,
                                                   user_metadata={"renderer_name": "role_colon"})
    path = training.save_state("ckpt-1").result().path
    rest = sdk.create_rest_client()
    run = rest.get_training_run_by_tinker_path(path).result(timeout=60)
    assert (run.training_run_id, run.base_model, run.is_lora, run.lora_rank) == (training.model_id, "builtin:tiny",
                                                                                  True, 4)
    assert run.user_metadata == {"renderer_name": "role_colon"}
    assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == path
    assert rest.get_training_run(training.model_id).result(timeout=60).training_run_id == training.model_id
    with pytest.raises(tinker.NotFoundError, match="no model 'run-nobody'"):
        rest.get_training_run("run-nobody").result(timeout=60)


def test_a_data_dirs_old_builtin_tokenizer_is_rewritten_by_the_one_rule(tmp_path):
    """A data dir written by an older version holds a tokenizer without BOS; the server rewrites it once per
    process, so `get_tokenizer()` always tokenizes as training does."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from whileai.engine.models import byte_tokenizer
    from whileai.service.tinker_api import TinkerFront

    stale = tmp_path / "tokenizers" / "builtin"
    stale.mkdir(parents=True)
    (stale / "tokenizer.json").write_text("{}")  # not a tokenizer at all: it must not survive
    front = TinkerFront(SimpleNamespace(config=SimpleNamespace(data_dir=str(tmp_path))))
    folder = front.tokenizer_id("builtin:tiny")
    loaded = AutoTokenizer.from_pretrained(folder)
    assert loaded.encode("ab") == byte_tokenizer().encode("ab")
    assert front.tokenizer_id("builtin:tiny") == folder
