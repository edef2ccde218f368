"""Weight sync without a model server process: the adapter checks of ``record.weights`` on an in-process model,
the request fields ``wai policy`` takes from vLLM, and ``ServerSampler`` against real sockets that behave like
a server that is down, one that never answers, and a vLLM whose answers lack what training needs."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from whileai.engine import TrainingEngine
from whileai.loop.sources.server_sampler import SamplerError, ServerSampler, write_weights
from whileai.record import weights
from whileai.record.policy import Policy, load, use_adapter
from whileai.record.requests import RequestError, parse_ask
from whileai.service.launch import free_port

SEQUENCE = [1, 72, 101, 108, 108, 111, 2]


def moved(engine, scale=0.05, seed=0):
    """The engine with every trainable weight moved by seeded noise (an adapter that is not the identity)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in engine.named_params.values():
            p.add_(torch.randn(p.shape, generator=generator) * scale)
    return engine


def scores(engine):
    return engine.compute_logprobs(SEQUENCE)["logprobs"][1:]


# ----------------------------------------------------------------------------- the server's adapter checks
def test_an_adapter_loads_on_the_shared_base_and_unloading_the_last_restores_the_base(tmp_path):
    served = load("builtin:tiny")
    base = scores(served.engine)
    trainer = moved(TrainingEngine("builtin:tiny", lora_rank=4))
    version = weights.load_adapter(served, {"lora_name": "a", "lora_path": write_weights(trainer, tmp_path / "a")})
    assert version.startswith("a@sha256:") and served.adapters == {"a": version}
    with use_adapter(served, "a"):
        assert max(abs(x - y) for x, y in zip(scores(served.engine), scores(trainer))) < 1e-6
    with use_adapter(served, None):
        assert scores(served.engine) == base
    weights.unload_adapter(served, {"lora_name": "a"})
    assert served.peft is None and scores(served.engine) == base


def test_loading_a_taken_name_needs_load_inplace_and_then_replaces_the_weights(tmp_path):
    served = load("builtin:tiny")
    first, second = (moved(TrainingEngine("builtin:tiny", lora_rank=4), seed=s) for s in (1, 2))
    weights.load_adapter(served, {"lora_name": "a", "lora_path": write_weights(first, tmp_path / "1")})
    with pytest.raises(RequestError, match="already been loaded.*load_inplace"):
        weights.load_adapter(served, {"lora_name": "a", "lora_path": str(tmp_path / "1")})
    old = served.adapters["a"]
    new = weights.load_adapter(served, {"lora_name": "a", "lora_path": write_weights(second, tmp_path / "2"),
                                        "load_inplace": True})
    assert new != old
    with use_adapter(served, "a"):
        assert max(abs(x - y) for x, y in zip(scores(served.engine), scores(second))) < 1e-6


@pytest.mark.parametrize("case", ["missing", "not peft", "other seed", "other shapes", "no name", "base name"])
def test_a_bad_adapter_is_refused_with_a_400_before_the_model_is_touched(tmp_path, case):
    served = load("builtin:tiny")
    path = str(tmp_path / "adapter")
    if case == "not peft":
        write_weights(TrainingEngine("builtin:tiny"), path)  # a whole model folder, not an adapter
    elif case == "other seed":
        write_weights(TrainingEngine("builtin:tiny", lora_rank=2, seed=1), path)
    elif case == "other shapes":
        write_weights(TrainingEngine("builtin:mini", lora_rank=2), path)
        (tmp_path / "adapter" / weights.BASE_FILE).unlink()  # so the shapes are what refuses it
    elif case in ("no name", "base name"):
        write_weights(TrainingEngine("builtin:tiny", lora_rank=2), path)
    body = {"lora_name": {"no name": "", "base name": "builtin:tiny"}.get(case, "a"), "lora_path": path}
    expected = {"missing": "no such folder", "not peft": "not a PEFT adapter folder",
                "other seed": "trained on base 'builtin:tiny@seed1'", "other shapes": "base mismatch.*has shape",
                "no name": "'lora_name' is ''", "base name": "the base model's name"}[case]
    with pytest.raises(RequestError, match=expected) as caught:
        weights.load_adapter(served, body)
    assert caught.value.status == 400 and served.peft is None and served.adapters == {}


