"""The SDK 0.38 sampling fields against a `wai serve` subprocess, each checked against another way to get the
same number: top-k rows against the sampled tokens' own log-probabilities, targets against prompt_logprobs,
alternative draws against targets, a session-less sample against the same sample in a session, and sampled
log-probabilities at two temperatures against each other (differences scale by 1/τ, tinker-cookbook's
validate_temperature_logprobs idea).
"""

from __future__ import annotations

import math
from typing import Any

import httpx
import numpy as np
import pytest

tinker = pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
from tinker import types  # noqa: E402
from tinker.proto.response_conv import deserialize_sample_response  # noqa: E402

from whileai.service.launch import LocalServer  # noqa: E402

PROMPT = [1, 57, 46, 54, 64, 60, 45, 70]
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def trained(sdk: Any) -> Any:
    """A LoRA run one step away from its initialisation (so LoRA weights matter), and its sampling client."""
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4, seed=2).result()
    tokens = PROMPT + [60, 2]
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    training.forward_backward([datum], "cross_entropy").result(timeout=60)
    training.optim_step(types.AdamParams(learning_rate=5e-2)).result(timeout=60)
    path = training.save_weights_for_sampler("one-step").result(timeout=60).path
    return training, sdk.create_sampling_client(model_path=path), path


def test_topk_sample_logprobs_hold_each_sampled_token_at_its_own_logprob(trained: Any) -> None:
    _, sampler, _ = trained
    out = sampler.sample(types.ModelInput.from_ints(PROMPT), 3, types.SamplingParams(max_tokens=6, seed=1, stop=[]),
                         topk_sample_logprobs=259).result(timeout=60)  # the whole byte vocabulary
    for seq in out.sequences:
        assert len(seq.topk_logprobs) == len(seq.tokens) == 6
        for token, logprob, row in zip(seq.tokens, seq.logprobs, seq.topk_logprobs):
            ranked = dict(row)
            assert ranked[token] == pytest.approx(logprob, abs=1e-5)
            assert [lp for _, lp in row] == sorted([lp for _, lp in row], reverse=True)
            assert math.fsum(math.exp(lp) for _, lp in row) == pytest.approx(1.0, abs=1e-4)


def test_prompt_logprobs_last_n_targets_and_alternative_draws_agree_with_prompt_logprobs(trained: Any) -> None:
    _, sampler, _ = trained
    prompt = types.ModelInput.from_ints(PROMPT)
    full = sampler.compute_logprobs(prompt).result(timeout=60)
    last = sampler.compute_logprobs(prompt, prompt_logprobs_last_n=3).result(timeout=60)
    assert last[:-3] == [None] * (len(PROMPT) - 3) and last[-3:] == pytest.approx(full[-3:], abs=1e-6)

    shifted = np.array([[PROMPT[i + 1], 5, -1] for i in range(len(PROMPT) - 1)])
    targets = types.TensorData.from_numpy(shifted)
    out = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=1, seed=3), include_prompt_logprobs=True,
                         target_prompt_logprobs=targets, prompt_alt_tokens_k=4).result(timeout=60)
    scored = out.target_prompt_logprobs.to_numpy()
    assert scored.shape == (len(PROMPT) - 1, 3)
    assert scored[:, 0] == pytest.approx(full[1:], abs=1e-5)  # the prompt's own next tokens: prompt_logprobs

    alt_tokens = out.prompt_alt_tokens.tokens.to_numpy()
    alt_logprobs = out.prompt_alt_tokens.logprobs.to_numpy()
    assert alt_tokens.shape == alt_logprobs.shape == (len(PROMPT) - 1, 4)
    again = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=1, seed=3),
                           target_prompt_logprobs=types.TensorData.from_numpy(alt_tokens.astype(np.int64))
                           ).result(timeout=60)
    assert again.target_prompt_logprobs.to_numpy() == pytest.approx(alt_logprobs, abs=1e-5)  # at temperature 1
    redrawn = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=1, seed=3),
                             prompt_alt_tokens_k=4).result(timeout=60)
    assert (redrawn.prompt_alt_tokens.tokens.to_numpy() == alt_tokens).all()  # one seed, the same draws


