"""The Tinker wire conversions against the SDK's own encoders and decoders (no server): what the SDK writes we
read back exactly, and what we write the SDK reads back exactly."""

from __future__ import annotations

from typing import get_args

import pytest
import torch

pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response  # noqa: E402

from whileai.errors import ConfigError  # noqa: E402
from whileai.service import tinker_wire  # noqa: E402
from whileai.trainers.tinker_map import prompt_seed, tinker_losses  # noqa: E402


def encoded(data: list, loss_fn: types.LossFnType = "cross_entropy", config: dict | None = None) -> bytes:
    request = types.ForwardBackwardRequest(forward_backward_input=types.ForwardBackwardInput(
        data=data, loss_fn=loss_fn, loss_fn_config=config), model_id="run-x", seq_id=3)
    return forward_backward_request_to_proto(request).SerializeToString()  # type: ignore[no-any-return]


def test_a_forward_backward_request_reads_back_dense_and_sparse_k_targets():
    """(4, 3) top-k targets, and weights with one nonzero entry, which the SDK sends as sparse CSR (5 row
    pointers + 1 column + 1 value = 7 numbers < 12 dense). Both must come back as the dense matrices."""
    targets = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]])
    weights = torch.zeros(4, 3)
    weights[2, 1] = 0.75
    sparse = types.TensorData.from_torch_sparse(weights)
    assert sparse.sparse_crow_indices is not None  # the SDK did choose CSR here
    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3, 4]),
                        loss_fn_inputs={"target_tokens": types.TensorData.from_torch(targets), "weights": sparse})
    msg, fields = tinker_wire.forward_backward_body(encoded([datum], "cross_entropy", {"beta": 0.5}))
    assert (msg.model_id, msg.seq_id, fields["loss_function"]) == ("run-x", 3, "cross_entropy")
    assert fields["loss_config"] == {"beta": 0.5}
    assert fields["data"][0]["model_input"] == [1, 2, 3, 4]
    assert fields["data"][0]["loss_fn_inputs"]["target_tokens"] == targets.tolist()
    assert fields["data"][0]["loss_fn_inputs"]["weights"] == weights.tolist()


def test_a_body_that_is_not_the_protobuf_is_refused_with_the_route():
    with pytest.raises(ConfigError, match="/api/v1/forward_backward: the body is not a ForwardBackwardRequest"):
        tinker_wire.forward_backward_body(b"\xff\xff not a protobuf")


def test_our_forward_backward_output_is_what_the_sdk_decodes():
    result = {"loss_fn_outputs": [{"logprobs": [0.0, -1.5, -0.25]}, {"logprobs": [-2.0]}],
              "metrics": {"loss:sum": 3.75, "num_tokens:sum": 3.0}}
    out = deserialize_forward_backward_output(tinker_wire.forward_backward_output(result))
    assert out.metrics == {"loss:sum": 3.75, "num_tokens:sum": 3.0}
    assert [o["logprobs"].tolist() for o in out.loss_fn_outputs] == [[0.0, -1.5, -0.25], [-2.0]]


def test_our_sample_output_is_what_the_sdk_decodes_with_none_at_the_first_prompt_position():
    result = {"sequences": [[{"tokens": [7, 2], "logprobs": [-0.5, -1.25], "stop_reason": "stop"},
                             {"tokens": [9, 9], "logprobs": [-3.0, -3.0], "stop_reason": "length"}]],
              "prompt_logprobs": [None, -2.5, -0.125],
              "topk_prompt_logprobs": [None, [(4, -0.5), (5, -1.0)], [(6, -0.125), (4, -3.0)]]}
    out = deserialize_sample_response(tinker_wire.sample_output(result))
    assert [(list(s.tokens), list(s.logprobs), s.stop_reason) for s in out.sequences] == [
        ([7, 2], [-0.5, -1.25], "stop"), ([9, 9], [-3.0, -3.0], "length")]
    assert out.prompt_logprobs == [None, -2.5, -0.125]
    assert out.topk_prompt_logprobs == [None, [(4, -0.5), (5, -1.0)], [(6, -0.125), (4, -3.0)]]


def test_sample_options_we_do_not_serve_are_named():
    request = types.SampleRequest(prompt=types.ModelInput.from_ints([1, 2]), sampling_params=types.SamplingParams(
        max_tokens=2), num_samples=1, record_stability_info=True)
    with pytest.raises(ConfigError, match="record_stability_info .StableReinforce's stability records. is not "
                                          "available on wai serve"):
        tinker_wire.sample_body(request)


