"""`wai train --url U --api tinker`: the loop on a Tinker-API server through the official SDK, and `--resume` of a
run over --url (either API).

The server is a real `wai serve` subprocess reached through its Tinker front (the SDK's own protocol). GRPO over
three steps ends with the in-process run's weights (the server's saved state against the local checkpoint) and
per-step metrics; every need a Tinker-API server cannot meet is refused before a session is opened; a run
stopped at step 2 and resumed to 4 ends with the weights of the uninterrupted 4-step run over --url; a state
the server no longer has is named, with what to do.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import whileai as wai
from whileai.service import Client
from whileai.service.launch import LocalServer, start_server
from whileai.trainers import Needs, refusals
from whileai.trainers.remote import Remote, remote_state, write_pointer
from whileai.trainers.tinker import _tinker_params

tinker = pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
pytestmark = pytest.mark.filterwarnings("ignore:DEPRECATED:FutureWarning")
# One prompt a step (8 rollouts of one task): a Tinker sample request carries one prompt, so only then does the
# server draw the in-process run's random stream (whileai.trainers.tinker_map.prompt_seed).
ONE_PROMPT = dict(method="grpo", knobs={"rollouts_per_prompt": 8}, steps=3, rollouts_per_step=8, warm_start_steps=0,
                  eval_tasks=0, progress=False, save_every=1000, export=False)
RESUMABLE = dict(method="grpo", knobs={"rollouts_per_prompt": 4}, rollouts_per_step=8, warm_start_steps=0, eval_tasks=0,
                 progress=False, save_every=2, lag=2, lr_schedule="constant")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    token = "tml-" + secrets.token_urlsafe(24)  # the SDK takes only keys that start with 'tml-'
    with start_server(tmp_path_factory.mktemp("tinker") / "data", token=token,
                      args=["--model", "builtin:tiny"]) as running:
        yield running


def weights_of(snapshot: Path) -> dict[str, np.ndarray]:
    """The trainable tensors of an engine snapshot (a folder with LATEST, or the snapshot itself)."""
    pointer = snapshot / "LATEST"
    folder = snapshot / pointer.read_text().strip() if pointer.is_file() else snapshot
    return load_file(str(folder / "weights.safetensors"))


def server_state(server: LocalServer, run_dir: Path) -> Path:
    """The folder on the server of the state the run's last checkpoint names."""
    saved = remote_state(run_dir / "checkpoint")
    assert saved is not None
    return server.data_dir / "runs" / saved["run"] / "states" / saved["name"]


def scored(server: LocalServer, path: str) -> np.ndarray:
    """The log-probabilities of 40 fixed tokens under the weights of the Tinker state at ``path``."""
    from tinker import types

    tokens = [1, *np.random.default_rng(0).integers(3, 130, size=40).tolist()]
    service = tinker.ServiceClient(base_url=server.url, api_key=server.token)
    try:
        training = service.create_training_client_from_state(path).result()
        datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
        out = training.forward([datum], "cross_entropy").result()
    finally:
        service.close("success").result()
    return np.asarray(out.loss_fn_outputs[0]["logprobs"].tolist())


def assert_same_weights(a: dict[str, np.ndarray], b: dict[str, np.ndarray], tol: float = 1e-5) -> None:
    assert sorted(a) == sorted(b)
    assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a) <= tol


def assert_same_metrics(mine: list[dict], theirs: list[dict]) -> None:
    assert len(mine) == len(theirs)
    for m, t in zip(mine, theirs, strict=True):
        for key in ("reward", "loss", "grad_norm", "drift"):
            assert m[key] == pytest.approx(t[key], rel=1e-4, abs=1e-6), (key, m, t)


