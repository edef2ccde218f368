"""`wai record` in front of `wai policy`, each in its own process, on loopback, with the official `openai`
client as the caller: what the client sees, what is recorded, threading, faithfulness, rewards, crashes."""

from __future__ import annotations

import json
import threading

import httpx
import numpy as np
import openai
import pytest

from whileai.record import chat
from whileai.record.export import export
from whileai.record.launch import Started

pytestmark = pytest.mark.slow
MODEL = "builtin:tiny"
UPSTREAM = "sk-upstream-secret-0001"  # wai policy's token, which the recorder sends upstream (--upstream-key)
RECORDER = "sk-recorder-secret-0002"  # the recorder's own, which its clients send


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("record")
    with Started(["policy", MODEL, "--threads", "1", "--token", UPSTREAM], root) as policy:
        recorder = Started(["record", "--upstream", policy.url, "--data-dir", str(root / "data"), "--token", RECORDER,
                            "--upstream-key", UPSTREAM], root)
        with recorder:
            yield policy, recorder, root / "data"


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.token, max_retries=0)


def tokenizer():
    from whileai.engine.models import byte_tokenizer

    return byte_tokenizer()


def trace(recorder, trace_id):
    answer = httpx.get(f"{recorder.url}/v1/traces/{trace_id}", headers=recorder.headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


def reply_ids(exchange):
    ids = exchange["completion_ids"]
    return ids[:-1] if exchange["finish_reason"] == "stop" and ids[-1] == 2 else ids


def test_the_client_gets_what_the_upstream_would_have_sent_and_the_trace_holds_its_tokens(servers):
    policy, recorder, _ = servers
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=10, seed=11)
    direct = client(policy).chat.completions.create(**ask)
    raw = client(recorder).chat.completions.with_raw_response.create(**ask)
    via = raw.parse()
    assert via.choices[0].message.content == direct.choices[0].message.content
    assert via.choices[0].logprobs is None and not via.model_extra and not via.choices[0].model_extra
    exchange = trace(recorder, raw.headers["x-whileai-trace-id"])["exchanges"][0]
    assert chat.decode(tokenizer(), reply_ids(exchange)) == via.choices[0].message.content
    assert len(exchange["logprobs"]) == len(exchange["completion_ids"]) == via.usage.completion_tokens
    assert exchange["prompt_ids"] == chat.render(tokenizer(), ask["messages"])
    assert exchange["weights_version"] == f"{MODEL}@seed0" and exchange["logprobs_mode"] == "processed_logprobs"


def test_models_are_the_upstreams_and_each_of_n_choices_has_its_own_trace_id(servers):
    """``models.list()`` through the recorder is the upstream's list (sent with --upstream-key; a client with a
    wrong token gets the recorder's own 401, and the upstream's token does not open the recorder); ``n=2`` gives a JSON list of two trace ids in x-whileai-trace-ids, one per choice in index
    order, each trace holding that choice's tokens; x-whileai-trace-id is choice 0's."""
    policy, recorder, _ = servers
    assert [m.id for m in client(recorder).models.list()] == [m.id for m in client(policy).models.list()] == [MODEL]
    for key in ("sk-wrong", UPSTREAM):
        wrong = openai.OpenAI(base_url=recorder.url + "/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="not this server's"):
            wrong.models.list()
    raw = client(recorder).completions.with_raw_response.create(model=MODEL, prompt="ab", max_tokens=6, n=2, seed=3)
    ids = json.loads(raw.headers["x-whileai-trace-ids"])
    assert len(ids) == len(set(ids)) == 2 and raw.headers["x-whileai-trace-id"] == ids[0]
    for trace_id, choice in zip(ids, raw.parse().choices):
        exchange = trace(recorder, trace_id)["exchanges"][0]
        assert chat.decode(tokenizer(), reply_ids(exchange)) == choice.text


def test_asked_for_logprobs_the_client_gets_them_and_they_are_the_recorded_ones(servers):
    _, recorder, _ = servers
    raw = client(recorder).completions.with_raw_response.create(model=MODEL, prompt="abc", max_tokens=6, seed=5,
                                                                logprobs=2, temperature=0.7)
    via = raw.parse()
    exchange = trace(recorder, raw.headers["x-whileai-trace-id"])["exchanges"][0]
    assert via.choices[0].logprobs.token_logprobs == exchange["logprobs"]
    assert exchange["sampling"] == {"temperature": 0.7, "top_p": 1.0, "top_k": 0}


def test_a_stream_reaches_the_client_unchanged_and_is_recorded(servers):
    policy, recorder, _ = servers
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=12, seed=7, stream=True)
    direct = "".join(c.choices[0].delta.content or "" for c in client(policy).chat.completions.create(**ask)
                     if c.choices)
    raw = client(recorder).chat.completions.with_raw_response.create(**ask)
    chunks = list(raw.parse())
    assert all(c.choices[0].logprobs is None and not c.model_extra for c in chunks if c.choices)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == direct
    exchange = trace(recorder, raw.headers["x-whileai-trace-id"])["exchanges"][0]
    assert chat.decode(tokenizer(), reply_ids(exchange)) == text


