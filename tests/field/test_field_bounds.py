"""Every request is bounded before work, on `wai policy`, `wai record` and `wai serve`: a body past
--max-body-mb is a 413 while it is read (the server never holds it), a prompt longer than the context could
hold is refused before it is tokenized, token ids outside the vocabulary and counts past their flags are 400s
naming the field, and non-finite JSON numbers are refused. The server stays up and small."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from fieldkit import MiB, rss_mb


def streamed(total: int, chunk: int = MiB) -> Iterator[bytes]:
    """A JSON-looking body of ``total`` bytes sent in chunks without a Content-Length (chunked encoding)."""
    yield b'{"prompt": "'
    for _ in range(total // chunk):
        yield b"a" * chunk
    yield b'"}'


@pytest.mark.parametrize("server_name, path", [("policy", "/v1/completions"), ("recorder", "/v1/completions"),
                                               ("recorder", "/v1/rewards"), ("policy", "/update_weights_from_disk"),
                                               ("serve", "/v1/training/sessions/{session}/runs")])
def test_a_huge_body_is_a_413_while_it_is_read_and_the_server_stays_small(server_name, path, request):
    server = request.getfixturevalue(server_name)
    headers = {"authorization": f"Bearer {server.token}"}
    if "{session}" in path:
        session = httpx.post(server.url + "/v1/training/sessions", headers=headers).json()["session_id"]
        path = path.format(session=session)
    before = rss_mb(server.process.pid)
    began = time.perf_counter()
    reply = httpx.post(server.url + path, content=streamed(200 * MiB), headers=headers, timeout=60)
    took = time.perf_counter() - began
    grown = rss_mb(server.process.pid) - before
    print(f"{server_name} {path}: {reply.status_code} in {took:.2f} s, RSS +{grown:.0f} MiB")
    assert reply.status_code == 413, reply.text
    assert "--max-body-mb" in reply.text and "1048576" in reply.text
    assert grown < 50 and took < 10
    declared = httpx.post(server.url + path, content=b"x" * (2 * MiB), headers=headers, timeout=60)
    assert declared.status_code == 413 and "declares 2097152 bytes" in declared.text
    assert httpx.get(server.url + "/healthz").status_code == 200


def test_a_prompt_too_long_for_the_context_is_refused_before_it_is_tokenized(policy):
    client = openai.OpenAI(base_url=policy.url + "/v1", api_key=policy.token, max_retries=0)
    began = time.perf_counter()
    with pytest.raises(openai.BadRequestError, match=r"'prompt' holds 900000 bytes of text; no text over \d+ bytes "
                                                     r"fits this model's context of 256 tokens"):
        client.completions.create(model="builtin:tiny", prompt="a" * 900_000, max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="'messages' holds 300004 bytes of text"):
        client.chat.completions.create(model="builtin:tiny", messages=[{"role": "user", "content": "é" * 150_000}])
    assert time.perf_counter() - began < 5
    fits = client.completions.create(model="builtin:tiny", prompt="a" * 200, max_tokens=1)  # 201 tokens: it fits
    assert fits.usage.prompt_tokens == 201


@pytest.mark.parametrize("body, field, words", [
    ({"prompt": [1, -5]}, "prompt", "token id -5, outside this model's vocabulary [0, 259)"),
    ({"prompt": [1, 259]}, "prompt", "token id 259, outside"),
    ({"prompt": [[1, 2], [3, 10**6]]}, "prompt", "'prompt[1]' holds token id 1000000"),
    ({"prompt": [1], "stop_token_ids": [400]}, "stop_token_ids", "token id 400"),
    ({"prompt": [1], "n": 5}, "n", "'n' is 5; it must be an integer in [1, 4] (the server's limit, --max-n)"),
    ({"prompt": [1], "max_tokens": 65}, "max_tokens", "[1, 64] (the server's limit, --max-tokens)"),
    ({"prompt": [[1]] * 9}, "prompt", "'prompt' holds 9 prompts; this server takes at most 8 in one request (--max-batch)"),
    ({"prompt": [1], "seed": 2**64}, "seed", "'seed' is 18446744073709551616"),
    ({"prompt": [1], "seed": 1e30}, "seed", "'seed' is 1e+30"),
])
def test_ids_and_counts_past_their_limits_are_400s_naming_the_field(policy, body, field, words):
    reply = httpx.post(policy.url + "/v1/completions", json=body, headers=policy.headers)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert words in error["message"] and error["param"] == field
    assert httpx.get(policy.url + "/healthz").json()["ok"]


@pytest.mark.parametrize("raw", [b'{"prompt": [1], "temperature": NaN}', b'{"prompt": [1], "top_p": Infinity}',
                                 b'{"prompt": [1], "temperature": -Infinity}', b'{"prompt": [1], "seed": 1' + b"0" * 5000 + b"}"])
def test_non_finite_numbers_are_refused_by_the_policy_and_the_recorder(policy, recorder, raw):
    for server in (policy, recorder):
        reply = httpx.post(server.url + "/v1/completions", content=raw, headers=server.headers)
        assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"], reply.text
    reward = httpx.post(recorder.url + "/v1/rewards", content=b'{"trace_id": "t", "reward": NaN}',
                        headers=recorder.headers)
    assert reward.status_code == 422 and "finite" in reward.json()["error"]["message"]


def test_the_serve_seed_is_bounded(serve):
    headers = {"authorization": f"Bearer {serve.token}"}
    session = httpx.post(serve.url + "/v1/training/sessions", headers=headers).json()["session_id"]
    for seed in (1e30, 2**63, -1):
        reply = httpx.post(f"{serve.url}/v1/training/sessions/{session}/runs", headers=headers,
                           content=json.dumps({"seed": seed}))
        assert reply.status_code == 422 and "seed" in reply.json()["error"]["message"], reply.text