# ----------------------------------------------------------------------------- no server
def test_refusals_name_what_a_tinker_api_server_cannot_do():
    """A Tinker server's capabilities: its loss names, no add_critic, its own distribution only; the export is its
    save_weights_external (a server that lists no export is refused with --no-export named)."""
    from whileai.trainers.tinker import OPERATIONS
    from whileai.trainers.tinker_map import tinker_losses

    caps = {"provider": "tinker", "models": ["builtin:tiny"], "operations": list(OPERATIONS),
            "losses": tinker_losses()}
    assert refusals(caps, "builtin:tiny", Needs(loss="ppo")) == []
    found = refusals(caps, "builtin:tiny", Needs(loss="sapo", critic=(1e-3, None), reference=True, export=True))
    assert len(found) == 3
    assert "'sapo', which it does not advertise" in found[0] and "ppo" in found[0]
    assert "no add_critic" in found[1]
    assert "a reference policy scored" in found[2] and "policy's own distribution only" in found[2]
    no_export = {**caps, "operations": [op for op in OPERATIONS if op != "export_lora"]}
    assert "add --no-export" in refusals(no_export, "builtin:tiny", Needs(loss="ppo", export=True))[0]
    assert refusals(caps, "builtin:tiny", Needs(loss="ppo", loss_config=("clip_low_threshold",))) == []
    keys = refusals(caps, "builtin:tiny", Needs(loss="gspo", loss_config=("clip_high_threshold",)))
    assert len(keys) == 1 and "config keys ['clip_high_threshold']" in keys[0] and "it takes: none" in keys[0]
    hot = refusals(caps, "builtin:tiny", Needs(own_distribution=False))
    assert len(hot) == 1 and "temperature=1" in hot[0]


def test_the_sdk_trainer_has_the_operations_the_loop_calls():
    from whileai.trainers import Trainer
    from whileai.trainers.tinker import TinkerTrainer

    assert isinstance(TinkerTrainer(None, "builtin:tiny"), Trainer)


def test_sampling_settings_become_tinkers():
    """No stop: None (Tinker's stop=[] would drop the EOS stop too); single ids and strings pass; a sequence of
    ids is refused, naming the way out."""
    assert _tinker_params({"max_tokens": 4, "stop": ()}) == {"max_tokens": 4}
    assert _tinker_params({"stop": ((7,), (9,))}) == {"stop": [7, 9]}
    assert _tinker_params({"stop": ("\n\n",)}) == {"stop": ["\n\n"]}
    with pytest.raises(wai.ConfigError, match="sequence of several ids.*drop --api tinker"):
        _tinker_params({"stop": ((7, 8),)})


def test_a_remote_checkpoint_is_a_snapshot_that_names_the_servers_state(tmp_path: Path):
    """Written as the engine writes one (LATEST -> step folder -> meta.json with the step), so the loop reads its
    step as it does an in-process one; the older pointer goes."""
    from whileai.loop.hooks.context import read_state

    folder = tmp_path / "run" / "checkpoint"
    for step in (2, 4):
        (folder).mkdir(parents=True, exist_ok=True)
        (folder / f"loop-{step:08d}.json").write_text(json.dumps({"step": step}))
        write_pointer(folder, Remote(api="wai", url=None, run="run-1", name=f"step-{step:08d}", path="p", step=step))
    assert remote_state(folder) == {"api": "wai", "url": None, "run": "run-1", "name": "step-00000004", "path": "p",
                                    "step": 4}
    assert read_state(tmp_path / "run").step == 4
    assert [p.name for p in folder.glob("step-*")] == ["step-00000004-remote"]


def test_an_api_without_a_url_and_an_in_process_checkpoint_over_url_are_refused(tmp_path: Path):
    from whileai.loop import dry_run
    from whileai.trainers.remote import remote_checkpoint

    with pytest.raises(wai.ConfigError, match="api = 'tinker' names the API of a server, and no --url is given"):
        dry_run(api="tinker")
    with pytest.raises(wai.ConfigError, match="api = 'skyrl' must be one of 'wai', 'tinker'"):
        dry_run(api="skyrl", url="http://127.0.0.1:9")
    folder = tmp_path / "checkpoint" / "step-00000002-1a2b3c4d"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"step": 2}))
    (tmp_path / "checkpoint" / "LATEST").write_text(folder.name)
    with pytest.raises(wai.ConfigError, match="written in-process.*cannot continue on a server"):
        remote_checkpoint(tmp_path / "checkpoint")


