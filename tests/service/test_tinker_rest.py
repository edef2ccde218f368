"""The Tinker SDK's RestClient, session and futures-poller calls against a `wai serve` subprocess.

Each answer is checked against what the server holds: checkpoint sizes against the files on disk, TTLs against
the time they were set, deletion against the folder, a session's finish reason against the first one sent.
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

tinker = pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
from tinker import types  # noqa: E402

from whileai.service.launch import LocalServer  # noqa: E402

PROMPT = [1, 57, 46, 54, 64]
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


def rest_of(server: LocalServer) -> Any:
    return tinker.RestClient(base_url=server.url, api_key=server.token)


def http_of(server: LocalServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"X-API-Key": server.token}, timeout=60)


def folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def test_runs_sessions_and_checkpoints_with_sizes_ttls_and_deletion(sdk: Any, tml_server: LocalServer) -> None:
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4,
                                               user_metadata={"renderer_name": "role_colon"}).result()
    state = training.save_state("a").result(timeout=60).path
    sampler_path = training.save_weights_for_sampler("s").result(timeout=60).path
    rest = rest_of(tml_server)
    session_id = sdk.holder.get_session_id()
    assert session_id in rest.list_sessions(limit=1000).result(timeout=30).sessions
    assert training.model_id in rest.get_session(session_id).result(timeout=30).training_run_ids
    runs = rest.list_training_runs(limit=1000).result(timeout=30)
    listed = {r.training_run_id: r for r in runs.training_runs}
    assert listed[training.model_id].lora_rank == 4 and runs.cursor.total_count == len(runs.training_runs)
    assert listed[training.model_id].last_sampler_checkpoint.tinker_path == sampler_path

    on_disk = Path(tml_server.data_dir) / "runs" / training.model_id / "states" / "a"
    checkpoints = {c.tinker_path: c for c in rest.list_checkpoints(training.model_id).result(timeout=30).checkpoints}
    assert (checkpoints[state].checkpoint_type, checkpoints[state].size_bytes) == ("training", folder_size(on_disk))
    assert (checkpoints[sampler_path].checkpoint_type, checkpoints[sampler_path].size_bytes) == ("sampler", None)
    assert checkpoints[state].expires_at is None
    mine = {c.tinker_path for c in rest.list_user_checkpoints(limit=1000).result(timeout=30).checkpoints}
    assert {state, sampler_path} <= mine
    info = rest.get_weights_info_by_tinker_path(state).result(timeout=30)
    assert (info.base_model, info.is_lora, info.lora_rank) == ("builtin:tiny", True, 4)
    usage = tinker.AdminClient(base_url=tml_server.url, api_key=tml_server.token)\
        .get_current_checkpoint_storage_usage().result(timeout=30)
    all_states = sum(folder_size(f) for f in (Path(tml_server.data_dir) / "runs").glob("*/states/*"))
    assert usage.data[0].size_bytes == all_states and usage.data[0].checkpoint_count >= 2

    before = time.time()
    rest.set_checkpoint_ttl_from_tinker_path(state, 3600).result(timeout=30)
    expires = {c.tinker_path: c for c in rest.list_checkpoints(training.model_id).result(timeout=30).checkpoints}[
        state].expires_at
    assert before + 3600 - 1 <= expires.timestamp() <= time.time() + 3600 + 1
    rest.set_checkpoint_ttl_from_tinker_path(state, None).result(timeout=30)

    rest.delete_checkpoint_from_tinker_path(state).result(timeout=30)
    assert not on_disk.exists()
    assert state not in {c.tinker_path for c in rest.list_checkpoints(training.model_id).result(timeout=30).checkpoints}
    with pytest.raises(tinker.NotFoundError, match="no checkpoint 'weights/a'"):
        rest.delete_checkpoint_from_tinker_path(state).result(timeout=30)


def test_a_checkpoint_whose_ttl_passed_is_deleted(sdk: Any, tml_server: LocalServer) -> None:
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4).result()
    state = training.save_state("short").result(timeout=60).path
    http = http_of(tml_server)
    answer = http.put(f"/api/v1/training_runs/{training.model_id}/checkpoints/weights/short/ttl",
                      json={"ttl_seconds": 1})
    assert answer.status_code == 200, answer.text
    time.sleep(1.5)
    rest = rest_of(tml_server)
    assert state not in {c.tinker_path for c in rest.list_checkpoints(training.model_id).result(timeout=30).checkpoints}
    assert not (Path(tml_server.data_dir) / "runs" / training.model_id / "states" / "short").exists()
    refused = http.put(f"/api/v1/training_runs/{training.model_id}/checkpoints/weights/short/ttl",
                       json={"ttl_seconds": 0})
    assert refused.status_code == 400 and "ttl_seconds=0 must be >= 1" in refused.json()["error"]


def test_finishing_a_session_is_first_wins_with_its_reason_checked(tml_server: LocalServer) -> None:
    client = tinker.ServiceClient(base_url=tml_server.url, api_key=tml_server.token, project_id="p1",
                                  display_name="nightly sweep", user_metadata={"team": "rl"})
    client.create_lora_training_client(base_model="builtin:tiny", rank=4).result()
    session_id = client.holder.get_session_id()
    session = rest_of(tml_server).get_session(session_id).result(timeout=30)
    assert (session.display_name, session.user_metadata) == ("nightly sweep", {"team": "rl"})
    http = http_of(tml_server)
    finish = f"/api/v1/sessions/{session_id}/finish"
    wrong = http.post(finish, json={"reason": {"type": "cancelled"}})
    assert wrong.status_code == 400 and "reason.type" in wrong.json()["error"]
    assert "'success', 'errored' or 'interrupted'" in wrong.json()["error"]
    client.close("success", detail="training complete").result(timeout=30)
    again = http.post(finish, json={"reason": {"type": "errored"}, "detail": "a retried close"})
    assert again.status_code == 200
    assert again.json()["status"] == {"type": "client_finished", "reason": {"type": "success"},
                                      "detail": "training complete"}
    assert again.json()["finished_at"] is not None
    found = rest_of(tml_server).search_sessions(types.SessionSearchRequest(
        session_id=session_id, statuses=[types.ClientFinishedSessionStatusQuery(reasons=["success"])])).result(30)
    assert [s.session_id for s in found.sessions] == [session_id]
    assert found.sessions[0].status.reason.type == "success" and found.sessions[0].project_id == "p1"
    search = rest_of(tml_server).search_sessions
    assert [s.session_id for s in search(types.SessionSearchRequest(display_name="SWEEP night", user_metadata={
        "team": "rl"})).result(30).sessions] == [session_id]
    assert search(types.SessionSearchRequest(session_id=session_id, project_ids=["other"])).result(30).sessions == []


def test_the_futures_poller_and_joined_clones_are_served(sdk: Any, tml_server: LocalServer) -> None:
    """client/config turns on the SDK's retrieve_futures poller and join_sampling_session; samples then complete
    through the poller, and each unpickled clone gets its own id (1, 2, ...), so their seq_ids never collide."""
    config = http_of(tml_server).post("/api/v1/client/config", json={}).json()
    assert config["sample_use_retrieve_futures"] and config["sample_join_sampling_session"]
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=3, seed=5)
    first = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, params).result(timeout=60)
    assert sampler._futures_poller is not None  # the SDK took the advertised route
    clones = [pickle.loads(pickle.dumps(sampler)) for _ in range(2)]
    answers = [c.sample(types.ModelInput.from_ints(PROMPT), 1, params).result(timeout=60) for c in clones]
    assert [c._cloned_sampler_id for c in clones] == [1, 2]
    assert [list(a.sequences[0].tokens) for a in answers] == [list(first.sequences[0].tokens)] * 2
    http = http_of(tml_server)
    polled = http.post("/api/v1/retrieve_futures", json={"target": {
        "sampling_session_id": sampler._sampling_session_id, "cloned_sampler_id": 7}, "timeout": 0}).json()
    assert polled == {"completions": [], "cursor": 0}
    request = types.SampleRequest(prompt=types.ModelInput.from_ints(PROMPT), sampling_params=params,
                                  sampling_session_id=sampler._sampling_session_id, seq_id=7 * 10**9)
    sent = [http.post("/api/v1/asample", json=request.model_dump(mode="json")).json() for _ in range(2)]  # a retry
    assert sent[0]["request_id"] == sent[1]["request_id"]
    target = {"sampling_session_id": sampler._sampling_session_id, "cloned_sampler_id": 7}
    polled = http.post("/api/v1/retrieve_futures", json={"target": target}).json()
    assert polled == {"completions": [{"state": "finished", "request_id": sent[0]["request_id"]}], "cursor": 1}
    assert http.post("/api/v1/retrieve_futures", json={"target": target, "prev_cursor": 1, "timeout": 0}).json() \
        == {"completions": [], "cursor": 1}


def test_unload_model_frees_the_run_and_keeps_its_states(sdk: Any, tml_server: LocalServer) -> None:
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4).result()
    state = training.save_state("kept").result(timeout=60).path
    http = http_of(tml_server)
    future = http.post("/api/v1/unload_model", json={"model_id": training.model_id}).json()
    done = types.UnloadModelResponse.model_validate(
        http.post("/api/v1/retrieve_future", json={"request_id": future["request_id"]}).json())
    assert done.model_id == training.model_id
    with pytest.raises(tinker.RequestFailedError, match="unloaded"):
        training.optim_step(types.AdamParams()).result(timeout=60)
    reloaded = sdk.create_training_client_from_state(state).result(timeout=60)
    assert reloaded.get_info().model_data.model_name == "builtin:tiny"


def test_features_wai_serve_cannot_offer_are_refused_by_name(sdk: Any, tml_server: LocalServer) -> None:
    rest = rest_of(tml_server)
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4).result()
    state = training.save_state("x").result(timeout=60).path
    for call, feature in [(lambda: rest.publish_checkpoint_from_tinker_path(state), "publishing a checkpoint"),
                          (lambda: rest.unpublish_checkpoint_from_tinker_path(state), "publishing a checkpoint"),
                          (lambda: rest.export_session_trace(sdk.holder.get_session_id()), "session trace export"),
                          (lambda: rest.assign_session_project(sdk.holder.get_session_id(), "p"), "projects"),
                          (lambda: rest.get_audit_log(), "the audit log"),
                          (lambda: rest.get_billing_usage("2026-01-01", "2026-02-01"), "billing usage"),
                          (lambda: rest.copy_weights(state, destination_project_id="p"), "copy_weights")]:
        with pytest.raises(tinker.BadRequestError, match=f"{feature} is not available on wai serve: "):
            call().result(timeout=30)
    with pytest.raises(tinker.BadRequestError, match="age_encryption_recipients .encryption. is not available"):
        training.save_weights_external("out", age_encryption_recipients=["age1xyz"]).result(timeout=30)
    answer = http_of(tml_server).post("/api/v1/no_such_route", json={})
    assert answer.status_code == 404 and "is not a Tinker route" in answer.json()["error"]


def test_external_weights_are_files_behind_expiring_signed_urls(sdk: Any, tml_server: LocalServer) -> None:
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4).result()
    path = training.save_weights_external("hf", ttl_seconds=7200).result(timeout=120).path
    assert path == f"tinker://{training.model_id}/external_weights/hf"
    folder = Path(tml_server.data_dir) / "runs" / training.model_id / "external" / "hf"
    assert (folder / "adapter_config.json").is_file()
    rest = rest_of(tml_server)
    signed = rest.get_external_weights_urls(path).result(timeout=30)
    on_disk = sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())
    assert sorted(signed.urls) == on_disk and 3500 < signed.expires.timestamp() - time.time() <= 3600
    for name, url in signed.urls.items():
        assert httpx.get(url, timeout=30).content == (folder / name).read_bytes()  # no api_key: the URL is the key
    tampered = signed.urls["adapter_config.json"].replace("signature=", "signature=0")
    assert httpx.get(tampered, timeout=30).status_code == 403
    listed = {c.tinker_path: c for c in rest.list_checkpoints(training.model_id).result(timeout=30).checkpoints}
    assert listed[path].checkpoint_type == "external" and listed[path].size_bytes == folder_size(folder)
    assert listed[path].expires_at is not None
    rest.delete_checkpoint_from_tinker_path(path).result(timeout=30)
    assert not folder.exists()


def test_save_options_are_honoured_or_refused_never_ignored(sdk: Any, tml_server: LocalServer) -> None:
    """ttl_seconds and user_metadata on a save show in the listing; a name already saved needs overwrite=True;
    another account's weights_access_token and an 'inflight' sampler are refused by name."""
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4).result()
    http = http_of(tml_server)

    def save(**fields: Any) -> Any:
        body = types.SaveWeightsRequest(model_id=training.model_id, seq_id=fields.pop("seq_id"), **fields)
        return http.post("/api/v1/save_weights", json=body.model_dump(mode="json", exclude_none=True))

    first = save(seq_id=100, path="t", ttl_seconds=3600, user_metadata={"step": "1"})
    assert first.status_code == 200, first.text
    http.post("/api/v1/retrieve_future", json={"request_id": first.json()["request_id"]})
    listed = {c.checkpoint_id: c for c in rest_of(tml_server).list_checkpoints(training.model_id).result(30).checkpoints}
    assert listed["weights/t"].user_metadata == {"step": "1"}
    assert 3590 < listed["weights/t"].expires_at.timestamp() - time.time() <= 3600
    assert save(seq_id=100, path="t", ttl_seconds=3600, user_metadata={"step": "1"}).json() == first.json()  # retry
    again = save(seq_id=101, path="t")
    assert again.status_code == 400 and "already has a state 't'; pick another name or pass overwrite=True" in again.text
    assert save(seq_id=101, path="t", overwrite=True).status_code == 200
    path = f"tinker://{training.model_id}/weights/t"
    with pytest.raises(tinker.BadRequestError, match="weights_access_token .reading another account's weights. is"):
        sdk.create_training_client_from_state(path, weights_access_token="tok").result(timeout=30)
    inflight = types.SaveWeightsForSamplerRequest(model_id=training.model_id, seq_id=102, path="live", kind="inflight")
    refused = http.post("/api/v1/save_weights_for_sampler", json=inflight.model_dump(mode="json"))
    assert refused.status_code == 400 and "kind='inflight'" in refused.text and "not available" in refused.text


def test_a_data_dir_from_before_sessions_kept_their_project_still_opens(tmp_path: Path) -> None:
    """tinker_sessions had no project_id column in the first version that made it; the column is added."""
    import sqlite3

    from whileai.service.store import Store
    from whileai.service.tinker_rest import Records

    old = sqlite3.connect(tmp_path / "service.db")
    old.execute("CREATE TABLE tinker_sessions (id TEXT PRIMARY KEY, display_name TEXT, user_metadata TEXT, "
                "reason TEXT, detail TEXT, finished REAL)")
    old.execute("INSERT INTO tinker_sessions VALUES ('session-old', 'before', NULL, 'success', NULL, 1.0)")
    old.commit()
    old.close()
    records = Records(Store(tmp_path))
    records.add_session("session-new", "after", None, "p1")
    assert records.session("session-old")["project_id"] is None and records.session("session-old")["reason"] == "success"
    assert records.session("session-new")["project_id"] == "p1"
