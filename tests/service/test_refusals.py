"""Every refusal has its status and a message naming what was wrong, and the server keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from whileai.engine import make_datum
from whileai.errors import BatchError, ConfigError
from whileai.service import Client, ServiceError, require_advertised_loss
from whileai.service.launch import LocalServer

DATUM = make_datum([1, 72, 105], [33, 2])


def _post(server: LocalServer, path: str, body: object, token: str | None = None, raw: bytes | None = None):
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(f"{server.url}/v1/training{path}", content=content, headers=headers, timeout=30)


def _error(response: httpx.Response) -> str:
    return response.json()["error"]["message"]


@pytest.fixture(scope="module")
def run(service: LocalServer):
    with Client(service.url, service.token) as client:
        yield client.create_session().create_run("builtin:tiny")


def _still_serves(run) -> None:
    before = run.step
    run.forward_backward([DATUM], "cross_entropy")
    run.optim_step({"learning_rate": 1e-3})
    assert run.step == before + 1


def test_no_token_and_a_wrong_token_get_401(service: LocalServer, run):
    for token, words in ((None, "no bearer token"), ("not-a-token-of-this-server", "not accepted")):
        response = _post(service, f"/runs/{run.id}/noop", {"seq_id": run.next_seq}, token)
        assert response.status_code == 401 and words in _error(response) and "Bearer" in _error(response)
    assert httpx.get(f"{service.url}/v1/training/capabilities").status_code == 401
    _still_serves(run)


def test_another_tokens_session_and_run_are_404(service: LocalServer, run):
    other = Client(service.url, service.other_token)  # type: ignore[attr-defined]
    with pytest.raises(ServiceError) as err:
        other.run(run.id)
    assert err.value.status == 404 and run.id in err.value.message
    response = _post(service, f"/runs/{run.id}/noop", {"seq_id": run.next_seq}, service.other_token)  # type: ignore[attr-defined]
    assert response.status_code == 404
    own = Client(service.url, service.token).sessions()
    assert all(s.id not in {x.id for x in other.sessions()} for s in own)  # neither sees the other's
    with pytest.raises(ServiceError) as err:
        other.session(own[0].id).create_run("builtin:tiny")
    assert err.value.status == 404
    _still_serves(run)


def test_an_oversized_body_and_too_many_datums_get_413(service: LocalServer, run):
    big = b'{"seq_id": 0, "data": [' + b" " * (3 * 2**20) + b"]}"  # the test server's limit is 2 MiB
    response = _post(service, f"/runs/{run.id}/forward", None, service.token, raw=big)
    assert response.status_code == 413 and "limit is 2097152" in _error(response)
    with pytest.raises(ServiceError) as err:
        run.forward([DATUM] * 257, "cross_entropy")  # --max-datums 256
    assert err.value.status == 413 and "257 datums" in err.value.message and "--max-datums" in err.value.message
    _still_serves(run)  # a refusal before its turn does not use up the sequence number


def test_a_malformed_body_gets_422_naming_the_field(service: LocalServer, run):
    cases = [({"seq_id": run.next_seq, "data": "nope", "loss_function": "cross_entropy"}, "data"),
             ({"seq_id": -1}, "seq_id"),
             ({"seq_id": run.next_seq, "data": [], "loss_function": "cross_entropy", "loss_fn": "x"}, "loss_fn"),
             ({"data": [], "loss_function": "cross_entropy"}, "seq_id")]
    for body, field in cases:
        response = _post(service, f"/runs/{run.id}/forward_backward", body, service.token)
        assert response.status_code == 422, body
        assert f"{field}:" in _error(response), _error(response)
    response = _post(service, f"/runs/{run.id}/forward", None, service.token, raw=b"{not json")
    assert response.status_code == 422 and "malformed" in _error(response)
    response = _post(service, f"/runs/{run.id}/train", {"seq_id": run.next_seq}, service.token)
    assert response.status_code == 404 and "no operation 'train'; the operations are forward_backward" in _error(response)
    _still_serves(run)


def test_an_unknown_loss_or_config_key_gets_400_listing_the_valid_ones(service: LocalServer, run):
    with pytest.raises(ConfigError) as err:
        run.forward_backward([DATUM], "ppo2")
    assert err.value.status == 400 and "ppo2" in str(err.value) and "cispo" in str(err.value)  # type: ignore[attr-defined]
    with pytest.raises(ConfigError) as err:
        run.forward_backward([DATUM], "ppo", {"clip_epsilon": 0.2})
    assert "clip_epsilon" in str(err.value) and "clip_low_threshold, clip_high_threshold" in str(err.value)
    with pytest.raises(BatchError) as err:  # the engine's own checks name the datum
        run.forward_backward([{"model_input": [1, 99999], "loss_fn_inputs": {"target_tokens": [2, 3],
                                                                             "weights": [1, 1]}}], "cross_entropy")
    assert "datum 0" in str(err.value) and "99999" in str(err.value)
    _still_serves(run)


def test_require_advertised_loss_fails_before_any_work(client: Client):
    caps = client.capabilities()
    assert require_advertised_loss(caps, "sapo")["config"]["tau_pos"]["default"] == 1.0
    with pytest.raises(ConfigError, match="not advertised.*cross_entropy"):
        require_advertised_loss(caps, "grpo_dual_clip")
    with pytest.raises(ConfigError, match="takes no config key.*valid keys: delta_low"):
        require_advertised_loss(caps, "dppo", {"clip_low_threshold": 0.8})


def test_a_failing_operation_on_one_run_never_disturbs_another(client: Client):
    session = client.create_session()
    good, bad = session.create_run("builtin:tiny", seed=1), session.create_run("builtin:tiny", seed=1)
    with pytest.raises(ServiceError):
        bad.optim_step({"learning_rate": -1.0})
    good.forward_backward([DATUM], "cross_entropy")
    bad.forward_backward([DATUM], "cross_entropy")
    assert float(good.optim_step()) == pytest.approx(float(bad.optim_step()), rel=1e-6)
    assert good.step == bad.step == 1
    assert [h["status"] for h in bad.history()] == [400, 200, 200]


def test_a_closed_session_frees_its_runs(client: Client):
    session = client.create_session()
    run = session.create_run("builtin:tiny")
    run.save_weights_for_sampler()
    session.close()
    with pytest.raises(ServiceError) as err:
        run.save_weights_for_sampler()
    assert err.value.status == 409 and "session was closed" in err.value.message
    assert session.id not in {s.id for s in client.sessions()}
    assert client.run(run.id).info()["status"] == "closed"


def test_an_unknown_model_is_refused_listing_the_served_ones(client: Client):
    with pytest.raises(ConfigError, match="builtin:tiny"):
        client.create_session().create_run("builtin:huge")
    with pytest.raises(ServiceError) as err:
        client.create_session().create_run("builtin:tiny", kind="value")
    assert err.value.status == 422 and "kind" in err.value.message
