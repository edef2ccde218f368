"""Secure by default (docs/decisions.md, "Auth"): `wai policy` and `wai record` take a token like `wai serve`;
given none they generate one and print it, and every route but /healthz asks for it: the served weights, the
rewards and the traces included. `--no-token` is the explicit opt-out, refused on a non-loopback address.
A wrong token is never echoed back, and no token is written to the recorder's data."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import httpx
import openai
import pytest

from whileai.record.launch import Started
from whileai.service.auth import TOKEN_ENV


def _without_token_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != TOKEN_ENV}


def test_a_default_policy_prints_a_token_and_asks_it_everywhere_but_healthz(tmp_path, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    server = Started(["policy", "builtin:tiny", "--threads", "1"], tmp_path, token="unused-placeholder-token")
    server.env = _without_token_env()  # as a user starts it: no --token, no $WAI_TOKEN
    with server:
        printed = re.search(r"wai policy: token (\S+) \(generated", server.log.read_text())
        assert printed, server.log.read_text()
        token = printed.group(1)
        swap = {"model_path": str(tmp_path), "weight_version": "attacker"}
        for headers in ({}, {"authorization": "Bearer wrong-token-0123456789"}, {"authorization": token}):
            for method, path, body in [("POST", "/update_weights_from_disk", swap),
                                       ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/"}),
                                       ("POST", "/v1/unload_lora_adapter", {"lora_name": "x"}),
                                       ("POST", "/v1/completions", {"prompt": [1]}), ("GET", "/v1/models", None)]:
                reply = httpx.request(method, server.url + path, json=body, headers=headers)
                assert reply.status_code == 401, (path, reply.text)
                assert reply.json()["error"]["type"] == "authentication_error"
                assert "wrong-token" not in reply.text
        assert httpx.get(server.url + "/healthz").json()["weights_version"] == "builtin:tiny@seed0"  # not swapped
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0).models.list()
        listed = openai.OpenAI(base_url=server.url + "/v1", api_key=token, max_retries=0).models.list()
        assert [m.id for m in listed] == ["builtin:tiny"]
    assert server.log.read_text().count(token) == 1  # printed once, at start, never again


def test_the_recorder_guards_rewards_traces_and_export_and_sends_upstream_its_own_key(policy, recorder):
    paths = [("POST", "/v1/rewards", {"trace_id": "t", "reward": 1.0}), ("GET", "/v1/traces/t", None),
             ("GET", "/v1/export", None), ("POST", "/v1/completions", {"prompt": [1]}), ("GET", "/v1/models", None)]
    for token in (None, policy.token, "rec-wrong-0123456789abcdef"):
        headers = {"authorization": f"Bearer {token}"} if token else {}
        for method, path, body in paths:
            reply = httpx.request(method, recorder.url + path, json=body, headers=headers)
            assert reply.status_code == 401, (token, path, reply.text)
    client = openai.OpenAI(base_url=recorder.url + "/v1", api_key=recorder.token, max_retries=0)
    raw = client.completions.with_raw_response.create(model="builtin:tiny", prompt=[1, 72], max_tokens=2)
    trace_id = raw.headers["x-whileai-trace-id"]
    scored = httpx.post(recorder.url + "/v1/rewards", headers=recorder.headers,
                        json={"trace_id": trace_id, "reward": 1.0})
    assert scored.status_code == 200
    exported = httpx.get(recorder.url + "/v1/export", headers=recorder.headers).json()
    assert len(exported["rows"]) + len(exported["refused"]) == 1 and exported["cursor"] >= 1
    data = recorder.args[recorder.args.index("--data-dir") + 1]
    for path in os.scandir(data):
        text = open(path.path, "rb").read()
        assert recorder.token.encode() not in text and policy.token.encode() not in text


@pytest.mark.parametrize("server", ["policy", "record"])
def test_no_token_is_refused_on_a_non_loopback_address(server, tmp_path):
    args = ["policy", "builtin:tiny"] if server == "policy" else ["record", "--upstream", "http://127.0.0.1:9"]
    done = subprocess.run([sys.executable, "-m", "whileai", *args, "--host", "0.0.0.0", "--no-token",
                           "--port", "0"], capture_output=True, text=True, timeout=120, env=_without_token_env(),
                          cwd=tmp_path)
    assert done.returncode != 0
    assert f"wai {server}: --no-token on --host 0.0.0.0 would let anyone" in done.stderr + done.stdout
    short = subprocess.run([sys.executable, "-m", "whileai", *args, "--token", "short", "--port", "0"],
                           capture_output=True, text=True, timeout=120, env=_without_token_env(), cwd=tmp_path)
    assert short.returncode != 0 and "at least 16 characters" in short.stderr + short.stdout


def test_no_token_on_loopback_opens_every_route(tmp_path):
    with Started(["policy", "builtin:tiny", "--threads", "1", "--no-token"], tmp_path) as server:
        assert "no token (--no-token)" in server.log.read_text()
        reply = httpx.post(server.url + "/v1/completions", json={"prompt": [1], "max_tokens": 1})
        assert reply.status_code == 200, reply.text


def test_a_recorder_whose_key_the_policy_refuses_says_so_and_names_upstream_key(policy, tmp_path):
    """Two generated tokens (the newcomer's default): the client sends the recorder's right token and must not be
    told its token is wrong; the recorder answers 502 naming its own key and --upstream-key (was: the policy's
    401 passed on, blaming the client)."""
    with Started(["record", "--upstream", policy.url, "--data-dir", str(tmp_path / "rec")], tmp_path,
                 token="own-" + "r" * 20) as recorder:
        client = openai.OpenAI(base_url=recorder.url + "/v1", api_key=recorder.token, max_retries=0)
        for call in (lambda: client.completions.create(model="builtin:tiny", prompt=[1, 72], max_tokens=2),
                     lambda: client.models.list()):
            with pytest.raises(openai.APIStatusError) as refused:
                call()
            assert refused.value.status_code == 502
            assert "refused the recorder's key" in str(refused.value) and "--upstream-key" in str(refused.value)
        assert "refused the recorder's key" in recorder.log.read_text()


def test_the_reward_command_says_its_own_flag_for_a_second_score(recorder, capsys):
    """`wai record reward --url` on a scored trace says `add --replace` (the CLI's flag), not the wire's
    `send "replace": true`; a NaN says to fix the command, before anything is sent."""
    from whileai.cli import main

    client = openai.OpenAI(base_url=recorder.url + "/v1", api_key=recorder.token, max_retries=0)
    raw = client.completions.with_raw_response.create(model="builtin:tiny", prompt=[1, 72], max_tokens=2)
    trace_id = raw.headers["x-whileai-trace-id"]
    args = ["record", "reward", trace_id, "1", "--url", recorder.url, "--token", str(recorder.token)]
    assert main(args) == 0
    assert main(args) != 0
    said = capsys.readouterr().err
    assert "already scored (1). Fix: add --replace" in said and '"replace": true' not in said
    assert main([*args[:3], "nan", *args[4:]]) != 0
    assert "Fix the command's arguments and run it again" in capsys.readouterr().err
