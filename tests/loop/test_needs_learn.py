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
@pytest.mark.parametrize("method, warm_start", [(wai.SAO(critic_warmup=10, critic_steps=2), 14),
                                                (wai.BPCO(critic_warmup=10), 0)])
def test_the_critic_loss_falls(tmp_path: Path, method: wai.Method, warm_start: int):
    """Ten critic-only steps (the method's warm-up) on fresh rollouts of a fixed policy: the value head's squared
    error per token on each new batch (measured before that batch's update) falls as it learns E[R | state].

    Each head starts away from the rewards: SAO's at 0 against rewards near 0.5 after a warm start, BPCO's
    bounded head at the middle of its range, 0.5, against a random-init model's rewards near 0.1. The critic's
    learning rate is the override, as --critic-learning-rate gives it (the papers' 5e-6 / 1e-5 barely move a
    head in ten steps)."""
    run = wai.train(method=method, steps=11, critic_learning_rate=1e-2, run_dir=str(tmp_path / "critic"),
                    **{**RUN, "warm_start_steps": warm_start, "lag": 0})
    metrics = run.metrics()
    losses = [m["critic_loss"] for m in metrics]
    assert _mean(losses[-3:]) < 0.6 * _mean(losses[:3]), losses
    assert [m["policy_trained"] for m in metrics] == [False] * 10 + [True]
    assert run.summary["resolved"]["critic_learning_rate"] == 1e-2
