"""``rl_loop`` / ``teacher_loop`` (whileai.algorithms.loops) run every registry method that samples rollouts,
end to end for three cycles on builtin:tiny, and the student's weights move.

Over real HTTP against a live ``wai serve`` subprocess, except the critic methods (SAO, BPCO), whose value head
runs in-process. "Moved" is read through the trainer's public operations: the student's log-probabilities of
a fixed sequence differ from a fresh run's of the same model and seed; a teacher run's equal its fresh twin's.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import whileai as wai
from whileai.algorithms import rl_loop, teacher_loop
from whileai.algorithms.loops import (
    Completion,
    Group,
    LoopContext,
    SampleRequest,
    _planned,
    place_config,
    preflight,
    resolve,
    row,
    second_run,
)
from whileai.engine import TrainingEngine, capabilities
from whileai.envs import Task, load_taskset
from whileai.errors import ConfigError

PROBE = [1, 100, 101, 102, 103, 104, 105]  # BOS + a few byte tokens
IN_PROCESS = ("sao", "bpco")
OPTIONS: dict[str, dict[str, Any]] = {
    "async": {"method": "grpo"}, "opsd": {"anchor": "initial"},
    "groupwise_grading": {"grader": lambda rows: [len(r["tokens"]) for r in rows]},
    "custom_loss": {"advantages": lambda batch: batch.rewards_B - batch.rewards_B.mean(), "generations": 4}}


def looped() -> list[str]:
    """Every registry name the loop runs (rows-as-pushed methods are refused)."""
    out = []
    for name in wai.method_names():
        try:
            resolve(name, OPTIONS.get(name))
        except ConfigError:
            continue
        out.append(name)
    return out


def probe(run) -> np.ndarray:
    return np.asarray(run.compute_logprobs(PROBE)["logprobs"][1:])


def run_three_cycles(target, name: str):
    chosen = resolve(name, OPTIONS.get(name))
    settings = {"cycles": 3, "tasks_per_cycle": 4, "rollouts_per_prompt": 4, "log": lambda line: None}
    if second_run(chosen) is None:
        return rl_loop(target, chosen, "builtin:case", **settings)
    return teacher_loop(target, chosen, "builtin:case", teacher_seed=1 if second_run(chosen) == "teacher" else None,
                        **settings)


def tinker_like_capabilities() -> dict[str, Any]:
    """As the spec describes Tinker Cloud: no gspo / dppo / sapo / ppo_critic, and the clip thresholds taken only
    as per-token loss_fn_inputs (no scalar config keys)."""
    caps = {"provider": "tinker", "losses": copy.deepcopy(capabilities())}
    for name in ("gspo", "dppo", "sapo", "ppo_critic"):
        del caps["losses"][name]
    for name in ("ppo", "cispo"):
        caps["losses"][name]["config"] = {}
    return caps


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from whileai.service.launch import start_server

    with start_server(tmp_path_factory.mktemp("loops-service") / "data") as server:
        yield server


@pytest.fixture
def client(service: Any) -> Iterator[Any]:
    from whileai.service import Client

    with Client(service.url, service.token) as c:
        yield c


def test_the_loop_runs_every_method_that_samples_rollouts():
    names = looped()
    assert {"ppo", "cispo", "gspo", "dppo", "sapo", "dapo", "reinforce_pp", "grpo_nostd", "grpo_len_norm", "dr_grpo",
            "rloo", "max_rl", "opd", "sdpo", "opsd", "grpo", "custom_loss"} <= set(names)
    assert not {"sft", "dpo", "rm"} & set(names)
    with pytest.raises(ConfigError, match="trains on rows as pushed"):
        resolve("sft")
    with pytest.raises(ConfigError, match="anchor=initial"):
        resolve("opsd")  # an EMA teacher follows the student: no frozen second run can be it


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in looped() if n not in IN_PROCESS])
def test_every_method_three_cycles_over_http(client, name):
    result = run_three_cycles(client, name)
    assert result.where.startswith("service at http://127.0.0.1:")
    session = client.create_session()
    try:
        fresh = session.create_run("builtin:tiny", seed=0)
        teacher_seed = 1 if second_run(resolve(name, OPTIONS.get(name))) == "teacher" else 0
        fresh_teacher = session.create_run("builtin:tiny", seed=teacher_seed) if result.teacher is not None else None
        assert len(result.history) == 3
        versions = [h["version"] for h in result.history]
        assert versions[0] == 0 and all(b > a for a, b in zip(versions, versions[1:]))
        assert all(np.isfinite(h["grad_norm"]) for h in result.history)
        assert np.max(np.abs(probe(result.student) - probe(fresh))) > 1e-4
        if fresh_teacher is not None:
            np.testing.assert_array_equal(probe(result.teacher), probe(fresh_teacher))
    finally:
        session.close()
        result.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", IN_PROCESS)
def test_critic_methods_three_cycles_in_process(name):
    result = run_three_cycles(None, name)
    assert result.where == "in-process engine"
    # SAO (10) and BPCO (15) warm the critic up first: in 3 cycles only the value head trains
    assert result.student.critic is not None
    assert all(np.isfinite(h["critic_loss"]) and h["critic_loss"] > 0 for h in result.history)
    np.testing.assert_array_equal(probe(result.student), probe(TrainingEngine("builtin:tiny", seed=0)))


@pytest.mark.parametrize("name", ["grpo_nostd", "ppo"])
def test_one_method_in_process_moves_the_weights(name):
    result = rl_loop(None, name, "builtin:case", cycles=2, tasks_per_cycle=2, rollouts_per_prompt=4,
                     log=lambda line: None)
    assert result.where == "in-process engine" and result.history[0]["datums"] > 0
    assert np.max(np.abs(probe(result.student) - probe(TrainingEngine("builtin:tiny", seed=0)))) > 1e-4


def test_a_teacher_method_without_a_teacher_is_refused():
    with pytest.raises(ConfigError, match="needs a frozen teacher run: use teacher_loop"):
        rl_loop(None, "opd", "builtin:case", cycles=1, log=lambda line: None)
    with pytest.raises(ConfigError, match="the teacher given is the student's own starting weights"):
        teacher_loop(None, "opd", "builtin:case", cycles=1, log=lambda line: None)
    assert second_run(wai.ReinforcePP()) == "reference"  # its ref_logprobs come from the frozen run


def test_preflight_fails_closed_before_any_run_exists():
    with pytest.raises(ConfigError, match="loss 'gspo' is not advertised"):
        preflight(tinker_like_capabilities(), wai.GSPO(), teacher=False)
    caps = {**tinker_like_capabilities(), "operations": ["sample", "forward_backward", "optim_step",
                                                        "save_weights_for_sampler", "forward"]}
    preflight(caps, wai.OPD(), teacher=False)  # everything the student's loop calls is there
    with pytest.raises(ConfigError, match=r"does not advertise the operations \['logprobs'\], which opd needs"):
        preflight(caps, wai.OPD(), teacher=True)


def test_clip_bounds_go_where_the_provider_takes_them():
    """Ours: scalar loss_fn_config keys. Tinker-like: per-token loss_fn_inputs, empty config."""
    config = dict(wai.PPO(clip=0.3).run_spec().loss_config)
    local = place_config({"provider": "local", "losses": capabilities()}, "ppo", config)
    assert local == (config, {})
    assert place_config(tinker_like_capabilities(), "ppo", config) == ({}, config)
    caps = tinker_like_capabilities()
    caps["losses"]["ppo"]["optional_inputs"] = ["weights"]
    with pytest.raises(ConfigError, match="neither as a config key nor as a per-token input"):
        place_config(caps, "ppo", config)


def test_dapo_resamples_through_the_client_until_the_group_is_whole():
    """Three of four completions truncated, min_retained 3: one round of 4 fresh completions from the client's
    same weights (the cap is the taskset's answer length here, so the fresh ones are complete)."""
    engine = TrainingEngine("builtin:tiny", seed=1)
    task = Task("abc", "abc", "abca", {"completion_len": 4})
    comps = [Completion([97, 98], [-1.0, -1.0], "stop", 1.0, "ab", False)]
    comps += [Completion([97, 98], [-1.0, -1.0], "length", 0.0, "ab", True)] * 3
    group = Group(task, [1, 2, 3], comps)
    request = SampleRequest(4, {"max_tokens": 2, "temperature": 1.0, "seed": 3}, 0, cap_is_answer_length=True)
    ctx = LoopContext(engine, {"provider": "local", "losses": capabilities()}, engine.tokenizer,
                      load_taskset("builtin:case"))
    rows = [row(group, c) for c in comps]
    before = engine.step
    extra = _planned(wai.DAPO(generations=4, min_retained=3).run_spec(), [group], request, ctx, rows)
    fresh = engine.sample(group.prompt_tokens, 4, {**request.sampling_params, "seed": 3 + 7919}, version=0)
    assert [r["tokens"] for r in extra] == [list(s.tokens) for s in fresh]  # drawn by the client, same seed
    assert engine.step == before  # sampling never trains
    update = wai.DAPO(generations=4, min_retained=3).update(
        [{k: v for k, v in r.items() if k not in ("prompt_tokens", "completion")} | {"logprobs": r["behavior_logprobs"]}
         for r in rows + extra])
    assert int(update.admitted.sum()) == 4  # the kept one + the first 3 of the fresh ones (max(4, 3) = 4 kept)


@pytest.mark.slow
def test_wai_loop_against_a_running_server(service, capsys):
    from whileai.cli import main

    assert main(["loop", "--method", "rloo", "--cycles", "1", "--tasks-per-cycle", "2",
                 "--url", service.url, "--token", service.token]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"rloo on builtin:case with builtin:tiny (service at {service.url})")
    assert out[1].startswith("cycle 0  v0  reward ") and out[-1].startswith(f"done: 1 cycle on service at {service.url}")


def test_wai_loop_url_without_a_token_says_how_to_fix(monkeypatch, capsys):
    from whileai.cli import main

    monkeypatch.delenv("WAI_TOKEN", raising=False)
    assert main(["loop", "--method", "rloo", "--url", "http://127.0.0.1:9"]) == 2
    assert "--url needs a bearer token: give --token T or set WAI_TOKEN" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "rloo", "ppo", "max_rl"])