# ----------------------------------------------------------------------------- a wai serve's Tinker front
def test_each_need_a_tinker_api_server_cannot_meet_is_refused_before_a_session_opens(server: LocalServer,
                                                                                    tmp_path: Path):
    over = dict(url=server.url, token=server.token, api="tinker", progress=False, warm_start_steps=0)
    cases = [(dict(method="sao"), "no add_critic"),
             (dict(method="flash_reinforce", knobs={"temperature": 0.7}, export=False),
              "tokens sampled at another temperature.*--set temperature=1"),
             (dict(method="reinforce_pp", export=False), "a reference policy scored"),
             (dict(method="opsd", export=False), "teacher is the student's own weights"),
             (dict(model="builtin:mini", export=False), "does not serve model 'builtin:mini'")]
    with Client(server.url, server.token) as client:
        before = len(client.sessions())
        for i, (settings, message) in enumerate(cases):
            with pytest.raises(wai.ConfigError, match=f"Tinker-API server at {server.url} cannot run this: .*{message}"):
                wai.train(**{**over, **settings}, run_dir=str(tmp_path / str(i)))
            assert not (tmp_path / str(i)).exists()
        assert len(client.sessions()) == before  # no session, so no model, was created


def test_a_wrong_address_or_key_is_named_at_once(server: LocalServer):
    """Before the SDK (which retries a refused connection for minutes) is asked anything."""
    from whileai.trainers.tinker import capabilities

    with pytest.raises(wai.ConfigError, match="nothing answers there.*is the server running"):
        capabilities("http://127.0.0.1:9", server.token)
    with pytest.raises(wai.ConfigError, match="AuthenticationError.*not accepted by this wai serve.*key right"):
        capabilities(server.url, "tml-not-its-key")
    with pytest.raises(wai.ConfigError, match="must start with the 'tml-' prefix"):
        capabilities(server.url, "no-prefix")