def test_a_streamed_completion_with_logprobs_gives_the_client_the_recorded_values(servers):
    _, recorder, _ = servers
    raw = client(recorder).completions.with_raw_response.create(model=MODEL, prompt="xyz", max_tokens=8, seed=9,
                                                                logprobs=1, stream=True, temperature=0.8)
    chunks = [c for c in raw.parse() if c.choices]
    exchange = trace(recorder, raw.headers["x-whileai-trace-id"])["exchanges"][0]
    assert [v for c in chunks for v in c.choices[0].logprobs.token_logprobs] == exchange["logprobs"]
    pieces = [t for c in chunks for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks for o in c.choices[0].logprobs.text_offset]
    text = "".join(c.choices[0].text for c in chunks)  # offsets index it; a part of a character reads bytes:\xNN
    assert offsets == sorted(offsets) and all(0 <= o <= len(text) for o in offsets)
    assert all(text[o:o + len(p)] == p for p, o in zip(pieces, offsets) if not p.startswith("bytes:"))
    assert len(exchange["completion_ids"]) == len(pieces)


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_conversation_threads_into_one_trace_with_only_the_replies_as_actions(servers, stream, tmp_path):
    _, recorder, data = servers
    messages = [{"role": "system", "content": "use tools"}, {"role": "user", "content": "weather?"}]
    ids, replies = [], []
    for turn in range(3):
        raw = client(recorder).chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=6, seed=20 + turn, stream=stream)
        ids.append(raw.headers["x-whileai-trace-id"])
        if stream:
            content = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
            message = {"role": "assistant", "content": content}
        else:
            message = raw.parse().choices[0].message.model_dump(exclude_none=True)
        replies.append(message["content"])
        messages = [*messages, message, {"role": "tool", "tool_call_id": f"call_{turn}", "content": "sunny, 21C"},
                    {"role": "user", "content": "and tomorrow?"}]
    assert len(set(ids)) == 1, ids
    assert httpx.post(f"{recorder.url}/v1/rewards", headers=recorder.headers, json={"trace_id": ids[0], "reward": 1.0}).status_code == 200
    export(data, tmp_path / "rows.jsonl")
    row = next(json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()
               if json.loads(line)["task_id"] == ids[0])
    tokens, mask = np.array(row["tokens"]), np.array(row["action_mask"])
    exchanges = trace(recorder, ids[0])["exchanges"]
    actions = np.concatenate([ex["completion_ids"] for ex in exchanges])
    assert tokens[mask].tolist() == actions.tolist()  # the mask marks exactly the replies' tokens
    for ex, content in zip(exchanges, replies):
        assert chat.decode(tokenizer(), reply_ids(ex)) == content  # what the client saw
    between = chat.decode(tokenizer(), tokens[~mask].tolist())
    assert between.count("tool: sunny, 21C\nuser: and tomorrow?\nassistant: ") == 2
    assert np.all(np.array(row["behavior_logprobs"])[~mask] == 0.0)


def test_the_trainers_ratio_on_recorded_traces_is_one_when_weights_have_not_moved(servers, tmp_path):
    """At temperature 0.7 / top-p 0.9 / top-k 20 and at the defaults, chat and completions, streamed and not:
    the trainer's scoring (loop.step.score, what `wai train --rows` runs) under the trace's sampling settings
    equals the recorded behavior log-probability on every action token, within 1e-4."""
    from whileai.engine import TrainingEngine
    from whileai.loop.step import score

    _, recorder, data = servers
    settings = [{"temperature": 0.7, "top_p": 0.9, "extra_body": {"top_k": 20}}, {}]
    ids = []
    for k, knobs in enumerate(settings * 3):
        stream = k % 3 == 2
        if k % 2:
            raw = client(recorder).completions.with_raw_response.create(
                model=MODEL, prompt=f"q{k}", max_tokens=16, seed=k, stream=stream, **knobs)
        else:
            raw = client(recorder).chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": f"q{k}"}], max_tokens=16, seed=k, stream=stream,
                **knobs)
        if stream:
            list(raw.parse())
        ids.append(raw.headers["x-whileai-trace-id"])
    for trace_id in ids:
        httpx.post(f"{recorder.url}/v1/rewards", headers=recorder.headers, json={"trace_id": trace_id, "reward": 0.0}).raise_for_status()
    export(data, tmp_path / "rows.jsonl")
    rows = [r for r in map(json.loads, (tmp_path / "rows.jsonl").read_text().splitlines()) if r["task_id"] in ids]
    assert len(rows) == len(ids)
    engine = TrainingEngine(MODEL, seed=0)
    worst, raw_worst = 0.0, 0.0
    for row in rows:
        (logprobs,) = score(engine, [row])  # under the row's own 'sampling', as `wai train --rows` scores it
        worst = max(worst, float(np.max(np.abs(np.exp(np.subtract(logprobs, row["behavior_logprobs"])) - 1))))
        plain = {k: v for k, v in row.items() if k != "sampling"}
        (raw,) = score(engine, [plain])  # the model's own (raw) log-probabilities: the ratio a raw log would give
        raw_worst = max(raw_worst, float(np.max(np.abs(np.exp(np.subtract(raw, row["behavior_logprobs"])) - 1))))
    assert {r["sampling"]["top_k"] for r in rows} == {0, 20}
    assert worst < 1e-4, worst
    assert raw_worst > 0.1, raw_worst  # scored under the wrong distribution, the ratio is far from 1


