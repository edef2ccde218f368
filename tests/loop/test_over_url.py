"""`wai train --url`: the same run over a real `wai serve` subprocess gives the in-process run's weights.

For a group (GRPO), a one-rollout (FlashReinforce at temperature 0.7), a critic (SAO) and a teacher method
(OPD, teacher loaded by the loop) the final weights after three steps match the in-process run's within
1e-5 (the fingerprint of tests/loop/test_spine_pin.py). A need the server cannot meet is refused before the
run is created, naming the reason and the alternative.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_spine_pin import close, train_case

import whileai as wai
from whileai.cli import main
from whileai.service import Client
from whileai.service.launch import LocalServer, start_server
from whileai.trainers import Needs, refusals


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    with start_server(tmp_path_factory.mktemp("serve") / "data", args=["--model", "builtin:tiny"]) as running:
        yield running


@pytest.mark.parametrize("name", ["grpo", "flash_reinforce", "sao", "opd"])
def test_a_run_over_the_service_ends_with_the_in_process_weights(server: LocalServer, tmp_path: Path, name: str):
    local = train_case(name, tmp_path / "local")
    remote = train_case(name, tmp_path / "remote", url=server.url, token=server.token)
    assert close(local, remote, 1e-5) <= 1e-5
    assert (tmp_path / "remote" / "summary.json").read_text().count(f"service at {server.url}") == 1


def test_the_cli_trains_over_url_and_prints_where(server: LocalServer, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("WAI_TOKEN", server.token)
    code = main(["train", "--url", server.url, "--steps", "1", "--rollouts-per-step", "4", "--warm-start-steps", "0",
                 "--eval-tasks", "0", "--no-progress", "--no-export", "--run-dir", str(tmp_path / "r")])
    assert code == 0
    assert f"trainer: service at {server.url}" in capsys.readouterr().out


def test_a_need_the_server_cannot_meet_is_refused_before_a_run_is_created(server: LocalServer, tmp_path: Path):
    with Client(server.url, server.token) as client:
        before = len(client.sessions())
        with pytest.raises(wai.ConfigError, match="does not serve model 'builtin:mini'.*wai serve --model "
                                                  "builtin:mini"):
            wai.train(model="builtin:mini", url=server.url, token=server.token, run_dir=str(tmp_path / "a"),
                      progress=False)
        with pytest.raises(wai.ConfigError, match="teacher is the student's own weights \\('ema'\\).*drop --url"):
            wai.train(method="opsd", url=server.url, token=server.token, run_dir=str(tmp_path / "b"), progress=False,
                      warm_start_steps=0)
        assert len(client.sessions()) == before  # nothing was allocated
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_refusals_read_the_capabilities():
    """A server without add_critic or the method's loss: each unmet need named, with what to do instead."""
    caps = {"models": ["builtin:tiny"], "operations": ["forward", "forward_backward", "optim_step", "sample"],
            "losses": {"cross_entropy": {}}}
    assert refusals(caps, "builtin:tiny", Needs()) == []
    found = refusals(caps, "builtin:tiny", Needs(loss="ppo", critic=(1e-3, None)))
    assert len(found) == 2 and "'ppo', which it does not advertise (it takes cross_entropy)" in found[0]
    assert "no add_critic" in found[1] and "drop --url" in found[1]


@pytest.mark.slow
def test_wai_serve_chained_to_a_tinker_api_server_gives_the_same_weights(tmp_path: Path):
    """`wai serve --tinker-url A` in front of a second `wai serve` A (through the Tinker SDK): `wai train --url`
    on the front ends with the in-process weights. One prompt a step: a Tinker sample request carries one
    prompt, so only then does the upstream draw the same random stream (whileai.trainers.tinker_map.prompt_seed)."""
    pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
    from tests.service.chain import chained

    with chained(tmp_path) as (_, front):
        one_prompt = dict(method="grpo", knobs={"rollouts_per_prompt": 8}, steps=3, rollouts_per_step=8,
                          warm_start_steps=0, eval_tasks=0, progress=False, save_every=1000, export=False)
        local = wai.train(**one_prompt, run_dir=str(tmp_path / "local"))
        relayed = wai.train(**{**one_prompt, "export": True}, url=front.url, token=front.token,
                            run_dir=str(tmp_path / "relayed"))
    assert relayed.summary["where"] == f"service at {front.url}"
    assert relayed.weights is not None and (relayed.weights / "model.safetensors").is_file()  # save_weights_external
    for mine, theirs in zip(relayed.metrics(), local.metrics(), strict=True):
        for key in ("reward", "loss", "grad_norm", "drift"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), (key, mine, theirs)
    assert local.metrics()[-1]["grad_norm"] > 0


def _rows_file(path: Path) -> str:
    """A pass and a fail for each of four prompts: what SFT, DPO and RM train on."""
    lines = [{"task_id": f"t{i}", "prompt": f"abc{i}", "completion": good, "reward": reward}
             for i in range(4) for good, reward in (("ABCD", 1.0), ("xy", 0.0))]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def _every_method() -> list[tuple[str, object, dict]]:
    cases = []
    for name in wai.method_names():
        method: object = name
        extra: dict = {}
        if name == "async":
            extra = {"knobs": {"method": "grpo"}}
        elif name == "groupwise_grading":
            method = wai.GroupwiseGrading(grader=lambda rows: [len(r["tokens"]) for r in rows],
                                          method=wai.GRPO(rollouts_per_prompt=4))
        elif name == "opd":
            extra = {"teacher": "builtin:tiny"}
        elif name in ("sao", "bpco"):
            extra = {"knobs": {"critic_warmup": 1}}
        elif name == "custom_loss":  # a user's own advantage function: reward minus the batch mean
            method = wai.CustomLoss(advantages=lambda batch: batch.rewards_B - batch.rewards_B.mean(),
                                    loss="importance_sampling", rollouts_per_prompt=4)
        cases.append((name, method, extra))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("name, method, extra", _every_method(), ids=[c[0] for c in _every_method()])
def test_every_method_trains_over_the_service_or_is_refused_first(server: LocalServer, tmp_path: Path, name: str,
                                                                 method: object, extra: dict):
    """Two steps of every registry method over --url; a need the server cannot meet (OPSD's EMA teacher, the
    student's own weights) is refused before anything is created there, naming the alternative."""
    settings = dict(steps=2, rollouts_per_step=8, warm_start_steps=0, eval_tasks=0, progress=False, export=False,
                    run_dir=str(tmp_path / "r"), url=server.url, token=server.token, **extra)
    built = wai.method(name, **extra.get("knobs", {})) if isinstance(method, str) else method
    if built.run_spec().source == "rows":  # type: ignore[attr-defined]
        settings["rows"] = _rows_file(tmp_path / "rows.jsonl")
    if name in ("opsd", "sdpo"):  # OPSD's default anchor is an EMA; SDPO's the initial weights
        with pytest.raises(wai.ConfigError, match="teacher is the student's own weights \\('(ema|initial)'\\)"):
            wai.train(method=method, **settings)
        return
    run = wai.train(method=method, **settings)
    metrics = run.metrics()
    assert run.summary["where"] == f"service at {server.url}" and len(metrics) == 2
    assert all(np.isfinite(m["loss"]) for m in metrics if "loss" in m)
