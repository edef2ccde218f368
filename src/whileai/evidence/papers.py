"""The paper recipes: each paper's claim as a baseline arm against the recipe arm(s), by name.

Each baseline is the method's own ablation where a knob gives one (the correction switched off, nothing else
changed), and the closest thing the library has where none does; the docstring of each says which and why.
recipes/papers/README.md names the knobs that reach each paper's regime.
"""

from __future__ import annotations

from whileai.errors import ConfigError
from whileai.evidence.controls import CONTROLS
from whileai.evidence.runner import Arm, ArmContext, Recipe

NEVER = 1e300  # a gate or band bound no finite drift or ratio reaches: the correction never acts
FLASH_OFF_POLICY = 8  # FlashReinforce's default off_policy_steps; raised to the lag when the lag is longer
BUILTIN_CRITIC_RATE = 1e-2  # the papers' critic rates (5e-6, 1e-5) leave a random-init built-in's head frozen
REGIME_TASKSET = "builtin:count"
"""the paper recipes' and the lag table's taskset: held-out pass@1 starts at 0.15-0.40 after the warm start (room
to move), and replies end with EOS at lengths that vary (so GRPO's 1/T weighting and bnpo's 1/N can differ)"""
REGIME = {"taskset": REGIME_TASKSET, "lag": 16}
"""what a paper recipe runs at unless told otherwise: the task with headroom, at a lag where the corrections
engage (on builtin:count at its declared rate the gate drops about a quarter of the trajectories, and the
ungated estimator trains on steps whose drift reaches 0.2 and more; docs/evidence.md)"""


def _flash_reinforce(run: ArmContext) -> tuple[Arm, ...]:
    """Baseline: FlashReinforce with the trust gate never closing (trust = 1e300): the same estimator (batch-mean
    baseline, 1/T, the unclipped ratio inside c) trained on every stale trajectory. The library has no REINFORCE
    without the ratio; this is the paper's estimator minus its correction, so the delta is the gate's."""
    steps = {"off_policy_steps": max(FLASH_OFF_POLICY, run.lag)}
    return (Arm("stale REINFORCE, gate off", "flash_reinforce", {**steps, "trust": NEVER}),
            Arm("FlashReinforce", "flash_reinforce", steps))


def _sao(run: ArmContext) -> tuple[Arm, ...]:
    """Baseline: SAO with the ratio band (0, 1e300): the same critic, GAE and c = rho * A / N, and no token is
    ever masked (a ratio is always above 0)."""
    return (Arm("same critic, ratio never masked", "sao", {"ratio": [0.0, NEVER]}), Arm("SAO", "sao", {}))


BPCO_AS_SAO = {"gae_alpha": 0.4, "critic_steps": 1, "critic_warmup": 15, "critic_learning_rate": 1e-5}


def _bpco(run: ArmContext) -> tuple[Arm, ...]:
    """Baseline: the standard PPO critic recipe as the library can run it: SAO's unbounded critic with its ratio
    band at PPO's epsilon, [0.8, 1.2], and BPCO's GAE alpha, critic steps, warm-up and critic rate, so what
    differs is BPCO's bounded (arctan) critic and DPPO's probability-dependent clip. It is not PPO exactly:
    SAO masks a token outside the band whatever the advantage's sign (PPO's clip zeroes only the side the
    min picks), and its lambda is length-adaptive, not PPO's fixed 0.95."""
    return (Arm("PPO critic (sao, band [0.8, 1.2])", "sao", {"ratio": [0.8, 1.2], **BPCO_AS_SAO}),
            Arm("BPCO", "bpco", {}))


def _grpo(run: ArmContext) -> tuple[Arm, ...]:
    """GRPO's three length weights on the same surrogate: grpo 1/(B T_i) (short replies weigh more per token),
    bnpo 1/N (every token the same), dr_grpo 1/(B max_tokens) (no length bias, no std).

    Every arm's max_tokens is the run's generation cap where the run has one (Dr. GRPO's constant is the
    generation budget; the method's 1024 on builtin:case's 4-token replies made each dr_grpo token's weight
    256 times smaller than grpo's). Only dr_grpo's weight reads it; the loop samples up to the run's cap
    whatever the method's knob says."""
    cap = {} if run.max_tokens is None else {"max_tokens": run.max_tokens}
    return tuple(Arm(loss, "grpo", {"loss_type": loss, **cap}) for loss in ("grpo", "bnpo", "dr_grpo"))


CRITIC = {"critic_learning_rate": BUILTIN_CRITIC_RATE}
PAPERS: dict[str, Recipe] = {r.name: r for r in (
    Recipe("flash_reinforce", "FlashREINFORCE (Hu et al. 2026): the sequence trust gate keeps a stale "
           "one-rollout REINFORCE learning; against the same estimator with the gate off", _flash_reinforce,
           regime=REGIME),
    Recipe("sao", "SAO (Hou et al. 2026): masking tokens whose ratio leaves the band keeps a one-rollout critic "
           "method stable under staleness; against the same critic with the ratio never masked", _sao, CRITIC, REGIME),
    Recipe("bpco", "BPCO (Qi et al. 2026): a critic bounded to the reward range and DPPO's clip beat the "
           "standard PPO critic recipe", _bpco, CRITIC, REGIME),
    Recipe("grpo_loss_types", "GRPO's loss types (grpo, bnpo, Dr. GRPO, Liu et al. 2025): the per-token weight "
           "decides the length bias; bnpo and dr_grpo against grpo", _grpo, regime=REGIME),
)}


RECIPES: dict[str, Recipe] = {**PAPERS, **CONTROLS}
"""every recipe ``wai recipe`` runs: the papers', then the controls (whileai.evidence.controls)"""


def recipe(name: str) -> Recipe:
    """A recipe (a paper's or a control) by name."""
    key = name.strip().lower().replace("-", "_")
    if key not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; the recipes are {', '.join(RECIPES)}")
    return RECIPES[key]
