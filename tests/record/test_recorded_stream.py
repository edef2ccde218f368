"""The recorder's export stream and the trainer's side of it, against a real `wai record` process (its
upstream is never asked: the traces are written into its database, as its own requests would be)."""

from __future__ import annotations

import http.server
import sqlite3
import threading
import time

import httpx
import pytest

from whileai.engine.models import byte_tokenizer
from whileai.loop.sources.recorder import Recorded, RecorderError, RecorderFeed
from whileai.loop.sources.trace_formats import Vocab
from whileai.loop.types import LagQueue, LoopState
from whileai.record.launch import Started
from whileai.record.store import RecordStore
from whileai.service.launch import free_port

TOK = byte_tokenizer()
VOCAB = Vocab(TOK, len(TOK), 2**31)


def _exchange(version="v1", **over):
    base = {"endpoint": "completions", "model": "policy", "weights_version": version,
            "logprobs_mode": "processed_logprobs", "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0},
            "prompt_ids": [1, 5], "completion_ids": [6, 7], "logprobs": [-0.5, -0.25], "finish_reason": "stop",
            "conversation_key": None, "problem": None}
    return {**base, **over}


@pytest.fixture(scope="module")
def recorder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recorder")
    with Started(["record", "--upstream", f"http://127.0.0.1:{free_port()}", "--data-dir", str(folder / "data")],
                 folder) as started:
        yield started, RecordStore(folder / "data")


def _fresh(store, names, version="v1"):
    """New traces under names unique to the test (the module shares one recorder)."""
    for name in names:
        store.add_exchange(name, None, _exchange(version))


def _top(store):
    return int(store.rows("SELECT COALESCE(MAX(scored_seq), 0) AS m FROM traces")[0]["m"])


def test_the_stream_hands_out_each_scored_trace_once_in_the_order_scored(recorder):
    started, store = recorder
    _fresh(store, ["a1", "a2", "a3", "a4", "a5"])
    base = _top(store)
    for name in ("a3", "a1", "a4"):
        store.score(name, 1.0, False)
    feed = RecorderFeed(started.url)
    first = feed.after(base, 2)
    assert [r["task_id"] for r in first["rows"]] == ["a3", "a1"]
    assert [r["scored_seq"] for r in first["rows"]] == [base + 1, base + 2] and first["cursor"] == base + 2
    assert first["rows"][0]["weights_version"] == "v1" and first["rows"][0]["tokens"] == [6, 7]
    second = feed.after(first["cursor"], 10)
    assert [r["task_id"] for r in second["rows"]] == ["a4"] and second["cursor"] == base + 3
    assert second["unscored"] >= 2  # a2, a5
    store.score("a1", 0.0, True)  # a replaced score keeps its place: a reader past it does not see it again
    assert feed.after(second["cursor"], 10)["rows"] == []
    store.score("a2", 1.0, False)
    third = feed.after(second["cursor"], 10)
    assert [(r["task_id"], r["scored_seq"]) for r in third["rows"]] == [("a2", base + 4)]
    assert feed.after(base, 10)["rows"][1]["reward"] == 0.0  # read from the start again: the new score


def test_bad_cursor_or_limit_is_a_422_naming_both(recorder):
    started, _ = recorder
    for query in ("after=-1", "after=x", "limit=0", "limit=5000"):
        reply = httpx.get(f"{started.url}/v1/export?{query}", headers=started.headers)
        assert reply.status_code == 422 and "'after' must be an integer" in reply.text, query


def test_an_untrainable_trace_is_passed_with_its_reason_and_the_cursor_moves_past_it(recorder):
    started, store = recorder
    store.add_exchange("b1", None, _exchange(problem="the upstream returned no log-probabilities"))
    _fresh(store, ["b2"])
    base = _top(store)
    store.score("b1", 1.0, False)
    store.score("b2", 1.0, False)
    answer = RecorderFeed(started.url).after(base, 10)
    assert [r["task_id"] for r in answer["rows"]] == ["b2"] and answer["cursor"] == base + 2
    assert answer["refused"] == [{"trace_id": "b1", "scored_seq": base + 1,
                                  "reason": f"exchange {store.trace('b1')['tip']}: the upstream returned no "
                                            "log-probabilities"}]


