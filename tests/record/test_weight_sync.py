"""Weight sync against a real `wai policy` subprocess: train in-process (LoRA, and every weight), push, and the
server's log-probabilities of what it samples equal the trainer's scores of the same tokens within 1e-5; each push
changes the version every answer reports; bad pushes get clear 400s; a killed server gives a clear error."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from whileai.engine import TrainingEngine
from whileai.engine.datums import make_datum
from whileai.loop.sources.server_sampler import SamplerError, ServerSampler, write_weights
from whileai.record.launch import Started

pytestmark = pytest.mark.slow
MODEL = "builtin:tiny"
PROMPTS = [[1, 72, 105, 32], [1, 80, 81, 82, 83]]
EXACT = 1e-5


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Started(["policy", MODEL, "--threads", "1"], tmp_path_factory.mktemp("sync")) as policy:
        yield policy


def trained(engine, steps=3):
    """A few SFT steps at a learning rate that moves the weights well past the tolerance."""
    for _ in range(steps):
        engine.forward_backward([make_datum([1, 72, 105], [32, 119, 111, 114, 108, 100])], "cross_entropy")
        engine.optim_step({"learning_rate": 1e-2})
    return engine


def gap(engine, samples, sampling=None):
    """Largest |server's log-probability - trainer's| over every sampled token."""
    worst = 0.0
    for s in samples:
        mine = engine.compute_logprobs(s.prompt_token_ids + s.tokens, sampling_params=sampling)["logprobs"]
        worst = max([worst] + [abs(a - b) for a, b in zip(mine[len(s.prompt_token_ids):], s.logprobs)])
    return worst


def test_each_lora_push_samples_with_the_trainers_log_probabilities_and_a_new_version(server, tmp_path):
    engine = TrainingEngine(MODEL, lora_rank=4)
    sampler = ServerSampler(server.url, MODEL)
    versions = [sampler.sample(PROMPTS, max_tokens=4, seed=0)[0].weights_version]
    for push in range(2):
        trained(engine)
        versions.append(sampler.sync(engine, tmp_path / f"push{push}", name="policy"))
        plain = sampler.sample(PROMPTS, n=4, max_tokens=12, seed=push)
        tempered = sampler.sample(PROMPTS, n=2, max_tokens=12, temperature=0.7, top_k=20, seed=push)
        assert {s.weights_version for s in plain + tempered} == {versions[-1]}
        print(f"push {push}: version {versions[-1]}, gap {gap(engine, plain):.2e} (temperature 1), "
              f"{gap(engine, tempered, {'temperature': 0.7, 'top_k': 20}):.2e} (0.7, top-k 20)")
        assert gap(engine, plain) < EXACT
        assert gap(engine, tempered, {"temperature": 0.7, "top_k": 20}) < EXACT
        assert sum(len(s.tokens) for s in plain) >= 2 * 4 * 8
    assert versions[0] == f"{MODEL}@seed0" and all(v.startswith("policy@sha256:") for v in versions[1:])
    assert len(set(versions)) == 3
    base = ServerSampler(server.url, MODEL).sample(PROMPTS, n=2, max_tokens=12, seed=0)
    assert {s.weights_version for s in base} == {versions[0]} and gap(engine, base) > 1e-2  # the push mattered
    listed = httpx.get(server.url + "/v1/models", headers=server.headers).json()["data"]
    assert [(m["id"], m.get("parent"), m["weights_version"]) for m in listed] == [
        (MODEL, None, versions[0]), ("policy", MODEL, versions[-1])]
    assert httpx.post(server.url + "/v1/unload_lora_adapter", headers=server.headers, json={"lora_name": "policy"}).status_code == 200
    gone = httpx.post(server.url + "/v1/completions", headers=server.headers, json={"model": "policy", "prompt": [1, 2]})
    assert gone.status_code == 404 and "is not served here" in gone.json()["error"]["message"]


def test_bad_lora_pushes_get_400s_in_the_openai_error_shape(server, tmp_path):
    folder = write_weights(TrainingEngine("builtin:mini", lora_rank=2), tmp_path / "mini")
    for body, expected in [({"lora_name": "x", "lora_path": str(tmp_path / "none")}, "no such folder"),
                           ({"lora_name": "x", "lora_path": str(tmp_path)}, "not a PEFT adapter folder"),
                           ({"lora_name": "x", "lora_path": folder}, "trained on base 'builtin:mini@seed0'"),
                           ({"lora_path": folder}, "'lora_name' is None")]:
        reply = httpx.post(server.url + "/v1/load_lora_adapter", headers=server.headers, json=body)
        assert reply.status_code == 400 and expected in reply.json()["error"]["message"], reply.text
    assert [m["id"] for m in httpx.get(server.url + "/v1/models", headers=server.headers).json()["data"]] == [MODEL]


def test_a_full_fine_tuning_push_reloads_every_weight_and_a_killed_server_is_named(tmp_path):
    with Started(["policy", MODEL, "--threads", "1"], tmp_path) as server:
        engine, sampler = TrainingEngine(MODEL), ServerSampler(server.url, MODEL)
        lora = ServerSampler(server.url, MODEL)
        lora.sync(TrainingEngine(MODEL, lora_rank=2), tmp_path / "adapter", name="old")
        versions = [sampler.sample(PROMPTS, max_tokens=4, seed=0)[0].weights_version]
        for push in range(2):
            trained(engine)
            versions.append(sampler.sync(engine, tmp_path / "full"))  # one folder, rewritten each push
            samples = sampler.sample(PROMPTS, n=4, max_tokens=12, seed=push)
            print(f"full push {push}: version {versions[-1]}, gap {gap(engine, samples):.2e}")
            assert {s.weights_version for s in samples} == {versions[-1]} and gap(engine, samples) < EXACT
        assert len(set(versions)) == 3 and versions[1].startswith("sha256:")
        assert [m["id"] for m in httpx.get(server.url + "/v1/models", headers=server.headers).json()["data"]] == [MODEL]  # 'old' dropped
        reply = httpx.post(server.url + "/update_weights_from_disk", headers=server.headers, json={"model_path": str(tmp_path / "none")})
        assert reply.status_code == 400 and reply.json()["success"] is False and reply.json()["num_paused_requests"] == 0
        assert "could not be loaded" in reply.json()["message"]
        named = httpx.post(server.url + "/update_weights_from_disk", headers=server.headers,
                           json={"model_path": str(tmp_path / "full"), "weight_version": "step6"})
        assert named.json()["success"] and named.headers["x-whileai-weights-version"] == "step6"
        server.kill()
        with pytest.raises(SamplerError, match="no inference server answers at"):
            sampler.sample(PROMPTS)
        with pytest.raises(SamplerError, match="no inference server answers at"):
            sampler.sync(engine, tmp_path / "full")


def test_the_docs_example_runs_against_a_server(server, tmp_path):
    page = (Path(__file__).resolve().parents[2] / "docs" / "record.md").read_text(encoding="utf-8")
    section = page.split("## Weight sync", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "http://127.0.0.1:8300" in code and "/tmp/wai-sync" in code
    exec(code.replace("http://127.0.0.1:8300", server.url).replace("/tmp/wai-sync", str(tmp_path)), {})
    assert httpx.post(server.url + "/v1/unload_lora_adapter", headers=server.headers, json={"lora_name": "policy"}).status_code == 200
