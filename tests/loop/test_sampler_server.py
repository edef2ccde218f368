"""`wai train --sampler-url`: rollouts from a real `wai policy` subprocess, sampled ahead of the trainer within the
lag, the weights pushed after every step. The version gap of every row is exactly min(step, lag) (the gate's
bound, read from the version the server reported); at lag 0 the trainer's probability of every sampled token
equals the server's within 1e-4, at lag 2 it does not (the check can fail); a seeded run is repeatable at lag 1;
pushing every k steps gives the gaps that k implies; the refusals name the setting and the fix."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import whileai as wai
from whileai.engine import TrainingEngine
from whileai.envs import load_taskset
from whileai.errors import ConfigError
from whileai.loop.run import dry_run
from whileai.loop.sources.sampler import AheadRollouts, HTTPSampler
from whileai.loop.sources.server_sampler import SamplerError, ServerSampler
from whileai.loop.sources.sync import PushWeights
from whileai.record.launch import Started
from whileai.service.launch import free_port

pytestmark = pytest.mark.usefixtures("wai_token")
RUN = dict(steps=4, rollouts_per_step=8, warm_start_steps=0, eval_tasks=0, progress=False, save_every=1000,
           lr_schedule="constant", learning_rate=3e-2)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Started(["policy", "builtin:tiny", "--threads", "1"], tmp_path_factory.mktemp("policy")) as policy:
        yield policy


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(run_dir: Path) -> dict[str, np.ndarray]:
    return load_file(str(run_dir / "final" / "model.safetensors"))


@pytest.mark.parametrize("lag", [0, 2])
def test_every_rows_version_gap_is_min_step_lag_and_lag_0_is_on_policy(server, tmp_path, lag):
    run = wai.train(**RUN, lag=lag, sampler_url=server.url, run_dir=str(tmp_path / "run"), export=False)
    records = run.metrics()
    assert [r["staleness/max"] for r in records] == [min(t, lag) for t in range(4)]
    assert [r["staleness/mean"] for r in records] == [min(t, lag) for t in range(4)]
    assert [r["sampled_at_step"] for r in records] == [max(0, t - lag) for t in range(4)]
    gaps = [r["ratio_gap_max"] for r in records]
    if lag == 0:
        assert max(gaps) < 1e-4, gaps  # the server's log-probabilities are the trainer's
    else:
        assert max(gaps[2:]) > 1e-3, gaps  # two pushes behind: the ratio moved off 1 (the check can fail)
    plan = run.summary["plan"]
    assert (plan["values"]["sampler"], plan["sources"]["sampler"], plan["values"]["sync_every"]) == (server.url, "user", 1)


def test_a_seeded_run_is_repeatable_at_lag_1(server, tmp_path):
    first, second = (wai.train(**RUN, lag=1, sampler_url=server.url, run_dir=str(tmp_path / name)).dir
                     for name in ("a", "b"))
    a, b = weights(first), weights(second)
    assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a) == 0.0
    assert [r["reward"] for r in metrics(first)] == [r["reward"] for r in metrics(second)]


def test_pushing_every_second_step_gives_the_gaps_it_implies(server, tmp_path):
    run = wai.train(**{**RUN, "steps": 6}, lag=1, sync_every=2, sampler_url=server.url, export=False,
                    run_dir=str(tmp_path / "run"))
    # pushes after steps 0, 2, 4: draw d is sampled with the first push at or after d - 1
    assert [r["staleness/max"] for r in run.metrics()] == [0, 1, 0, 1, 0, 1]


def test_a_draw_records_the_version_the_server_reported_its_step_and_the_settings(server, tmp_path):
    engine = TrainingEngine("builtin:tiny")
    client = ServerSampler(server.url, "builtin:tiny")
    plan = dry_run(**{**RUN, "steps": 3}, lag=1, sampler_url=server.url)
    taskset = load_taskset("builtin:case")
    push = PushWeights(client, tmp_path / "sync", name="t")
    batches = AheadRollouts(HTTPSampler(client, engine.tokenizer, engine.max_context), push, taskset,
                            wai.method("flash_reinforce"), plan)
    try:
        version = push.push(engine, 0)
        rows = batches.next(0, None)
        assert version == "t-step0" and push.step_of(version) == 0
        assert {r["weights_version"] for r in rows} == {version} and {r["sampler_step"] for r in rows} == {0}
        assert rows[0]["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 4}
        assert len(rows) == 8 and all(len(r["behavior_logprobs"]) == len(r["tokens"]) for r in rows)
        push.push(engine, 1)  # waits for draw 1 (lag 1: meant for step 0's weights), then reloads as t-step1
        assert batches.next(1, None)[0]["weights_version"] == version
        assert batches.next(2, None)[0]["sampler_step"] == 1
        with pytest.raises(SamplerError, match="which this run did not push"):
            push.step_of("builtin:tiny@seed0")
    finally:
        batches.close()


@pytest.mark.parametrize(("settings", "expected"), [
    ({"lag": 1, "sync_every": 3}, "sync_every = 3 with lag = 1: .* at least every 2 steps"),
    ({"method": "sft", "rows": "rows.jsonl"}, "sampler_url: the run trains on rows from a file"),
    ({"url": "http://127.0.0.1:1"}, "drop one of --url and --sampler-url"),
    ({"sync_every": 0}, "sync_every = 0 must be >= 1"),
])
def test_what_a_server_sampler_cannot_do_is_refused_before_anything_loads(tmp_path, settings, expected):
    (tmp_path / "rows.jsonl").write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    if "rows" in settings:
        settings = {**settings, "rows": str(tmp_path / "rows.jsonl")}
    with pytest.raises(ConfigError, match=expected):
        dry_run(sampler_url="http://127.0.0.1:1", **settings)


def test_no_server_at_the_url_is_named_and_leaves_no_run_behind(tmp_path):
    with pytest.raises(SamplerError, match="no inference server answers at http://127.0.0.1:.*Fix: start it"):
        wai.train(**RUN, sampler_url=f"http://127.0.0.1:{free_port()}", run_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_full_fine_tuning_against_vllm_is_refused_with_the_reason():
    """A loopback server answering /v1/models as vLLM does (owned_by: vllm)."""
    class Models(BaseHTTPRequestHandler):
        def do_GET(self):
            raw = json.dumps({"object": "list", "data": [{"id": "Qwen/Qwen3-0.6B", "object": "model",
                                                          "owned_by": "vllm", "root": "Qwen/Qwen3-0.6B"}]}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args):
            pass

    vllm = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=vllm.serve_forever, daemon=True).start()
    try:
        client = ServerSampler(f"http://127.0.0.1:{vllm.server_address[1]}", "Qwen/Qwen3-0.6B")
        assert client.served() == ("Qwen/Qwen3-0.6B", "vllm")
        push = PushWeights(client, "/tmp/unused")
        with pytest.raises(ConfigError, match="is a vLLM server and this run trains every weight: vLLM's "
                           "OpenAI-compatible server has no route that reloads full weights.*--lora-rank N"):
            push.check_server(lora=False)
        push.check_server(lora=True)  # LoRA adapters load at runtime there
    finally:
        vllm.shutdown()
        vllm.server_close()


@pytest.mark.parametrize("lag", [0, 2])
def test_the_server_path_trains_what_the_in_process_path_trains(server, tmp_path, lag):
    """`wai policy` samples a batch of prompts in one engine call with the engine's streams (seed, prompt, sample):
    the same rollouts as in-process, so the same rewards every step and the same weights up to float noise."""
    here = wai.train(**RUN, lag=lag, run_dir=str(tmp_path / "here"))
    there = wai.train(**RUN, lag=lag, sampler_url=server.url, run_dir=str(tmp_path / "there"))
    assert [r["reward"] for r in here.metrics()] == [r["reward"] for r in there.metrics()]
    a, b, start = weights(here.dir), weights(there.dir), TrainingEngine("builtin:tiny").model.state_dict()
    moved = max(float(np.max(np.abs(a[k] - start[k].numpy()))) for k in a if k in start)
    assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a) < 1e-3 < 1e-2 < moved


def test_a_batch_of_prompts_is_sampled_as_the_engine_samples_it_in_process(server):
    """`wai policy` answers a list of token-id prompts (vLLM's list form) prompt by prompt, index i * n + j, with
    the engine's own random streams: the tokens and log-probabilities of in-process sampling with that seed."""
    import httpx

    from whileai.engine import SamplingParams

    engine = TrainingEngine("builtin:tiny")
    httpx.post(server.url + "/update_weights_from_disk", headers=server.headers,  # the fixture's server may hold an earlier run's weights
               json={"model_path": engine.export(str(Path(server.log).parent / "base"), merged=True, overwrite=True)})
    batch = [[1, 72, 105, 32], [1, 80, 81], [1, 90, 91, 92, 93]]
    reply = httpx.post(server.url + "/v1/completions", headers=server.headers, json={"model": "builtin:tiny", "prompt": batch, "n": 2,
                                                             "max_tokens": 6, "seed": 7, "logprobs": 0,
                                                             "return_token_ids": True}).json()
    here = engine.sample(batch, 2, SamplingParams(max_tokens=6, seed=7))
    assert [c["index"] for c in reply["choices"]] == list(range(6))
    for k, choice in enumerate(reply["choices"]):
        mine = here[k // 2][k % 2]
        assert choice["prompt_token_ids"] == batch[k // 2] and choice["token_ids"] == mine.tokens
        assert max(abs(a - b) for a, b in zip(choice["logprobs"]["token_logprobs"], mine.logprobs)) < 1e-5
    refused = httpx.post(server.url + "/v1/completions", headers=server.headers, json={"prompt": batch, "stream": True})
    assert refused.status_code == 400 and "cannot stream" in refused.json()["error"]["message"]
