"""A bounded fuzzer over the routes of `wai policy`, `wai record` and `wai serve` (real processes, httpx).

Each case is drawn from a seeded generator: malformed JSON, wrong types, huge counts, out-of-vocabulary and
negative token ids, NaN / Infinity, path-like names, missing / wrong / another server's tokens, and on `wai
serve` replayed sequence numbers with changed bodies. Every answer must be a 200 or a 4xx whose JSON error
carries a message; afterwards every server still answers, its memory stayed bounded, and nothing was written
outside the data folders. The default suite runs a fast draw; `-m slow` runs a long one.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fieldkit import rss_mb

TEXTS = ["", "a", "é" * 50, "\x00", "../../etc/passwd", "/tmp/../../root", "a/../..", "{{}}", "\ud800".encode(
    "utf-8", "surrogatepass").decode("utf-8", "replace"), "x" * 5000]
NUMBERS = [0, -1, 1, 1.5, 2**31, 2**63, 2**64, 10**12, -(10**12), 1e30, -1e-30, True, None, "1", [], {}]


def _value(rng: random.Random) -> Any:
    kind = rng.randrange(6)
    if kind == 0:
        return rng.choice(TEXTS)
    if kind == 1:
        return rng.choice(NUMBERS)
    if kind == 2:
        return [rng.choice([-5, 0, 1, 72, 258, 259, 10**6, -(2**40)]) for _ in range(rng.randrange(0, 6))]
    if kind == 3:
        return [[rng.choice([1, 2, 300, -1])] * rng.randrange(0, 3) for _ in range(rng.randrange(0, 12))]
    if kind == 4:
        return {rng.choice(["role", "content", "type", "tokens"]): rng.choice(TEXTS) for _ in range(2)}
    return [{"role": rng.choice(["user", "assistant", 5, None]), "content": rng.choice(TEXTS + [None, 3])}]


def _body(rng: random.Random, fields: list[str]) -> bytes:
    """A body for a route with these ``fields``: mostly JSON objects with wrong or extreme values, sometimes
    broken JSON or non-finite numbers."""
    kind = rng.randrange(10)
    if kind == 0:
        return rng.choice([b"", b"{", b"[1, 2", b"null", b"42", b'"text"', b"\xff\xfe", b"{" * 5000 + b"}" * 5000])
    body = {name: _value(rng) for name in rng.sample(fields, rng.randrange(1, len(fields) + 1))}
    if rng.random() < 0.2:
        body[rng.choice(["logit_bias", "unknown", "__proto__"])] = {"1": 1}
    text = json.dumps(body)
    if kind == 1:
        text = text.replace("1", rng.choice(["NaN", "Infinity", "-Infinity"]), 1)
    return text.encode()


POLICY = {"/v1/completions": ["model", "prompt", "n", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                              "stop_token_ids", "logprobs", "stream", "return_token_ids"],
          "/v1/chat/completions": ["model", "messages", "n", "max_completion_tokens", "logprobs", "top_logprobs",
                                   "tools", "stream", "seed"],
          "/v1/load_lora_adapter": ["lora_name", "lora_path", "load_inplace"],
          "/v1/unload_lora_adapter": ["lora_name"],
          "/update_weights_from_disk": ["model_path", "weight_version"]}
RECORDER = {"/v1/completions": POLICY["/v1/completions"], "/v1/chat/completions": POLICY["/v1/chat/completions"],
            "/v1/rewards": ["trace_id", "reward", "replace"]}
OPS = {"forward_backward": ["data", "loss_function", "loss_config"], "forward": ["data", "loss_function"],
       "optim_step": ["adam_params"], "sample": ["prompt_tokens", "num_samples", "sampling_params"],
       "logprobs": ["tokens", "top_k"], "save_state": ["name"], "load_state": ["name"], "noop": [],
       "export_lora": ["merged"], "add_critic": ["learning_rate", "reward_range"]}


def _check(reply: httpx.Response, what: str) -> None:
    assert reply.status_code < 500, f"{what}: {reply.status_code} {reply.text[:300]}"
    if reply.status_code >= 400:
        body = reply.json()
        error = body["error"] if "error" in body else body  # /update_weights_from_disk answers SGLang's shape
        assert isinstance(error["message"], str) and error["message"], f"{what}: {reply.text[:300]}"


def _tokens(rng: random.Random, server: Any, others: list[Any]) -> dict[str, str]:
    draw = rng.random()
    if draw < 0.75:
        return {"authorization": f"Bearer {server.token}"}
    if draw < 0.85:
        return {}
    if draw < 0.93:
        return {"authorization": f"Bearer {rng.choice(others).token}"}  # another server's token
    return {"authorization": rng.choice(["Bearer", "Basic abc", "Bearer " + "x" * 40, server.token])}


def fuzz(policy: Any, recorder: Any, serve: Any, cases: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    servers = [policy, recorder, serve]
    before = {s.url: rss_mb(s.process.pid) for s in servers}
    auth = {"authorization": f"Bearer {serve.token}"}
    session = httpx.post(serve.url + "/v1/training/sessions", headers=auth).json()["session_id"]
    run = httpx.post(f"{serve.url}/v1/training/sessions/{session}/runs", headers=auth, timeout=120,
                     json={"base_model": "builtin:tiny"}).json()["run_id"]
    counts: dict[str, int] = {}
    with httpx.Client(timeout=60) as http:
        for case in range(cases):
            target = rng.randrange(3)
            if target == 0:
                path = rng.choice(list(POLICY))
                request = ("POST", policy.url + path, _body(rng, POLICY[path]), _tokens(rng, policy, [recorder, serve]))
            elif target == 1:
                path = rng.choice([*RECORDER, "/v1/traces/{x}", "/v1/export?after={x}&limit={x}"])
                if "{x}" in path:
                    filled = path.replace("{x}", quote(str(rng.choice(TEXTS[:7] + NUMBERS[:10])), safe=""))
                    request = ("GET", recorder.url + filled, None, _tokens(rng, recorder, [policy, serve]))
                else:
                    request = ("POST", recorder.url + path, _body(rng, RECORDER[path]),
                               _tokens(rng, recorder, [policy, serve]))
            else:
                op = rng.choice(list(OPS))
                info = http.get(f"{serve.url}/v1/training/runs/{run}", headers=auth).json()
                seq = rng.choice([info["next_seq"], info["next_seq"], max(0, info["next_seq"] - 1), -1, "0", 1.5])
                raw = _body(rng, OPS[op] + ["seq_id"]) if rng.random() < 0.5 else b"{}"
                try:
                    body = json.loads(raw)
                    raw = json.dumps({**body, "seq_id": seq} if isinstance(body, dict) else body).encode()
                except ValueError:
                    pass  # broken JSON goes as it is
                where = rng.choice([f"runs/{run}/{op}", f"runs/{run}/{op}", f"runs/../{run}/{op}",
                                    f"runs/{run}/exports/../../service.db", f"sessions/{session}/runs"])
                request = ("POST", f"{serve.url}/v1/training/{where}", raw,
                           _tokens(rng, serve, [policy, recorder]))
            method, url, content, headers = request
            reply = http.request(method, url, content=content, headers={**headers, "content-type": "application/json"})
            _check(reply, f"case {case}: {method} {url} {str(content)[:200]}")
            counts[str(reply.status_code)] = counts.get(str(reply.status_code), 0) + 1
    for server in servers:
        assert httpx.get(server.url + "/healthz").status_code == 200
        grown = rss_mb(server.process.pid) - before[server.url]
        assert grown < 300, f"{server.url} grew {grown:.0f} MiB"
    return counts


def test_a_fast_draw_of_bad_requests_gets_4xxs_and_leaves_every_server_up(policy, recorder, serve):
    cwd = sorted(os.listdir("."))
    counts = fuzz(policy, recorder, serve, cases=90, seed=1)
    print("statuses:", counts)
    assert sum(v for k, v in counts.items() if k.startswith("4")) >= 45  # most draws are refused
    assert sorted(os.listdir(".")) == cwd  # nothing written outside the data folders


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3, 4])
def test_a_long_draw_of_bad_requests_gets_4xxs_and_leaves_every_server_up(policy, recorder, serve, seed):
    cwd = sorted(os.listdir("."))
    counts = fuzz(policy, recorder, serve, cases=400, seed=seed)
    print("statuses:", counts)
    assert sorted(os.listdir(".")) == cwd