def test_sampling_by_model_path_or_base_model_needs_no_sampling_session(trained: Any, tml_server: LocalServer) -> None:
    """A SampleRequest with model_path (or base_model) and no sampling_session_id, as other Tinker clients send
    it: the same draws as the sampling client on those weights with the same seed."""
    _, sampler, path = trained
    params = types.SamplingParams(max_tokens=5, seed=11, stop=[])
    expected = sampler.sample(types.ModelInput.from_ints(PROMPT), 2, params).result(timeout=60)
    http = httpx.Client(base_url=tml_server.url, headers={"X-API-Key": tml_server.token}, timeout=60)

    def direct(**where: Any) -> Any:
        request = types.SampleRequest(prompt=types.ModelInput.from_ints(PROMPT), num_samples=2,
                                      sampling_params=params, **where)
        future = http.post("/api/v1/asample", json=request.model_dump(mode="json", exclude_none=True))
        assert future.status_code == 200, future.text
        while True:
            answer = http.post("/api/v1/retrieve_future", json={"request_id": future.json()["request_id"]})
            if "protobuf" in answer.headers["content-type"]:
                return deserialize_sample_response(answer.content)
            assert answer.json().get("type") == "try_again", answer.text

    by_path = direct(model_path=path)
    assert [list(s.tokens) for s in by_path.sequences] == [list(s.tokens) for s in expected.sequences]
    base = direct(base_model="builtin:tiny")
    assert len(base.sequences) == 2 and all(len(s.tokens) == 5 for s in base.sequences)
    state = path.replace("/sampler_weights/", "/weights/")
    request = types.SampleRequest(prompt=types.ModelInput.from_ints(PROMPT), sampling_params=params, model_path=state)
    refused = http.post("/api/v1/asample", json=request.model_dump(mode="json", exclude_none=True))
    assert refused.status_code == 404 and "sampling takes sampler weights" in refused.json()["error"]


@pytest.mark.parametrize("temperature", [0.5, 0.7, 1.2, 1.5, 1.8])  # the cookbook check's temperatures
def test_sampled_logprob_differences_scale_by_one_over_the_temperature(trained: Any, temperature: float) -> None:
    """At every sampled position, log p_τ(a) - log p_τ(b) = (log p_1(a) - log p_1(b)) / τ for the sampled token a
    and the most likely token b, with p_1 scored by compute_logprobs-style prompt top-k on the same tokens."""
    _, sampler, _ = trained
    out = sampler.sample(types.ModelInput.from_ints(PROMPT), 4, types.SamplingParams(
        max_tokens=6, seed=7, stop=[], temperature=temperature), topk_sample_logprobs=1).result(timeout=60)
    checked = 0
    for seq in out.sequences:
        tokens = PROMPT + list(seq.tokens)
        plain = sampler.sample(types.ModelInput.from_ints(tokens), 1, types.SamplingParams(max_tokens=1),
                               include_prompt_logprobs=True, topk_prompt_logprobs=1).result(timeout=60)
        for i, (token, logprob, row) in enumerate(zip(seq.tokens, seq.logprobs, seq.topk_logprobs)):
            at = len(PROMPT) + i
            (top, top_tempered), = row
            ((top_plain_id, top_plain),) = plain.topk_prompt_logprobs[at]
            assert top == top_plain_id  # temperature keeps the order
            tempered_gap = logprob - top_tempered
            plain_gap = plain.prompt_logprobs[at] - top_plain
            assert tempered_gap == pytest.approx(plain_gap / temperature, abs=2e-4)
            checked += token != top
    assert checked > 0  # some sampled tokens were not the most likely one, so the gaps were not all 0


@pytest.mark.slow  # about 40 s: a server of a real-tokenizer model folder (151,936 ids)
def test_the_sampling_fields_on_a_real_tokenizer_model(qwen_folder: Any, tmp_path_factory: Any) -> None:
    """The 0.38 fields on a model with Qwen2's vocabulary (bfloat16, no BOS, two EOS ids): the sampled token's
    top-k row holds its own logprob, the alternative draws re-score to their logprobs, a chat prompt's last
    tokens score as compute_logprobs scores them."""
    import secrets

    from whileai.service.launch import start_server

    token = "tml-" + secrets.token_urlsafe(24)
    with start_server(tmp_path_factory.mktemp("real-fields") / "data", token=token,
                      args=["--model", str(qwen_folder)]) as server:
        sdk = tinker.ServiceClient(base_url=server.url, api_key=server.token)
        training = sdk.create_lora_training_client(base_model=str(qwen_folder), rank=4).result()
        tokenizer = training.get_tokenizer()
        text = tokenizer.apply_chat_template([{"role": "user", "content": "Say hi"}], add_generation_prompt=True,
                                             tokenize=False)
        prompt = tokenizer.encode(text, add_special_tokens=False)
        sampler = training.save_weights_and_get_sampling_client().result()
        model_input = types.ModelInput.from_ints(list(prompt))
        out = sampler.sample(model_input, 2, types.SamplingParams(max_tokens=4, seed=3, temperature=0.8),
                             topk_sample_logprobs=3, prompt_alt_tokens_k=2).result(timeout=120)
        for seq in out.sequences:
            for token_id, logprob, row in zip(seq.tokens, seq.logprobs, seq.topk_logprobs):
                if token_id in dict(row):
                    assert dict(row)[token_id] == pytest.approx(logprob, abs=2e-2)  # bfloat16 model
                assert row[0][1] >= logprob - 2e-2
        alt = out.prompt_alt_tokens.tokens.to_numpy()
        assert alt.shape == (len(prompt) - 1, 2) and ((0 <= alt) & (alt < 151936)).all()
        full = sampler.compute_logprobs(model_input).result(timeout=120)
        last = sampler.compute_logprobs(model_input, prompt_logprobs_last_n=2).result(timeout=120)
        assert last[:-2] == [None] * (len(prompt) - 2) and last[-2:] == pytest.approx(full[-2:], abs=1e-5)
        sdk.holder.close()