def test_unloading_an_unknown_adapter_is_a_404_listing_the_loaded_ones():
    with pytest.raises(RequestError, match=r"'b' cannot be found; loaded: \[\]") as caught:
        weights.unload_adapter(load("builtin:tiny"), {"lora_name": "b"})
    assert caught.value.status == 404


def test_a_full_reload_of_another_architecture_is_refused_naming_the_fields(tmp_path):
    folder = write_weights(TrainingEngine("builtin:mini"), tmp_path / "mini")
    with pytest.raises(RequestError, match="another architecture.*hidden_size: served 64, new 128"):
        weights.read_full(load("builtin:tiny"), {"model_path": folder})
    with pytest.raises(RequestError, match="could not be loaded"):
        weights.read_full(load("builtin:tiny"), {"model_path": str(tmp_path / "nothing")})


def test_misfit_names_the_layer_and_both_sizes():
    model = load("builtin:tiny").engine.model
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert weights._misfit(model, key, (4, 64)) is None  # lora_A is (rank, in_features): 64 in
    assert "has 64 where the adapter has 128" in weights._misfit(model, key, (4, 128))
    assert "does not have" in weights._misfit(model, key.replace("layers.0", "layers.9"), (4, 64))


# ----------------------------------------------------------------------------- the request fields vLLM sends
def test_the_vllm_fields_a_sampler_sends_are_taken():
    ask = parse_ask({"model": "pol", "prompt": [1, 2], "stop_token_ids": [2, 9], "return_tokens_as_token_ids": True,
                     "top_k": -1}, chat=False, served="builtin:tiny", adapters=("pol",))
    assert (ask.adapter, ask.stop_token_ids, ask.tokens_as_ids, ask.top_k) == ("pol", (2, 9), True, 0)
    assert parse_ask({"prompt": [1]}, chat=False, served="builtin:tiny", adapters=("pol",)).adapter is None
    with pytest.raises(RequestError, match=r"and the LoRA adapters \['pol'\]") as caught:
        parse_ask({"model": "gone", "prompt": [1]}, chat=False, served="builtin:tiny", adapters=("pol",))
    assert caught.value.status == 404
    with pytest.raises(RequestError, match="'stop_token_ids' is"):
        parse_ask({"prompt": [1], "stop_token_ids": [-1]}, chat=False, served="builtin:tiny")


# ----------------------------------------------------------------------------- the client's errors
class Stub:
    """A real HTTP server on loopback answering each route with a canned (status, body); records the requests."""

    def __init__(self, replies):
        self.replies, self.calls = replies, []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                stub.calls.append((self.path, body))
                status, reply = stub.replies[self.path](body)
                raw = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def vllm_choice(**fields):
    return {"id": "cmpl-1", "object": "text_completion", "model": "pol", "system_fingerprint": None,
            "choices": [{"index": 0, "text": "hi", "finish_reason": "length", **fields}]}


def test_a_server_that_is_down_is_named_with_the_fix():
    sampler = ServerSampler(f"http://127.0.0.1:{free_port()}", "builtin:tiny")
    with pytest.raises(SamplerError, match="no inference server answers at .*Fix: start it"):
        sampler.sample([[1, 2]])


def test_a_server_that_never_answers_times_out_with_the_limit_named():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        sampler = ServerSampler(f"http://127.0.0.1:{listener.getsockname()[1]}", "m", timeout=0.3)
        with pytest.raises(SamplerError, match="did not answer within 0.3 s"):
            sampler.sample([[1, 2]])
    finally:
        listener.close()