def test_same_update_through_the_service_as_through_the_engine(client, name):
    """One real sample, one cycle: through a wai serve RunClient and through a TrainingEngine directly, the
    loss, the gradient norm and the weights after the step agree."""
    from whileai.algorithms.loops import LoopSettings, _cycle, _sample
    from whileai.envs import load_taskset

    taskset = load_taskset("builtin:case")
    sampler = TrainingEngine("builtin:tiny", seed=0)
    request = SampleRequest(4, {"max_tokens": 4, "temperature": 1.0, "seed": 11}, sampler.save_weights_for_sampler(),
                            cap_is_answer_length=True)
    ctx = LoopContext(sampler, {"provider": "local", "losses": capabilities()}, sampler.tokenizer, taskset)
    groups = _sample(ctx, taskset, LoopSettings(tasks_per_cycle=4), 0, request)

    def one_cycle(trainer, caps):
        rows = [row(g, c) for g in groups for c in g.completions]
        metrics, _, _ = _cycle(LoopContext(trainer, caps, sampler.tokenizer, taskset), wai.method(name, generations=4),
                               rows, request, {"learning_rate": 1e-2}, None, 0)
        return metrics, probe(trainer)

    direct, direct_probe = one_cycle(TrainingEngine("builtin:tiny", seed=0), ctx.capabilities)
    session = client.create_session()
    try:
        remote, remote_probe = one_cycle(session.create_run("builtin:tiny", seed=0), client.capabilities())
    finally:
        session.close()
    assert direct["grad_norm"] > 0
    assert remote["loss"] == pytest.approx(direct["loss"], rel=1e-6, abs=1e-9)
    assert remote["grad_norm"] == pytest.approx(direct["grad_norm"], rel=1e-6)
    np.testing.assert_allclose(remote_probe, direct_probe, atol=1e-6)
