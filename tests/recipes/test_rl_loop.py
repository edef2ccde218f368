"""Rung 1 of the recipes ladder learns: the engine, a method and the sampler compose into real RL.

Each run trains the 107k-parameter `builtin:tiny` Qwen2 from random weights (FlashReinforce 30 steps,
GRPO 40) on the "match the case" task of recipes/rl_loop.py, sampling from weights 2 steps old.
Measured over seeds 0-23 (recipes/README.md): the mean reward of the last 5 steps exceeds that of the
first 5 by at least 0.356 (FlashReinforce) and 0.198 (GRPO); with the coefficients' sign flipped it
falls by 0.05-0.13 (to under 0.05), and with zero coefficients (no learning) it moves by -0.02 to
+0.05. The margin 0.12 is 2.4 times that no-op drift and 0.6 of the worst GRPO seed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import whileai as wai

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "rl_loop.py"
MARGIN = 0.12  # reward gain (last 5 steps minus first 5) a working update clears and a broken one does not
STEPS = {"flash_reinforce": 30, "grpo": 40}  # GRPO sees 4 prompts a step (8 rollouts each), FlashReinforce 32


def load_recipe():
    """recipes/ is a folder of scripts, not a package: load rl_loop.py by path."""
    if "rl_loop_recipe" not in sys.modules:
        spec = importlib.util.spec_from_file_location("rl_loop_recipe", RECIPE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses and inspect look the module up by name
        spec.loader.exec_module(module)
    return sys.modules["rl_loop_recipe"]


rl = load_recipe()


def run(method: str, seed: int) -> dict:
    return rl.train(rl.Config(method=method, steps=STEPS[method], seed=seed, lag=2), log=lambda *_: None)


def check_learned(history: dict) -> None:
    rewards = np.array(history["rewards"])
    first, last = rewards[:5].mean(), rewards[-5:].mean()
    assert last - first > MARGIN, f"reward {first:.3f} -> {last:.3f}, gain below {MARGIN}"
    # the held-out greedy pass rate's 95% interval (tasks as the unit) ends above where it started
    before, after = history["eval_before"]["greedy"], history["eval_after"]["greedy"]
    assert after["ci95"][0] > before["ci95"][1], (before, after)
    # the sampler really lagged: the learner's probabilities differed from the sampler's
    assert max(abs(s["mean_ratio"] - 1.0) for s in history["stats"]) > 0.01


@pytest.mark.parametrize("seed", [0, 1])
def test_flash_reinforce_learns_from_one_rollout_per_prompt(seed):
    history = run("flash_reinforce", seed)
    assert history["group"] == 1
    check_learned(history)
    # the trust gate did its job on stale rows: some trajectories were dropped, never all of them every step
    admitted = [s["admitted_share"] for s in history["stats"]]
    assert min(admitted) < 1.0 and np.mean(admitted) > 0.2


@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_learns_from_groups(seed):
    history = run("grpo", seed)
    assert history["group"] == wai.GRPO().rollouts_per_prompt == 8
    check_learned(history)
    # with stale samples PPO's clip engaged on some tokens
    assert max(s["clipped_token_share"] for s in history["stats"]) > 0.0


def test_grader_by_hand():
    """Prompt "abc" is lower case. Completion "xY!z": x and z are lower-case letters, Y and ! are not,
    so the reward is 2/4 = 0.5; "QRST" for prompt "ABC" is 4/4; an EOS first scores 0 on every slot."""
    tok = rl.TrainingEngine("builtin:tiny").tokenizer
    eos = tok.eos_token_id
    assert rl.grade(tok.encode("abc"), tok.encode("xY!z", add_special_tokens=False), tok, 4) == 0.5
    assert rl.grade(tok.encode("ABC"), tok.encode("QRST", add_special_tokens=False), tok, 4) == 1.0
    assert rl.grade(tok.encode("ABC"), [eos], tok, 4) == 0.0


def test_held_out_prompts_are_never_trained_on():
    cfg = rl.Config(eval_prompts=16, seed=3)
    tok = rl.TrainingEngine("builtin:tiny").tokenizer
    rng, held_out = rl.split_prompts(cfg, tok)
    assert len({tuple(p) for p in held_out}) == 16
    train = rl.training_prompts(rng, held_out, 2000, cfg, tok)
    assert not {tuple(p) for p in train} & {tuple(p) for p in held_out}


def test_cli_knobs_reach_the_method_and_group_size_comes_from_it():
    cfg, as_json = rl.parse_args(["--method", "grpo", "--set", "rollouts_per_prompt=4", "--set", "clip=0.3",
                                  "--steps", "7", "--lag", "1", "--json"])
    method, engine = rl.build(cfg)
    assert (method.rollouts_per_prompt, method.clip, cfg.steps, cfg.lag, as_json) == (4, 0.3, 7, 1, True)
    assert engine.keep_sampler_versions == 2
    with pytest.raises(wai.ConfigError, match="rollouts_per_step=2 is below the method's group size 4"):
        rl.train(rl.Config(method="grpo", knobs={"rollouts_per_prompt": 4}, rollouts_per_step=2, steps=1))


def test_bad_settings_are_reported_all_at_once(capsys):
    with pytest.raises(wai.ConfigError, match=r"steps=0 must be >= 1; lag=-1 must be >= 0"):
        rl.train(rl.Config(steps=0, lag=-1))
    assert rl.main(["--set", "trust=-1"]) == 2  # a bad knob is the method's ConfigError, exit 2
    assert "FlashReinforce.trust=-1 is invalid" in capsys.readouterr().err