def _source(url, size, state, versions, stops):
    return Recorded(RecorderFeed(url), size, VOCAB, state, lambda text: None, lambda: stops.append(1),
                    versions.get)


def test_a_batch_waits_for_enough_scored_traces_then_the_cursor_moves_by_exactly_it(recorder):
    started, store = recorder
    _fresh(store, ["c1", "c2", "c3"], version="policy@sha256:aa")
    base = _top(store)
    state, stops = LoopState(source={"cursor": base}), []
    source = _source(started.url, 3, state, {"policy@sha256:aa": 4}, stops)
    store.score("c1", 1.0, False)
    store.score("c2", 0.0, False)
    threading.Timer(2.5, store.score, ("c3", 1.0, False)).start()  # the grader's late score
    began = time.perf_counter()
    batch = source.next(0, LagQueue(0, []))
    assert time.perf_counter() - began > 2 and len(stops) >= 2  # it waited, asking to stop at each poll
    assert [r["task_id"] for r in batch] == ["c1", "c2", "c3"] and [r["reward"] for r in batch] == [1.0, 0.0, 1.0]
    assert source.seqs == [base + 1, base + 2, base + 3] and state.source == {"cursor": base + 3}
    assert all(r["sampler_step"] == 4 for r in batch)  # the step that pushed the version that served it
    assert batch[0]["behavior_logprobs"] == [-0.5, -0.25] and batch[0]["sampling"]["temperature"] == 1.0
    assert source.rescore(batch, 0)


def test_a_stop_while_waiting_leaves_the_cursor_where_the_last_batch_ended(recorder):
    started, store = recorder
    _fresh(store, ["d1", "d2"], version="served-by-someone-else")
    base = _top(store)
    store.score("d1", 1.0, False)
    state = LoopState(source={"cursor": base})

    class Stopped(Exception):
        pass

    def stop():
        raise Stopped

    source = Recorded(RecorderFeed(started.url), 2, VOCAB, state, lambda text: None, stop, {}.get)
    with pytest.raises(Stopped):
        source.next(0, LagQueue(0, []))
    assert state.source == {"cursor": base}  # d1 was read but not trained: a resumed run reads it again
    store.score("d2", 1.0, False)
    batch = _source(started.url, 2, state, {}, []).next(0, LagQueue(0, []))
    assert [r["task_id"] for r in batch] == ["d1", "d2"] and "sampler_step" not in batch[0]  # an unknown version


def test_a_database_from_before_the_stream_gets_its_scored_traces_numbered_by_score_time(tmp_path):
    db = sqlite3.connect(tmp_path / "record.db")
    db.executescript("CREATE TABLE traces (id TEXT PRIMARY KEY, tip INTEGER NOT NULL, model TEXT, created REAL NOT "
                     "NULL, updated REAL NOT NULL, reward REAL, scored REAL);"
                     "INSERT INTO traces VALUES ('late', 1, 'm', 0, 0, 1.0, 20.0), ('early', 2, 'm', 0, 0, 0.0, 10.0),"
                     " ('open', 3, 'm', 0, 0, NULL, NULL);")
    db.commit()
    db.close()
    store = RecordStore(tmp_path)
    assert [(t["id"], t["scored_seq"]) for t in store.scored_after(0, 10)] == [("early", 1), ("late", 2)]
    store.add_exchange("open", None, _exchange())
    store.score("open", 1.0, False)
    assert store.scored_after(2, 10)[0]["id"] == "open" and store.scored_after(2, 10)[0]["scored_seq"] == 3


def test_the_feed_names_what_is_wrong_with_the_address(tmp_path):
    with pytest.raises(RecorderError, match="no recorder answers at"):
        RecorderFeed(f"http://127.0.0.1:{free_port()}").after(0, 1)

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RecorderError, match="no /v1/export route"):
            RecorderFeed(f"http://127.0.0.1:{server.server_port}/v1").after(0, 1)
    finally:
        server.shutdown()


