"""Fast checks without servers: the byte model's text codec and template, request checks, the store, rewards
and the export's refusals (real SQLite in a temporary folder)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from whileai.engine.models import byte_tokenizer
from whileai.record import chat
from whileai.record.exchange import Sampled, continued_key, conversation_key, strip, widen
from whileai.record.export import export, plain, trace_row
from whileai.record.requests import RequestError, parse_ask
from whileai.record.rewards import check_reward
from whileai.record.store import AlreadyScored, RecordStore, UnknownTrace

TOK = byte_tokenizer()


def test_every_byte_sequence_survives_decode_then_encode():
    """Random ids (invalid UTF-8, specials mid-text) map back to themselves: the reply a client echoes
    re-renders as the tokens the model wrote."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        ids = rng.integers(0, 259, size=int(rng.integers(1, 30))).tolist()
        ids = [i for i in ids if i != 2]  # EOS ends a reply, it is never inside one
        assert chat.encode(TOK, chat.decode(TOK, ids)) == ids
    assert chat.decode(TOK, [3 + 0xC3, 3 + 0xA9]) == "é"  # valid UTF-8 reads as text
    assert chat.decode(TOK, [3 + 0xFF]) == chr(chat.ESCAPE + 0xFF)


def test_built_in_template_by_hand():
    """bos, 'user: hi\\n', 'assistant: ' + reply + eos + '\\n', 'tool: 4\\n', then the generation prompt."""
    ids = chat.render(TOK, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                            {"role": "tool", "content": "4", "tool_call_id": "c"}])
    assert ids[0] == 1
    text = chat.decode(TOK, ids[1:])
    assert text == "user: hi\nassistant: yo<|eos|>\ntool: 4\nassistant: "
    first = chat.render(TOK, [{"role": "user", "content": "hi"}])
    assert ids[:len(first) + 2] == first + chat.encode(TOK, "yo")  # a follow-up begins with prompt + reply


def test_request_problems_are_listed_together_and_unknown_fields_refused():
    with pytest.raises(RequestError) as err:
        parse_ask({"prompt": "x", "temperature": -1, "logit_bias": {"1": 5}, "presence_penalty": 0.5}, False, "m")
    message = str(err.value)
    assert "'logit_bias'" in message and "'temperature' is -1" in message and "presence_penalty" in message
    with pytest.raises(RequestError) as err:
        parse_ask({"model": "other", "prompt": "x"}, False, "m")
    assert err.value.status == 404 and "serves 'm'" in str(err.value)
    ask = parse_ask({"messages": [{"role": "user", "content": "a"}], "logprobs": True, "top_k": -1}, True, "m")
    assert (ask.logprobs, ask.top_k, ask.max_tokens, ask.temperature) == (0, 0, 16, 1.0)


def test_widen_then_strip_gives_the_client_what_it_asked_for():
    body = {"messages": [], "max_tokens": 3}
    assert widen(body, chat=True) == {**body, "logprobs": True, "return_token_ids": True}
    assert widen({"prompt": "a", "logprobs": 3}, chat=False)["logprobs"] == 3
    reply = {"prompt_token_ids": [1], "choices": [{"token_ids": [5], "logprobs": {"content": []}, "message": {}}]}
    assert strip(reply, body, chat=True) == {"choices": [{"logprobs": None, "message": {}}]}
    asked = {"prompt": "a", "logprobs": 0, "return_token_ids": True}
    kept = {"choices": [{"token_ids": [5], "prompt_token_ids": [1], "logprobs": {"token_logprobs": [-1.0]}}]}
    assert strip(json.loads(json.dumps(kept)), asked, chat=False) == kept


def test_conversation_key_ignores_nulls_a_client_adds():
    reply = {"role": "assistant", "content": "yo"}
    echoed = {"role": "assistant", "content": "yo", "tool_calls": None, "refusal": None, "audio": None}
    user = {"role": "user", "content": "hi"}
    assert continued_key([user, echoed, {"role": "user", "content": "more"}]) == conversation_key([user, reply])
    assert continued_key([user]) is None


def test_sampled_reads_token_ids_written_as_text_and_names_missing_logprobs():
    s = Sampled()
    s.add({"logprobs": {"tokens": ["token_id:7", "token_id:8"], "token_logprobs": [-1.0, -0.5]}, "text": "ab"},
          False, [1, 2])
    assert s.ids() == [7, 8] and s.problem() is None
    bare = Sampled()
    bare.add({"token_ids": [7], "text": "a"}, False, [1])
    assert "no log-probabilities" in (bare.problem() or "")
    short = Sampled()
    short.add({"token_ids": [7, 8], "logprobs": {"tokens": ["a"], "token_logprobs": [-1.0]}}, False, [1])
    assert "do not line up" in (short.problem() or "")


def test_rewards_are_checked_then_scored_once(tmp_path):
    assert "finite" in str(check_reward({"trace_id": "t", "reward": math.nan}))
    assert "unknown field 'score'" in str(check_reward({"trace_id": "t", "reward": 1, "score": 1}))
    assert "finite" in str(check_reward({"trace_id": "t", "reward": True}))
    store = RecordStore(tmp_path)
    store.add_exchange("t1", None, _exchange())
    with pytest.raises(UnknownTrace):
        store.score("nope", 1.0, False)
    assert store.score("t1", 0.5, False) is None
    with pytest.raises(AlreadyScored):
        store.score("t1", 1.0, False)
    assert store.score("t1", 1.0, True) == 0.5


