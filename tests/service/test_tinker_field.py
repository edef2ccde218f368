"""The Tinker front in the field (issue 28): a refused request never wedges a run, the service's limits hold on
every Tinker route, a bad checkpoint path makes no run, and the model's context is a clear rule.

Driven by the official SDK (and httpx with the SDK's own request types where the SDK checks on the client)
against a `wai serve` subprocess started with small limits and a short --order-timeout, so a request that had
taken a sequence number and never ran would show as an OrderTimeout within the test.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

tinker = pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
from tinker import types  # noqa: E402

from whileai.service.launch import LocalServer, start_server  # noqa: E402

PROMPT = [1, 57, 46, 54, 64]
ANSWER = [60, 2]
CONTEXT = 256  # builtin:tiny's max_position_embeddings
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    args = ["--max-samples", "8", "--max-datums", "4", "--max-body-mb", "1", "--order-timeout", "3"]
    with start_server(tmp_path_factory.mktemp("limited") / "data", token="tml-" + secrets.token_urlsafe(24),
                      args=args) as server:
        yield server


@pytest.fixture(scope="module")
def sdk(limited: LocalServer) -> Iterator[Any]:
    client = tinker.ServiceClient(base_url=limited.url, api_key=limited.token)
    yield client
    client.holder.close()


def sft_datum() -> Any:
    tokens = PROMPT + ANSWER
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [0.0] * 4 + [1.0, 1.0]})


def test_a_refused_request_leaves_the_run_exactly_as_it_was(sdk: Any) -> None:
    """num_samples=0, a state name that is not a file name, 9 samples over --max-samples 8 and 5 datums over
    --max-datums 4 are refused at submit; the run's next training and sampling calls then run at once (before the fix each waited for the
    number the refused request had taken and failed with OrderTimeout)."""
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(PROMPT)
    with pytest.raises(tinker.BadRequestError, match="num_samples.*greater than or equal to 1"):
        sampler.sample(prompt, 0, types.SamplingParams(max_tokens=2)).result(timeout=30)
    with pytest.raises(tinker.BadRequestError, match="save_weights.*name.*String should match pattern"):
        training.save_state("bad name").result(timeout=30)
    with pytest.raises(tinker.APIStatusError, match=r"9 samples = 9 sequences; the limit is 8 \(--max-samples\)"):
        sampler.sample(prompt, 9, types.SamplingParams(max_tokens=2)).result(timeout=30)
    with pytest.raises(tinker.APIStatusError, match=r"5 datums in one request; the limit is 4 \(--max-datums\)"):
        training.forward_backward([sft_datum()] * 5, "cross_entropy").result(timeout=30)
    started = time.monotonic()
    loss = training.forward_backward([sft_datum()], "cross_entropy").result(timeout=30).metrics["loss:sum"]
    assert training.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=30).metrics["step"] == 1.0
    assert len(sampler.sample(prompt, 8, types.SamplingParams(max_tokens=2)).result(timeout=30).sequences) == 8
    assert time.monotonic() - started < 3.0 and loss > 0  # nothing waited for a number that never came


def test_every_tinker_route_reads_its_body_within_the_limit(limited: LocalServer) -> None:
    """A 1.5 MB body against --max-body-mb 1 is a 413 naming the flag on the JSON routes, the protobuf route and
    the telemetry route; telemetry also needs the api_key now."""
    big = b"x" * (3 * 2**19)
    headers = {"X-API-Key": limited.token, "Content-Type": "application/json"}
    for route in ("asample", "create_session", "telemetry", "forward_backward", "retrieve_futures"):
        answer = httpx.post(f"{limited.url}/api/v1/{route}", content=big, headers=headers, timeout=30)
        assert answer.status_code == 413, (route, answer.text)
        assert "--max-body-mb" in answer.json()["error"] and f"/api/v1/{route}" in answer.json()["error"]
    assert httpx.post(f"{limited.url}/api/v1/telemetry", json={}, timeout=30).status_code == 401


def test_a_checkpoint_path_ending_in_dotdot_is_a_400_and_makes_no_run(sdk: Any, limited: LocalServer) -> None:
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4).result()
    saved = training.save_state("kept").result(timeout=30).path
    rest = tinker.RestClient(base_url=limited.url, api_key=limited.token)
    before = rest.list_training_runs(limit=1000).result(timeout=30).cursor.total_count
    for path in (f"tinker://{training.model_id}/weights/..", f"tinker://{training.model_id}/weights/.hidden"):
        with pytest.raises(tinker.BadRequestError, match="no saved state at .*the name letters, digits"):
            sdk.create_training_client_from_state(path).result(timeout=60)
    with pytest.raises(tinker.BadRequestError, match="is not a checkpoint path"):
        rest.get_weights_info_by_tinker_path(f"tinker://{training.model_id}/weights/..").result(timeout=30)
    assert rest.list_training_runs(limit=1000).result(timeout=30).cursor.total_count == before
    assert Path(saved.rsplit("/", 1)[1]).name == "kept"


def test_compute_logprobs_takes_a_sequence_the_length_of_the_context(sdk: Any) -> None:
    """256 tokens on a 256-token model: compute_logprobs answers (its sample is empty, stop_reason 'length') with
    the log-probabilities forward gives on the same tokens."""
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4).result()
    tokens = [1 + (7 * i) % 200 for i in range(CONTEXT)]
    sampler = training.save_weights_and_get_sampling_client().result()
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result(timeout=60)
    assert len(scored) == CONTEXT and scored[0] is None
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (CONTEXT - 1)})
    forward = training.forward([datum], "cross_entropy").result(timeout=60).loss_fn_outputs[0]["logprobs"].tolist()
    assert scored[1:] == pytest.approx(forward, abs=1e-4)
    answer = sampler.sample(types.ModelInput.from_ints(tokens), 1, types.SamplingParams(max_tokens=1),
                            include_prompt_logprobs=True).result(timeout=60)
    assert [(list(s.tokens), s.stop_reason) for s in answer.sequences] == [([], "length")]


def test_a_prompt_and_max_tokens_beyond_the_context_is_a_400_naming_both(sdk: Any) -> None:
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints([1] + [60] * 249)
    with pytest.raises(tinker.BadRequestError, match="the prompt has 250 tokens and max_tokens is 10: 260 > the "
                                                     "model's context of 256 tokens"):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=10)).result(timeout=60)
    fits = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=6, stop=[])).result(timeout=60)
    assert len(fits.sequences[0].tokens) == 6
    until = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=None, stop=[])).result(timeout=60)
    assert (len(until.sequences[0].tokens), until.sequences[0].stop_reason) == (6, "length")


def test_a_full_fine_tune_reports_lora_rank_none(limited: LocalServer) -> None:
    """The SDK types lora_rank as int | None (None: not LoRA); a rank-0 run reported 0."""
    http = httpx.Client(base_url=limited.url, headers={"X-API-Key": limited.token}, timeout=60)
    session = http.post("/api/v1/create_session", json=types.CreateSessionRequest(
        tags=[], user_metadata=None, sdk_version="0.38.0").model_dump(mode="json")).json()["session_id"]
    create = types.CreateModelRequest(session_id=session, model_seq_id=0, base_model="builtin:tiny",
                                      lora_config=types.LoraConfig(rank=0))
    model_id = http.post("/api/v1/create_model", json=create.model_dump(mode="json")).json()["model_id"]
    info = types.GetInfoResponse.model_validate(http.post("/api/v1/get_info", json={"model_id": model_id}).json())
    assert (info.is_lora, info.lora_rank) == (False, None)
    rest = tinker.RestClient(base_url=limited.url, api_key=limited.token)
    assert rest.get_training_run(model_id).result(timeout=30).lora_rank is None


def test_bad_input_on_tinker_routes_is_a_4xx_naming_the_field_never_a_500(limited: LocalServer) -> None:
    """Cases a fuzzer found answering 500 (rank 1e9 tried to allocate 256 GB; a target tensor of the wrong size or
    dtype; a request id past SQLite's integers), and their neighbours."""
    http = httpx.Client(base_url=limited.url, headers={"X-API-Key": limited.token}, timeout=60)
    session = http.post("/api/v1/create_session", json=types.CreateSessionRequest(
        tags=[], user_metadata=None, sdk_version="0.38.0").model_dump(mode="json")).json()["session_id"]

    def model(seq: int, **lora: Any) -> dict[str, Any]:
        return {"session_id": session, "model_seq_id": seq, "base_model": "builtin:tiny", "lora_config": lora}

    def sample(**fields: Any) -> dict[str, Any]:
        return {"prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]}, "base_model": "builtin:tiny",
                "sampling_params": {"max_tokens": 1}, **fields}

    run = http.post("/api/v1/create_model", json=model(0, rank=4)).json()["model_id"]
    cases = [
        ("/api/v1/create_model", model(1, rank=-3), "lora_rank=-3: Input should be greater than or equal to 0"),
        ("/api/v1/create_model", model(2, rank=10**9), "lora_rank=1000000000: Input should be less than or equal"),
        ("/api/v1/create_model", model(3, rank=4, seed=1e30), "lora_config.seed"),
        ("/api/v1/asample", sample(target_prompt_logprobs={"data": [1.5, 2.0], "dtype": "float32", "shape": [2, 1]}),
         "target_prompt_logprobs has dtype float32; it holds token ids: int64"),
        ("/api/v1/asample", sample(target_prompt_logprobs={"data": [1, 2, 3], "dtype": "int64", "shape": [2, 1]}),
         "target_prompt_logprobs has 3 values for the shape [2, 1]"),
        ("/api/v1/asample", sample(target_prompt_logprobs={"data": [1], "dtype": "int64", "shape": [2, 1],
                                                           "sparse_crow_indices": [0, 5, 2],
                                                           "sparse_col_indices": [0]}),
         "the sparse CSR indices do not describe a [2, 1] tensor"),
        ("/api/v1/asample", sample(prompt_alt_tokens_k=10**6), "prompt_alt_tokens_k: Input should be less than"),
        ("/api/v1/retrieve_future", {"request_id": f"{run}.999999999999999999999"}, "is unknown here"),
        (f"/api/v1/sessions/{session}/finish", {"reason": "success"}, "reason: Input should be an object"),
    ]
    for route, body, message in cases:
        answer = http.post(route, json=body)
        assert 400 <= answer.status_code < 500 and message in answer.json()["error"], (route, answer.text)
    for query, message in [("training_runs?limit=abc", "limit='abc' is not an integer"),
                           ("sessions?offset=-3", "offset >= 0"), ("checkpoints?limit=10000", "limit must be in"),
                           (f"external_files/{run}/x/y?expires=soon&signature=0", "expires='soon' is not an integer")]:
        answer = http.get(f"/api/v1/{query}")
        assert 400 <= answer.status_code < 500 and message in answer.json()["error"], (query, answer.text)
    assert http.get("/healthz").status_code == 200
