"""`wai serve` driven by the official Tinker SDK (`pip install whileai[tinker]`), server in its own process.

Every number checked here is one the engine or a hand calculation also gives: losses equal the engine's on the
same datums, RL losses equal the formula on the returned log-probabilities, sampled log-probabilities equal
compute_logprobs on the same tokens, and a reloaded state repeats the step it was saved before.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

tinker = pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
from tinker import types  # noqa: E402

from whileai.service.launch import LocalServer  # noqa: E402

PROMPT = [1, 57, 46, 54, 64]          # bos + "6+3=" in the built-in byte tokenizer (id = 3 + byte)
ANSWER = [60, 2]                      # "9" + eos
pytestmark = pytest.mark.filterwarnings("ignore:DEPRECATED:FutureWarning")  # the SDK's load_state notice
ADAM = types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)


def sft_datum(weights: list[float] | None = None) -> Any:
    tokens = PROMPT + ANSWER
    n = len(tokens) - 1
    weights = weights if weights is not None else [0.0] * (len(PROMPT) - 1) + [1.0] * len(ANSWER)
    assert len(weights) == n
    inputs: dict[str, Any] = {"target_tokens": tokens[1:], "weights": weights}  # the SDK coerces lists
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def rl_datum(sampler_logprobs: list[float], advantages: list[float]) -> Any:
    tokens = PROMPT + ANSWER
    inputs: dict[str, Any] = {"target_tokens": tokens[1:], "logprobs": sampler_logprobs, "advantages": advantages}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def training_client(sdk: Any) -> Any:
    return sdk.create_lora_training_client(base_model="builtin:tiny", rank=8).result()


@pytest.mark.slow  # about 9 s: an in-process engine beside the server
def test_supervised_steps_lower_the_loss_and_equal_the_engine_in_process(sdk: Any) -> None:
    from whileai.engine import AdamParams, TrainingEngine

    remote = training_client(sdk)
    local = TrainingEngine("builtin:tiny", lora_rank=8, seed=0)
    datum = sft_datum()
    plain = {"model_input": PROMPT + ANSWER[:-1],
             "loss_fn_inputs": {"target_tokens": (PROMPT + ANSWER)[1:],
                                "weights": datum.loss_fn_inputs["weights"].tolist()}}
    losses = []
    for _ in range(4):
        out = remote.forward_backward([datum], "cross_entropy").result()
        mine = local.forward_backward([plain], "cross_entropy")
        step = remote.optim_step(ADAM).result()
        mine_step = local.optim_step(AdamParams(learning_rate=1e-2, eps=1e-8))
        losses.append(out.metrics["loss:sum"])
        assert out.metrics["loss:sum"] == pytest.approx(mine.metrics["loss:sum"], rel=1e-6)
        np.testing.assert_allclose(out.loss_fn_outputs[0]["logprobs"].tolist(),
                                   mine.loss_fn_outputs[0]["logprobs"], rtol=1e-5, atol=1e-6)
        assert step.metrics["grad_norm"] == pytest.approx(mine_step.grad_norm, rel=1e-5)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    # the loss is the summed -logprob of the two answer tokens (weights 1 there, 0 on the prompt)
    answer_lp = out.loss_fn_outputs[0]["logprobs"].tolist()[-2:]
    assert out.metrics["loss:sum"] == pytest.approx(-sum(answer_lp), rel=1e-5)
    info = remote.get_info()
    assert (info.model_data.model_name, info.lora_rank, info.is_lora) == ("builtin:tiny", 8, True)
    assert remote.get_tokenizer().encode("6+3=") == PROMPT  # the tokenizer adds BOS, as training does


def test_importance_sampling_ppo_and_cispo_losses_follow_their_formulas(sdk: Any) -> None:
    """Sampler log-probs q = p - log 1.5 make every ratio r = p/q = 1.5 exactly. With advantages A = (0, 0, 0, 0,
    2, -1): importance_sampling = -sum r A = -1.5 * (2 - 1) = -1.5; ppo clips r to [0.8, 1.2] and takes the
    pessimistic term: token A=2 gives min(3.0, 2.4) = 2.4, token A=-1 gives min(-1.5, -1.2) = -1.5, so the loss
    is -(2.4 - 1.5) = -0.9. A forward pass must not move the weights, so both see the same p."""
    remote = training_client(sdk)
    p = remote.forward([sft_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    advantages = [0.0] * (len(PROMPT) - 1) + [2.0, -1.0]
    q = [lp - math.log(1.5) for lp in p]
    importance = remote.forward_backward([rl_datum(q, advantages)], "importance_sampling").result()
    assert importance.metrics["loss:sum"] == pytest.approx(-1.5, rel=1e-4)
    ppo = remote.forward_backward([rl_datum(q, advantages)], "ppo").result()
    assert ppo.metrics["loss:sum"] == pytest.approx(-0.9, rel=1e-4)
    tight = remote.forward_backward([rl_datum(q, advantages)], "ppo",
                                     {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}).result()
    assert tight.metrics["loss:sum"] == pytest.approx(-(2 * 1.1 - 1.5), rel=1e-4)
    # cispo holds the (clipped) ratio constant and multiplies log p: -1.5 * (2 p_a - 1 p_b), default clip 0 / 4
    cispo = remote.forward_backward([rl_datum(q, advantages)], "cispo").result()
    assert cispo.metrics["loss:sum"] == pytest.approx(-1.5 * (2 * p[-2] - p[-1]), rel=1e-4)
    step = remote.optim_step(ADAM).result()
    assert step.metrics["grad_norm"] > 0


def test_a_sampling_client_is_a_snapshot_whose_logprobs_equal_compute_logprobs(sdk: Any) -> None:
    remote = training_client(sdk)
    remote.forward_backward([sft_datum()], "cross_entropy").result()
    remote.optim_step(ADAM).result()
    sampler = remote.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(PROMPT)
    drawn = sampler.sample(prompt, 3, types.SamplingParams(max_tokens=5, seed=1, temperature=1.0)).result()
    assert len(drawn.sequences) == 3
    for seq in drawn.sequences:
        scored = sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT + seq.tokens)).result()
        assert scored[0] is None and len(scored) == len(PROMPT) + len(seq.tokens)
        np.testing.assert_allclose(scored[len(PROMPT):], seq.logprobs, atol=1e-4)
    before = sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT + ANSWER)).result()
    remote.forward_backward([sft_datum()], "cross_entropy").result()
    remote.optim_step(ADAM).result()                      # the training weights move on...
    after = sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT + ANSWER)).result()
    assert after == before                                # ...the sampling client's snapshot does not
    fresh = remote.save_weights_and_get_sampling_client().result()
    moved = fresh.compute_logprobs(types.ModelInput.from_ints(PROMPT + ANSWER)).result()
    assert moved[-1] > before[-1]                         # one more SFT step made eos more likely
    top = fresh.sample(types.ModelInput.from_ints(PROMPT + ANSWER), 1, types.SamplingParams(max_tokens=1),
                       include_prompt_logprobs=True, topk_prompt_logprobs=4).result()
    assert top.topk_prompt_logprobs[0] is None and top.prompt_logprobs[1:] == pytest.approx(moved[1:], abs=1e-5)
    for i, row in enumerate(top.topk_prompt_logprobs[1:], start=1):
        values = [lp for _, lp in row]
        assert len(row) == 4 and values == sorted(values, reverse=True) and values[0] >= moved[i] - 1e-5


def test_save_and_load_state_with_and_without_the_optimizer(sdk: Any) -> None:
    """After loading with the optimizer, the next step repeats the step taken after the save exactly; loading
    weights only restarts Adam from zero moments, so the same step lands elsewhere."""
    remote = training_client(sdk)
    probe = types.ModelInput.from_ints(PROMPT + ANSWER)

    def step_then_score() -> list[float]:
        remote.forward_backward([sft_datum()], "cross_entropy").result()
        remote.optim_step(ADAM).result()
        out = remote.forward([sft_datum()], "cross_entropy").result()
        return out.loss_fn_outputs[0]["logprobs"].tolist()  # type: ignore[no-any-return]

    step_then_score()
    saved = remote.save_state("after-one").result()
    assert saved.path == f"tinker://{remote.model_id}/weights/after-one"
    expected = step_then_score()
    remote.load_state_with_optimizer(saved.path).result()
    assert step_then_score() == pytest.approx(expected, abs=1e-6)
    remote.load_state(saved.path).result()
    fresh_adam = step_then_score()
    assert max(abs(a - b) for a, b in zip(fresh_adam, expected)) > 1e-4
    assert probe.length == len(PROMPT + ANSWER)
    # the SDK's recommended way: a new training client from the saved state, with and without the optimizer
    remote = sdk.create_training_client_from_state_with_optimizer(saved.path).result()
    assert remote.get_info().model_data.model_name == "builtin:tiny"
    assert step_then_score() == pytest.approx(expected, abs=1e-6)
    remote = sdk.create_training_client_from_state(saved.path).result()
    assert step_then_score() == pytest.approx(fresh_adam, abs=1e-6)


def test_requests_we_do_not_serve_fail_with_the_route_and_what_is_missing(sdk: Any, tml_server: LocalServer) -> None:
    remote = training_client(sdk)
    with pytest.raises(tinker.RequestFailedError, match=r"/api/v1/forward_backward.*unknown loss 'ppo2'.*cispo"):
        remote.forward_backward([sft_datum()], "ppo2").result(timeout=60)
    with pytest.raises(tinker.BadRequestError, match="load_weights.*for another run's state use ServiceClient.create_training_client_from_state"):
        remote.load_state("tinker://run-elsewhere/weights/x").result(timeout=60)
    sampler = remote.save_weights_and_get_sampling_client().result()
    with pytest.raises(tinker.BadRequestError, match="prompt_alt_tokens_k=2 draws at the request's temperature; "
                                                     "temperature 0"):
        sampler.sample(types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=1, temperature=0),
                       prompt_alt_tokens_k=2).result(timeout=60)
    saved = remote.save_state("kept").result(timeout=60).path
    with pytest.raises(tinker.BadRequestError, match="publishing a checkpoint is not available on wai serve: .*no hub"):
        tinker.RestClient(base_url=tml_server.url, api_key=tml_server.token).publish_checkpoint_from_tinker_path(
            saved).result(timeout=60)
    remote.forward_backward([sft_datum()], "cross_entropy").result(timeout=60)  # the run still works


def test_a_retried_request_gets_the_recorded_answer_and_a_changed_one_a_conflict(
        sdk: Any, tml_server: LocalServer) -> None:
    """The SDK's retry of one request (same model, same seq_id, same bytes) reaches the run's same sequence
    number, so runs.py answers it from its record without stepping again; other bytes under that seq_id are a
    409 the SDK would raise. Raw HTTP with the SDK's own request types, as the SDK's retry loop sends them."""
    import httpx

    remote = training_client(sdk)
    remote.forward_backward([sft_datum()], "cross_entropy").result()
    http = httpx.Client(base_url=tml_server.url, headers={"X-API-Key": tml_server.token}, timeout=60)
    step = types.OptimStepRequest(optim_params=ADAM, model_id=remote.model_id, seq_id=500)
    first = http.post("/api/v1/optim_step", json=step.model_dump(mode="json")).json()
    again = http.post("/api/v1/optim_step", json=step.model_dump(mode="json")).json()
    assert first["request_id"] == again["request_id"] == f"{remote.model_id}.1"
    answers = [http.post("/api/v1/retrieve_future", json={"request_id": first["request_id"]}).json()
               for _ in range(2)]
    assert answers[0] == answers[1] and answers[0]["metrics"]["step"] == 1.0
    changed = step.model_copy(update={"optim_params": types.AdamParams(learning_rate=0.5)})
    clash = http.post("/api/v1/optim_step", json=changed.model_dump(mode="json")).json()
    assert clash["request_id"].startswith(first["request_id"] + ".refused-")
    refused = http.post("/api/v1/retrieve_future", json={"request_id": clash["request_id"]}).json()
    assert "Conflict" in refused["error"] and "different body" in refused["error"]
    history = httpx.get(f"{tml_server.url}/v1/training/runs/{remote.model_id}/operations",
                        headers={"Authorization": f"Bearer {tml_server.token}"}).json()
    assert [h["op"] for h in history] == ["forward_backward", "optim_step"]  # stepped once, not twice
    assert remote.optim_step(ADAM).result().metrics["step"] == 2.0  # the SDK's own numbering carries on