def test_sparse_target_prompt_logprobs_come_back_in_the_requests_layout():
    """Sparse CSR targets: the cells asked are scored, the others read -1 (nothing asked); the answer keeps the
    request's CSR indices, so the SDK decodes it to the same sparse shape."""
    targets = {"data": [5, 7, 9], "dtype": "int64", "shape": [3, 2], "sparse_crow_indices": [0, 1, 1, 3],
               "sparse_col_indices": [1, 0, 1]}
    request = types.SampleRequest(prompt=types.ModelInput.from_ints([1, 2, 3, 4]), num_samples=1,
                                  sampling_params=types.SamplingParams(max_tokens=1), target_prompt_logprobs=targets)
    fields, extra = tinker_wire.sample_body(request, vocab_size=10)
    assert fields["target_prompt_logprobs"] == [[-1, 5], [-1, -1], [7, 9]]
    scored = [[None, -0.5], [None, None], [-1.5, -2.5]]
    result = {"sequences": [[{"tokens": [3], "logprobs": [-1.0], "stop_reason": "length"}]],
              "target_prompt_logprobs": scored}
    out = deserialize_sample_response(tinker_wire.sample_output(result, None, extra["sparse"]))
    assert out.target_prompt_logprobs.sparse_crow_indices == [0, 1, 1, 3]
    assert out.target_prompt_logprobs.sparse_col_indices == [1, 0, 1]
    assert out.target_prompt_logprobs.data == [-0.5, -1.5, -2.5]  # the cells asked, in CSR order
    assert out.target_prompt_logprobs.tolist() == [[0.0, -0.5], [0.0, 0.0], [-1.5, -2.5]]  # 0.0: placeholders
    bad = types.SampleRequest(prompt=types.ModelInput.from_ints([1, 2, 3, 4]), num_samples=1,
                              sampling_params=types.SamplingParams(max_tokens=1),
                              target_prompt_logprobs={"data": [1, 2], "dtype": "int64", "shape": [2, 1]})
    with pytest.raises(ConfigError, match=r"shape \[2, 1\]; it must be \[len\(prompt\) - 1, K\] = \[3, K\]"):
        tinker_wire.sample_body(bad, vocab_size=10)


def test_a_plain_tinker_server_advertises_the_sdk_losses_with_scalar_clip_keys():
    table = tinker_losses()
    assert list(table) == ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo"]
    assert set(get_args(types.LossFnType)) - set(table) == {"stable_reinforce", "custom"}  # inputs unknown here
    assert set(table["ppo"]["config"]) == {"clip_low_threshold", "clip_high_threshold"}
    assert table["dro"]["config"]["beta"]["default"] is None  # the server's own default, none of ours
    assert all("threshold" not in i for entry in table.values() for i in entry["optional_inputs"])


def test_each_prompt_of_a_batch_gets_its_own_seed_and_the_first_keeps_the_batch_seed():
    params = {"max_tokens": 4, "seed": 11}
    seeds = [prompt_seed(params, i)["seed"] for i in range(4)]
    assert seeds[0] == 11 and len(set(seeds)) == 4
    assert seeds == [prompt_seed(params, i)["seed"] for i in range(4)]  # a function of (seed, index)
    assert prompt_seed({"max_tokens": 4, "seed": None}, 2)["seed"] is None


def test_an_empty_stop_list_keeps_the_servers_eos_stop_and_ignore_eos_drops_it():
    """Tinker's stop=[] means no stop at all, EOS included: the engine's empty default must not be sent as it
    (a chained `wai serve --tinker-url` ran every reply to its cap), while ignore_eos must."""
    assert "stop" not in prompt_seed({"max_tokens": 4, "stop": []}, 0)
    assert "stop" not in prompt_seed({"max_tokens": 4, "stop": None}, 0)
    assert prompt_seed({"max_tokens": 4, "stop": [], "ignore_eos": True}, 0)["stop"] == []
    assert prompt_seed({"max_tokens": 4, "stop": [7]}, 0)["stop"] == [7]


def test_the_tinker_provider_refuses_sample_scores_it_cannot_pass_on(tmp_path):
    from whileai.service import schemas
    from whileai.service.served import TrainerRun
    from whileai.trainers.tinker import TinkerTrainer

    run = TrainerRun(TinkerTrainer(None, "builtin:tiny", url="http://up"), tmp_path, False)  # refused before the SDK
    body = schemas.Sample(seq_id=0, prompt_tokens=[1, 2], sampling_params={"max_tokens": 1}, topk_sample_logprobs=2,
                          prompt_alt_tokens_k=1)
    with pytest.raises(ConfigError, match="topk_sample_logprobs, prompt_alt_tokens_k cannot be passed on by the "
                                          "Tinker API at http://up"):
        run.op_sample(body)