def _exchange(**over):
    base = {"endpoint": "chat", "model": "m", "weights_version": "v1", "logprobs_mode": "processed_logprobs",
            "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": 20}, "prompt_ids": [1, 5],
            "completion_ids": [6, 7], "logprobs": [-0.5, -0.25], "finish_reason": "stop",
            "conversation_key": None, "problem": None}
    return {**base, **over}


def test_a_threaded_trace_exports_with_observations_masked(tmp_path):
    """Turn 1: prompt [1, 5], reply [6, 7]. Turn 2's prompt [1, 5, 6, 7, 9, 9] adds two observation tokens
    [9, 9] (behavior 0.0, mask false); its reply [8] is an action."""
    store = RecordStore(tmp_path)
    first = store.add_exchange("t", None, _exchange())
    store.add_exchange("t", first, _exchange(prompt_ids=[1, 5, 6, 7, 9, 9], completion_ids=[8], logprobs=[-1.0]))
    row = trace_row({**store.trace("t"), "reward": 1.0})
    assert isinstance(row, dict)
    assert row["prompt_tokens"] == [1, 5] and row["tokens"] == [6, 7, 9, 9, 8]
    assert row["behavior_logprobs"] == [-0.5, -0.25, 0.0, 0.0, -1.0]
    assert row["action_mask"] == [True, True, False, False, True]


def test_export_leaves_out_unscored_and_refuses_raw_and_broken_traces(tmp_path):
    store = RecordStore(tmp_path)
    store.add_exchange("good", None, _exchange())
    store.add_exchange("unscored", None, _exchange())
    store.add_exchange("raw", None, _exchange(logprobs_mode="raw_logprobs"))
    store.add_exchange("raw-plain", None, _exchange(logprobs_mode="raw_logprobs",
                                                    sampling={"temperature": 1, "top_p": 1, "top_k": -1}))
    store.add_exchange("broken", None, _exchange(problem="the upstream returned no log-probabilities"))
    for trace in ("good", "raw", "raw-plain", "broken"):
        store.score(trace, 1.0, False)
    store.close()
    report = export(tmp_path, tmp_path / "out.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in rows) == ["good", "raw-plain"]
    assert (report.written, report.unscored, sorted(report.refused)) == (2, 1, ["broken", "raw"])
    assert report.raw_by_model == {"m": 1} and "processed_logprobs" in str(report)
    assert plain({"temperature": 1, "top_p": 1, "top_k": 0}) and not plain({"temperature": None, "top_p": 1,
                                                                              "top_k": 0})
    assert plain({"temperature": 1, "top_p": 1, "top_k": -1, "presence_penalty": 0})
    assert not plain({"temperature": 1, "top_p": 1, "top_k": -1, "min_p": 0.05})


def test_an_upstream_that_reports_nothing_gets_the_requests_shaping_knobs_recorded():
    from whileai.record.proxy import _requested_sampling

    body = {"messages": [], "temperature": 0.5, "min_p": 0.1, "presence_penalty": None, "max_tokens": 9}
    assert _requested_sampling(body) == {"temperature": 0.5, "top_p": None, "top_k": None, "min_p": 0.1}


def test_export_filters_by_model_and_time(tmp_path):
    import time

    store = RecordStore(tmp_path)
    store.add_exchange("old", None, _exchange(model="a"))
    store.score("old", 1.0, False)
    cut = time.time()
    time.sleep(0.01)
    store.add_exchange("new-a", None, _exchange(model="a"))
    store.add_exchange("new-b", None, _exchange(model="b"))
    for trace in ("new-a", "new-b"):
        store.score(trace, 1.0, False)
    store.close()
    export(tmp_path, tmp_path / "out.jsonl", since=cut, model="a")
    assert [json.loads(line)["task_id"] for line in (tmp_path / "out.jsonl").read_text().splitlines()] == ["new-a"]


def test_a_follow_up_continues_only_an_open_tip_and_otherwise_forks(tmp_path):
    """Turn 1 (prompt [1, 5], reply [6, 7]) is recorded under key K. A follow-up whose prompt begins with
    [1, 5, 6, 7] continues trace t; once t is scored, the same follow-up forks a new trace whose parent is
    turn 1; a prompt that does not begin with turn 1's tokens starts from nothing."""
    from whileai.record.proxy import RecordConfig, Recorder

    recorder = Recorder(RecordConfig(upstream="http://127.0.0.1:9", data_dir=tmp_path))
    user, reply = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}
    first = recorder.store.add_exchange("t", None, _exchange(conversation_key=conversation_key([user, reply])))
    body = {"messages": [user, reply, {"role": "tool", "content": "4"}]}
    assert recorder.thread(body, True, [1, 5, 6, 7, 9]) == ("t", first)
    trace_id, parent = recorder.thread(body, True, [1, 5, 6, 7, 9])  # t is claimed by the request in flight
    assert trace_id != "t" and parent == first
    recorder.release("t")
    recorder.store.score("t", 1.0, False)
    trace_id, parent = recorder.thread(body, True, [1, 5, 6, 7, 9])
    assert trace_id != "t" and parent == first
    trace_id, parent = recorder.thread(body, True, [1, 5, 6, 8, 9])  # re-rendered differently
    assert trace_id != "t" and parent is None
