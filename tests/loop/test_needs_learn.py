"""The needs met make the numbers move: OPD closes its gap to a better teacher, the critic's loss falls.

Slow (tens of seconds each on 2 cores): run with ``pytest -m slow tests/loop/test_needs_learn.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import whileai as wai

RUN = dict(rollouts_per_step=32, warm_start_steps=0, eval_tasks=0, export=False, progress=False, save_every=1000,
           lr_schedule="constant", lag=1)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> str:
    """builtin:tiny after 30 supervised steps on builtin:case's answers (one RL step), exported: a teacher that
    passes most tasks where the random-init student passes about one in ten."""
    folder = tmp_path_factory.mktemp("teacher")
    run = wai.train(steps=1, warm_start_steps=30, eval_tasks=0, progress=False, seed=5, run_dir=str(folder / "run"))
    return str(run.weights)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_opd_closes_the_gap_to_a_better_teacher_and_the_reward_rises(teacher: str, tmp_path: Path, seed: int):
    run = wai.train(method="opd", teacher=teacher, steps=12, seed=seed, run_dir=str(tmp_path / "opd"), **RUN)
    metrics = run.metrics()
    divergence = [m["method/mean_divergence"] for m in metrics]  # reverse KL over the top-k slots and the tail
    rewards = [m["reward"] for m in metrics]
    assert _mean(divergence[-3:]) < 0.5 * _mean(divergence[:3]), divergence
    assert _mean(rewards[-3:]) > _mean(rewards[:3]) + 0.15, rewards


@pytest.mark.slow
@pytest.mark.parametrize("method", [wai.SAO(critic_warmup=2, critic_steps=2), wai.BPCO(critic_warmup=2)])
def test_the_critic_loss_falls(tmp_path: Path, method: wai.Method):
    """The value head fits R at every action token: its squared error per token falls over the run, with the
    critic's learning rate the run spec gives (overridden here, as --critic-learning-rate does)."""
    run = wai.train(method=method, steps=12, critic_learning_rate=3e-2, learning_rate=1e-2,
                    run_dir=str(tmp_path / "critic"), **RUN)
    losses = [m["critic_loss"] for m in run.metrics()]
    assert _mean(losses[-3:]) < 0.5 * _mean(losses[:3]), losses
    assert [m["policy_trained"] for m in run.metrics()][:3] == [False, False, True]