def test_vllm_shaped_answers_give_token_ids_from_either_field_and_the_model_as_the_version():
    ids_as_strings = vllm_choice(logprobs={"tokens": ["token_id:7", "token_id:9"], "token_logprobs": [-0.5, -1.25]})
    stub = Stub({"/v1/completions": lambda body: (200, ids_as_strings)})
    try:
        (sample,) = ServerSampler(stub.url, "pol").sample([[1, 2]], max_tokens=2, top_k=0, stop_token_ids=[2])
        assert (sample.tokens, sample.logprobs, sample.weights_version) == ([7, 9], [-0.5, -1.25], "pol")
        sent = stub.calls[0][1]
        assert (sent["prompt"], sent["top_k"], sent["stop_token_ids"], sent["logprobs"]) == ([1, 2], -1, [2], 0)
        assert sent["return_token_ids"] and sent["return_tokens_as_token_ids"]
        stub.replies["/v1/completions"] = lambda body: (200, vllm_choice(
            token_ids=[5], prompt_token_ids=[1, 2], logprobs={"tokens": ["x"], "token_logprobs": [-2.0]}))
        assert ServerSampler(stub.url, "pol").sample([[1, 2]])[0].tokens == [5]
    finally:
        stub.close()


def test_an_answer_without_token_ids_names_the_vllm_flag():
    stub = Stub({"/v1/completions": lambda body: (200, vllm_choice(logprobs={"tokens": ["h", "i"],
                                                                             "token_logprobs": [-1.0, -1.0]}))})
    try:
        with pytest.raises(SamplerError, match="--return-tokens-as-token-ids"):
            ServerSampler(stub.url, "pol").sample([[1, 2]])
    finally:
        stub.close()


def test_a_vllm_without_runtime_lora_says_which_flags_it_needs_and_a_taken_name_is_unloaded_first(tmp_path):
    stub = Stub({"/v1/load_lora_adapter": lambda body: (404, {"detail": "Not Found"})})
    try:
        with pytest.raises(SamplerError, match="--enable-lora.*VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
            ServerSampler(stub.url, "base").push_lora(tmp_path, "pol")
        loaded = set()

        def load_lora(body):  # vLLM before load_inplace: a taken name is a 400
            if body["lora_name"] in loaded:
                return 400, {"object": "error", "message": f"The lora adapter '{body['lora_name']}' has already "
                                                           "been loaded.", "type": "InvalidUserInput", "code": 400}
            loaded.add(body["lora_name"])
            return 200, "Success: LoRA adapter added successfully."

        stub.replies = {"/v1/load_lora_adapter": load_lora,
                        "/v1/unload_lora_adapter": lambda body: (loaded.discard(body["lora_name"]), (200, "ok"))[1]}
        sampler = ServerSampler(stub.url, "base")
        assert sampler.push_lora(tmp_path, "pol") == "pol" and sampler.model == "pol"
        assert sampler.push_lora(tmp_path, "pol") == "pol"
        assert [route for route, _ in stub.calls[1:]] == ["/v1/load_lora_adapter"] * 2 + [
            "/v1/unload_lora_adapter", "/v1/load_lora_adapter"]
        stub.replies["/update_weights_from_disk"] = lambda body: (404, {"detail": "Not Found"})
        with pytest.raises(SamplerError, match="vLLM's OpenAI server has no route that reloads full weights"):
            sampler.push_full(tmp_path, weight_version="step1")
    finally:
        stub.close()


def test_an_adapter_unloaded_after_its_request_was_read_is_a_404_not_a_crash(tmp_path):
    served = load("builtin:tiny")
    weights.load_adapter(served, {"lora_name": "a", "lora_path": write_weights(
        moved(TrainingEngine("builtin:tiny", lora_rank=2)), tmp_path / "a")})
    ask = parse_ask({"model": "a", "prompt": [1, 2]}, chat=False, served="builtin:tiny", adapters=("a",))
    weights.unload_adapter(served, {"lora_name": "a"})
    with pytest.raises(RequestError, match="the adapter was unloaded") as caught:
        Policy(served).sample(ask)
    assert caught.value.status == 404
