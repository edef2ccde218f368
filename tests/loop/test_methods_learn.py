"""Every method in `wai methods` that learns from rollouts raises the training reward through `wai.train`.

Each runs 16 steps of 32 rollouts on builtin:case (a random-init builtin:tiny, no warm start: the reward
starts near 0.1) at lag 1, for two fixed seeds; the mean reward of the last four steps must beat the first
four by a margin on every seed. The coefficients' sign flipped would make the reward fall.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import whileai as wai

MARGIN = 0.08


def _rollout_methods() -> list[str]:
    """The registry's methods that learn from rollouts (OPD / OPSD learn from a teacher:
    tests/loop/test_needs_learn.py); a new method is on this list without an edit here."""
    names = []
    for name in wai.method_names():
        if name in ("async", "groupwise_grading", "custom_loss"):  # need an option first: SETTINGS gives it
            names.append(name)
            continue
        spec = wai.method(name).run_spec()
        if spec.source == "rollouts" and not any(n.startswith("teacher") for n in spec.needs):
            names.append(name)
    return names


def _settings() -> dict[str, tuple[object, dict]]:
    """The methods that need something other than 4 rollouts a prompt to learn in 16 steps (or an option)."""
    critic = {"critic_learning_rate": 1e-2, "learning_rate": 1e-2}
    return {
        "flash_reinforce": ("flash_reinforce", {}),
        "dr_grpo": (wai.DrGRPO(rollouts_per_prompt=4, max_tokens=4), {}),
        "rae": ("rae", {}),
        "sao": (wai.SAO(critic_warmup=1, critic_steps=2), {**critic, "critic_learning_rate": 3e-2}),
        "bpco": (wai.BPCO(critic_warmup=2), critic),
        "async": (wai.Async(wai.GRPO(rollouts_per_prompt=4), correction="icepop"), {}),
        "reinforce_ada": (wai.methods.ReinforceAda(round_size=4, max_rounds=2), {}),
        "groupwise_grading": (wai.GroupwiseGrading(grader=lambda rows: [-len(r["tokens"]) for r in rows],
                                                   method=wai.GRPO(rollouts_per_prompt=4)), {}),
        "custom_loss": (wai.CustomLoss(advantages=lambda batch: batch.rewards_B - batch.rewards_B.mean(),
                                       rollouts_per_prompt=4), {}),
    }


def _methods() -> dict[str, tuple[object, dict]]:
    special = _settings()
    return {name: special.get(name) or (wai.method(name, rollouts_per_prompt=4), {}) for name in _rollout_methods()}


def test_every_special_setting_names_a_rollout_method():
    assert set(_settings()) <= set(_rollout_methods())
    assert {"grpo", "rloo", "ppo", "cispo", "gspo", "dapo", "grpo_nostd"} <= set(_methods())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_methods()))
def test_training_reward_rises(name: str, tmp_path: Path):
    method, extra = _methods()[name]
    for seed in (0, 1):
        run = wai.train(method=method, steps=16, rollouts_per_step=32, lag=1, seed=seed, warm_start_steps=0,
                        eval_tasks=0, export=False, progress=False, save_every=1000, lr_schedule="constant",
                        run_dir=str(tmp_path / f"{name}-{seed}"), **extra)
        rewards = [r["reward"] for r in run.metrics()]
        start, end = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
        assert end > start + MARGIN, f"{name} seed {seed}: reward {start:.3f} -> {end:.3f}"