def test_an_adapter_replaced_in_place_keeps_answering_requests_for_its_name(tmp_path):
    """Clients ask for model='policy' while the trainer reloads it in place after each step: no request may
    find the name missing (a 404) between the unload and the load; each answer names one of the pushed
    versions, and the last push's from then on."""
    from whileai.engine import TrainingEngine
    from whileai.engine.datums import make_datum
    from whileai.loop.sources.server_sampler import ServerSampler, write_weights

    engine = TrainingEngine("builtin:tiny", lora_rank=4)
    with Started(["policy", "builtin:tiny", "--threads", "1"], tmp_path) as policy:
        sampler = ServerSampler(policy.url, model="builtin:tiny")
        versions = [sampler.push_lora(write_weights(engine, tmp_path / "w0"), "policy")]
        failures, seen, done = [], set(), threading.Event()

        def ask():
            with httpx.Client(base_url=policy.url, timeout=60, headers=policy.headers) as http:
                while not done.is_set():
                    reply = http.post("/v1/completions", json={"model": "policy", "prompt": [1, 72], "max_tokens": 2})
                    if reply.status_code != 200:
                        failures.append(reply.text)
                    seen.add(reply.headers.get("x-whileai-weights-version"))

        asker = threading.Thread(target=ask)
        asker.start()
        try:
            for k in range(1, 6):
                engine.forward_backward([make_datum([1, 72, 105], [32, 119, 111])], "cross_entropy")
                engine.optim_step({"learning_rate": 1e-2})
                versions.append(sampler.push_lora(write_weights(engine, tmp_path / f"w{k}"), "policy"))
        finally:
            done.set()
            asker.join()
        last = httpx.post(f"{policy.url}/v1/completions", headers=policy.headers, json={"model": "policy", "prompt": [1], "max_tokens": 1})
    assert failures == [] and len(set(versions)) == 6
    assert seen <= set(versions) and len(seen) >= 2
    assert last.headers["x-whileai-weights-version"] == versions[-1]


def test_what_a_run_from_a_recorder_cannot_do_is_refused_with_the_reason():
    from whileai.errors import ConfigError
    from whileai.loop.run import dry_run

    with pytest.raises(ConfigError) as err:
        dry_run(rows_from="127.0.0.1:8400", lag=2, url="http://127.0.0.1:8321", method="grpo")
    message = str(err.value)
    assert "give the recorder's URL" in message and "rows_from needs sampler_url" in message
    assert "lag = 2: lag does not apply" in message and "drop --url" in message
    assert "only a one-try RL method" in message
    with pytest.raises(ConfigError, match="drop --taskset"):
        dry_run(rows_from="http://127.0.0.1:8400", sampler_url="http://127.0.0.1:8300", taskset="builtin:case")
    plan = dry_run(rows_from="http://127.0.0.1:8400", sampler_url="http://127.0.0.1:8300", sync_every=3)
    assert (plan.lag, plan.sync_every) == (0, 3)  # the taskset default is dropped; sync_every is free of the lag


def test_a_row_the_trainers_checks_refuse_is_passed_with_its_reason_not_trained(recorder):
    """Traffic of another model (a token id past this vocabulary) is passed like an untrainable trace: the
    batch fills with the next ones and the cursor moves past it."""
    started, store = recorder
    store.add_exchange("e1", None, _exchange(completion_ids=[6, 70_000]))
    _fresh(store, ["e2"])
    base = _top(store)
    store.score("e1", 1.0, False)
    store.score("e2", 1.0, False)
    state = LoopState(source={"cursor": base})
    source = _source(started.url, 1, state, {}, [])
    batch = source.next(0, LagQueue(0, []))
    assert [r["task_id"] for r in batch] == ["e2"] and source.seqs == [base + 2]
    assert state.source == {"cursor": base + 2}
    (refused,) = source.refused
    assert (refused["trace_id"], refused["scored_seq"]) == ("e1", base + 1) and "70000" in refused["reason"]