def test_the_wai_api_where_no_wai_serve_answers_says_to_add_api_tinker(server: LocalServer, tmp_path: Path):
    """Below /api the server answers only the Tinker API's routes (a 404 for /v1/training/capabilities), as a
    Tinker-API server does: the run names the other API instead of failing on an HTTP error."""
    with pytest.raises(wai.ConfigError, match="no wai serve answers there.*add --api tinker"):
        wai.train(url=server.url + "/api", token=server.token, progress=False, export=False,
                  run_dir=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_grpo_over_the_tinker_sdk_ends_with_the_in_process_weights(server: LocalServer, tmp_path: Path, capsys):
    local = wai.train(**ONE_PROMPT, run_dir=str(tmp_path / "local"))
    remote = wai.train(**ONE_PROMPT, url=server.url, token=server.token, api="tinker",
                       run_dir=str(tmp_path / "remote"))
    assert remote.summary["where"] == f"Tinker API at {server.url}"
    assert f"trainer Tinker API at {server.url} [user]" in capsys.readouterr().out  # the run plan says where
    assert_same_metrics(remote.metrics(), local.metrics())
    assert local.metrics()[-1]["grad_norm"] > 0
    assert_same_weights(weights_of(server_state(server, remote.dir)), weights_of(local.dir / "checkpoint"))


@pytest.mark.slow
def test_a_run_over_the_tinker_sdk_exports_the_weights_it_trained(server: LocalServer, tmp_path: Path):
    """RUN_DIR/final of a run over --api tinker (save_weights_external, fetched from its signed URLs) holds the
    model the in-process run exports: the same files, the same tensors."""
    local = wai.train(**{**ONE_PROMPT, "export": True}, run_dir=str(tmp_path / "local"))
    remote = wai.train(**{**ONE_PROMPT, "export": True}, url=server.url, token=server.token, api="tinker",
                       run_dir=str(tmp_path / "remote"))
    assert remote.weights == remote.dir / "final"
    assert sorted(p.name for p in remote.weights.iterdir()) == sorted(p.name for p in local.weights.iterdir())
    assert_same_weights(load_file(str(remote.weights / "model.safetensors")),
                        load_file(str(local.weights / "model.safetensors")))
    assert not list(remote.dir.glob(".final.partial"))


# ----------------------------------------------------------------------------- --resume over --url
@pytest.mark.slow
@pytest.mark.parametrize("api", ["wai", "tinker"])
def test_a_run_over_url_resumed_at_step_2_ends_as_the_uninterrupted_one(server: LocalServer, tmp_path: Path,
                                                                         api: str):
    """Nothing is trained twice: the step, the lag queue and the method state come from the local checkpoint,
    the weights and the optimizer from the state saved on the server, loaded into a new run."""
    over = dict(RESUMABLE, url=server.url, token=server.token, api=api, export=api == "wai")
    whole = wai.train(**over, steps=4, run_dir=str(tmp_path / "whole"))
    half = wai.train(**over, steps=2, run_dir=str(tmp_path / "half"))
    first = remote_state(half.dir / "checkpoint")
    resumed = wai.train(resume=str(half.dir), steps=4, progress=False, token=server.token)
    again = remote_state(resumed.dir / "checkpoint")
    assert first is not None and again is not None and again["run"] != first["run"] and again["step"] == 4
    assert [m["step"] for m in resumed.metrics()] == [1, 2, 3, 4]
    assert_same_metrics(resumed.metrics(), whole.metrics())
    if api == "wai":  # the state on the server, and the exported model
        assert_same_weights(weights_of(server_state(server, resumed.dir)), weights_of(server_state(server, whole.dir)))
        assert_same_weights(load_file(str(resumed.weights / "model.safetensors")),
                            load_file(str(whole.weights / "model.safetensors")))
    else:  # a client made from a state has an SDK-made id: the state is read back through the SDK
        mine, theirs = (scored(server, remote_state(r.dir / "checkpoint")["path"]) for r in (resumed, whole))
        assert np.max(np.abs(mine - theirs)) <= 1e-5 and np.ptp(mine) > 0


@pytest.mark.slow
@pytest.mark.parametrize("api", ["wai", "tinker"])
def test_a_resume_whose_state_the_server_lost_names_the_checkpoint_and_what_to_do(server: LocalServer,
                                                                                 tmp_path: Path, api: str):
    over = dict(RESUMABLE, url=server.url, token=server.token, export=False, api=api)
    half = wai.train(**over, steps=2, run_dir=str(tmp_path / "half"))
    shutil.rmtree(server_state(server, half.dir))  # as a server restarted without its data dir
    saved = remote_state(half.dir / "checkpoint")
    assert saved is not None
    named = (f"the state 'step-00000002' of run {saved['run']}.*no longer has it" if api == "wai" else
             f"the state {saved['path']} on the Tinker-API server.*could not load it.*lost it")
    with pytest.raises(wai.ConfigError, match=f"checkpoint at step 2 is {named}.*new --run-dir"):
        wai.train(resume=str(half.dir), steps=4, progress=False, token=server.token)


@pytest.mark.slow  # about 10 s of training
def test_the_command_in_docs_tinker_md_trains_and_prints_what_it_says(server: LocalServer, tmp_path: Path,
                                                                       capsys, monkeypatch):
    """docs/tinker.md's `wai train --url ... --api tinker` block, run against the fixture's server (its URL in
    place of the doc's; the key from $TINKER_API_KEY, as the doc says), prints the documented lines in order."""
    import re
    import shlex

    from test_cli_docs import in_order  # type: ignore[import-not-found]

    from whileai.cli import main

    doc = (Path(__file__).resolve().parents[2] / "docs" / "tinker.md").read_text()
    block = next(b for b in re.findall(r"```console\n(.*?)```", doc, re.S) if "--api tinker" in b)
    command, *documented = block.rstrip("\n").split("\n")
    monkeypatch.setenv("TINKER_API_KEY", server.token)
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(command[len("$ wai "):].replace("http://127.0.0.1:8321", server.url))) == 0
    printed = capsys.readouterr().out.replace(server.url, "http://127.0.0.1:8321").splitlines()
    assert in_order(documented, printed) is None


def test_a_new_run_starts_from_a_copy_of_another_runs_state(server: LocalServer):
    """`CreateRun.from_state`: the copy loads into the new run (its step and weights), the source run keeps its
    state; a state the server does not have is a 404 naming the states it has."""
    from whileai.engine import make_datum
    from whileai.service import ServiceError

    tokens = [1, 70, 71, 72, 73]
    with Client(server.url, server.token) as client:
        session = client.create_session()
        try:
            first = session.create_run("builtin:tiny", seed=3)
            first.forward_backward([make_datum([1, 70], [71, 2])], "cross_entropy")
            first.optim_step({"learning_rate": 1e-2})
            first.save_state("one")
            copy = session.create_run("builtin:tiny", seed=3, from_state=f"{first.id}/one")
            copy.load_state("one")
            assert copy.step == 1 and copy.id != first.id
            assert copy.compute_logprobs(tokens)["logprobs"] == first.compute_logprobs(tokens)["logprobs"]
            with pytest.raises(ServiceError, match="has no saved state 'two'.*its states: \\['one'\\]") as lost:
                session.create_run("builtin:tiny", seed=3, from_state=f"{first.id}/two")
            assert lost.value.status == 404
        finally:
            session.close()
