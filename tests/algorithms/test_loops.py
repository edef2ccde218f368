"""Every algorithm end to end for three cycles on builtin:tiny, and the student's weights move.

Over real HTTP against a live `wai serve` subprocess (``service`` fixture), except the library's critic
methods (SAO, BPCO), whose value head the service's runs cannot attach: those run in-process.
"Moved" is read through the trainer's public operations: the student's log-probabilities of a fixed
sequence differ from a fresh run's of the same model and seed; a teacher run's equal its fresh twin's.
"""

from __future__ import annotations

import numpy as np
import pytest

from whileai.algorithms import ALGORITHMS, algorithm, rl_loop, teacher_loop
from whileai.algorithms.library import library_names
from whileai.errors import ConfigError

PROBE = [1, 100, 101, 102, 103, 104, 105]  # BOS + a few byte tokens
IN_PROCESS = ("method:sao", "method:bpco")
LIBRARY_OPTIONS = {"method:async": {"method": "grpo"}, "method:opsd": {"anchor": "initial"},
                   "method:groupwise_grading": {"grader": lambda rows: [len(r["tokens"]) for r in rows]}}


def probe(run) -> np.ndarray:
    return np.asarray(run.compute_logprobs(PROBE)["logprobs"][1:])


def run_three_cycles(target, name: str):
    algo = algorithm(name)
    options = LIBRARY_OPTIONS.get(name)
    second = algo.loop_needs(algo.make_options(options)).second_run
    # 16 completions a cycle: on builtin:case (reward ~0.1 per token) some always earn a reward
    settings = {"cycles": 3, "tasks_per_cycle": 4, "rollouts_per_prompt": 4, "log": lambda line: None,
                "options": options}
    if second is None:
        return rl_loop(target, name, "builtin:case", **settings)
    return teacher_loop(target, name, "builtin:case", teacher_seed=1 if second == "teacher" else None, **settings)


def check_moved(result, fresh, fresh_teacher=None) -> None:
    assert len(result.history) == 3
    versions = [h["version"] for h in result.history]
    assert versions[0] == 0 and all(b > a for a, b in zip(versions, versions[1:]))  # a new version each cycle
    assert all(np.isfinite(h["grad_norm"]) for h in result.history)
    assert np.max(np.abs(probe(result.student) - probe(fresh))) > 1e-4  # the student trained
    if fresh_teacher is not None:  # the frozen run never changed
        np.testing.assert_array_equal(probe(result.teacher), probe(fresh_teacher))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in list(ALGORITHMS) + library_names() if n not in IN_PROCESS])
def test_every_algorithm_three_cycles_over_http(client, name):
    result = run_three_cycles(client, name)
    assert result.where.startswith("service at http://127.0.0.1:")
    session = client.create_session()
    try:
        fresh = session.create_run("builtin:tiny", seed=0)
        teacher_seed = 1 if (result.teacher is not None and name in ("opd", "method:opd")) else 0
        fresh_teacher = session.create_run("builtin:tiny", seed=teacher_seed) if result.teacher is not None else None
        check_moved(result, fresh, fresh_teacher)
    finally:
        session.close()
        result.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", IN_PROCESS)
def test_critic_methods_three_cycles_in_process(name):
    from whileai.engine import TrainingEngine

    result = run_three_cycles(None, name)
    assert result.where == "in-process engine"
    # SAO (10) and BPCO (15) warm the critic up first: in 3 cycles only the value head trains
    assert result.student.critic is not None
    assert all(np.isfinite(h["critic_loss"]) and h["critic_loss"] > 0 for h in result.history)
    np.testing.assert_array_equal(probe(result.student), probe(TrainingEngine("builtin:tiny", seed=0)))


def test_one_algorithm_in_process_moves_the_weights():
    from whileai.engine import TrainingEngine

    result = rl_loop(None, "grpo_nostd", "builtin:case", cycles=2, tasks_per_cycle=2, log=lambda line: None)
    assert result.where == "in-process engine"
    assert np.max(np.abs(probe(result.student) - probe(TrainingEngine("builtin:tiny", seed=0)))) > 1e-4


def test_a_teacher_algorithm_without_a_teacher_is_refused():
    with pytest.raises(ConfigError, match="needs a frozen teacher run: use teacher_loop"):
        rl_loop(None, "opd", "builtin:case", cycles=1, log=lambda line: None)
    with pytest.raises(ConfigError, match="the teacher given is the student's own starting weights"):
        teacher_loop(None, "opd", "builtin:case", cycles=1, log=lambda line: None)


def test_library_critic_method_over_a_trainer_without_add_critic_is_refused():
    class TrainerWithoutCritic:  # as a service RunClient: the engine's operations, no add_critic
        pass

    sao = algorithm("method:sao")
    with pytest.raises(ConfigError, match="cannot attach one; run it in-process"):
        sao.prepare(TrainerWithoutCritic(), sao.make_options(), 1e-3)


@pytest.mark.slow
def test_wai_loop_against_a_running_server(service, capsys):
    from whileai.cli import main

    assert main(["loop", "--algorithm", "rloo", "--cycles", "1", "--tasks-per-cycle", "2",
                 "--url", service.url, "--token", service.token]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"rloo on builtin:case with builtin:tiny (service at {service.url})")
    assert out[1].startswith("cycle 0  v0  reward ") and out[-1].startswith(f"done: 1 cycle on service at {service.url}")


def test_wai_loop_url_without_a_token_says_how_to_fix(monkeypatch, capsys):
    from whileai.cli import main

    monkeypatch.delenv("WAI_TOKEN", raising=False)
    assert main(["loop", "--algorithm", "rloo", "--url", "http://127.0.0.1:9"]) == 2
    assert "--url needs a bearer token: give --token T or set WAI_TOKEN" in capsys.readouterr().err