def test_bad_input_gets_a_clear_status_and_the_recorder_keeps_serving(servers):
    policy, recorder, _ = servers
    url = f"{recorder.url}/v1/rewards"
    unknown = httpx.post(url, headers=recorder.headers, json={"trace_id": "tr_nope", "reward": 1.0})
    assert unknown.status_code == 404 and "tr_nope" in unknown.json()["error"]["message"]
    nan = httpx.post(url, headers=recorder.headers, content=b'{"trace_id": "tr_nope", "reward": NaN}')
    assert nan.status_code == 422 and "finite" in nan.json()["error"]["message"]
    malformed = httpx.post(url, headers=recorder.headers, content=b"{not json")
    assert malformed.status_code == 422 and "not valid JSON" in malformed.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="unknown field 'logit_bias'"):
        client(recorder).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                 logit_bias={"5": 1})
    body = httpx.post(f"{recorder.url}/v1/chat/completions", headers=recorder.headers, content=b"[1, 2")
    assert body.status_code == 400 and "not valid JSON" in body.json()["error"]["message"]
    with pytest.raises(openai.AuthenticationError):  # the recorder checks its own token
        openai.OpenAI(base_url=recorder.url + "/v1", api_key="wrong", max_retries=0).completions.create(
            model=MODEL, prompt="a", max_tokens=2)
    raw = client(recorder).completions.with_raw_response.create(model=MODEL, prompt="still here", max_tokens=3)
    first = raw.headers["x-whileai-trace-id"]
    assert httpx.post(url, headers=recorder.headers, json={"trace_id": first, "reward": 1}).status_code == 200
    again = httpx.post(url, headers=recorder.headers, json={"trace_id": first, "reward": 0})
    assert again.status_code == 409 and "replace" in again.json()["error"]["message"]
    assert httpx.post(url, headers=recorder.headers, json={"trace_id": first, "reward": 0, "replace": True}).json()["replaced"] == 1.0


def test_no_token_is_ever_stored_or_logged(servers):
    _, _, data = servers
    for path in [*data.iterdir(), *data.parent.glob("*.log")]:
        text = path.read_bytes()
        assert UPSTREAM.encode() not in text and RECORDER.encode() not in text, path


def test_sigkill_mid_traffic_loses_no_acknowledged_trace_or_reward_and_doubles_none(servers, tmp_path):
    from whileai.record.store import RecordStore

    policy, _, _ = servers
    data = tmp_path / "data"
    recorder = Started(["record", "--upstream", policy.url, "--data-dir", str(data), "--upstream-key", UPSTREAM],
                       tmp_path).start()
    acked: dict[str, float] = {}
    stop = threading.Event()

    def traffic():
        k = 0
        while not stop.is_set():
            k += 1
            try:
                raw = client(recorder).completions.with_raw_response.create(model=MODEL, prompt=f"p{k}", max_tokens=4)
                trace_id = raw.headers["x-whileai-trace-id"]
                acked[trace_id] = float("nan")
                rewarded = httpx.post(f"{recorder.url}/v1/rewards", headers=recorder.headers,
                                      json={"trace_id": trace_id, "reward": k})
                if rewarded.status_code == 200:
                    acked[trace_id] = float(k)
            except (openai.APIError, httpx.HTTPError):
                return

    worker = threading.Thread(target=traffic)
    worker.start()
    while len(acked) < 8 and worker.is_alive():
        worker.join(0.05)
    assert len(acked) >= 8, recorder.log.read_text()
    recorder.kill()
    stop.set()
    worker.join()
    recorder.start()
    try:
        store = RecordStore(data)
        traces = {t["id"]: t for t in store.traces()}
        for trace_id, reward in acked.items():
            assert trace_id in traces
            assert np.isnan(reward) or traces[trace_id]["reward"] == reward
        counts = store.rows("SELECT trace_id, COUNT(*) AS n FROM exchanges GROUP BY trace_id")
        assert all(c["n"] == 1 for c in counts)
        raw = client(recorder).completions.with_raw_response.create(model=MODEL, prompt="after", max_tokens=2)
        assert raw.headers["x-whileai-trace-id"] not in acked
    finally:
        recorder.stop()
