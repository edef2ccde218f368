"""The controls of the recipe machinery: recipes whose true answer is known, run through ``wai recipe``.

* ``null``: two identical arms (FlashReinforce at its defaults) whose runs differ only in their seed (the recipe
  arm trains at seed + NULL_OFFSET). The true delta is 0, so over repeats (``wai recipe null --repeats R``) its
  verdict must be "unresolved" at least 95% of the time: the false "shown" rate of ``compare``'s seed-paired
  verdict on real training runs, as ``whileai.evidence.calibration`` gives it on simulated ones.
"""

from __future__ import annotations

from whileai.evidence.runner import Arm, ArmContext, Recipe

NULL_OFFSET = 1000  # the null's recipe arm trains at seed + 1000: a seed no recipe's baseline uses by default


def _null(run: ArmContext) -> tuple[Arm, ...]:
    """Baseline and recipe arm: FlashReinforce at its defaults (off_policy_steps raised to the lag when longer),
    the recipe arm at another seed: another initialisation, warm start, task order and sampler seeds."""
    knobs = {"off_policy_steps": max(8, run.lag)}
    return (Arm("FlashReinforce", "flash_reinforce", knobs),
            Arm("FlashReinforce, another seed", "flash_reinforce", knobs, seed_offset=NULL_OFFSET))


NO_BASELINE_DECAY = 1.0 - 1e-12
"""RAE's decay with which its running baseline never leaves its start, 0: b <- decay b + (1 - decay) R moves b by
1e-12 of a reward per row, so A = R (REINFORCE without a baseline)"""


def _baseline(run: ArmContext) -> tuple[Arm, ...]:
    """Baseline arm: REINFORCE without a baseline (RAE whose running baseline stays 0, so A = R >= 0 and every
    sampled reply is pushed up). Recipe arm: RAE's running mean of the rewards (decay 0.95, about the last 20
    rows: a batch mean at one rollout per prompt). The same surrogate, clip and 1/(B T_i) weight; only the
    baseline differs (Williams 1992: a baseline leaves the gradient unbiased and cuts its variance)."""
    return (Arm("no baseline", "rae", {"decay": NO_BASELINE_DECAY}),
            Arm("running-mean baseline", "rae", {}))


NEVER = 1e300  # a clip no ratio reaches: the surrogate is never clipped


def _clip(run: ArmContext) -> tuple[Arm, ...]:
    """Baseline arm: GRPO's surrogate with its ratio never clipped (clip = 1e300), trained on stale rollouts.
    Recipe arm: GRPO at its clip, 0.2. The same group baseline, std division and 1/(B T_i) weight; only the clip
    differs (Schulman et al. 2017, Table 1: no clipping scored -0.39 against clipping at 0.2's 0.82)."""
    return (Arm("no clip", "grpo", {"clip": NEVER}), Arm("clip 0.2", "grpo", {}))


CONTROLS: dict[str, Recipe] = {r.name: r for r in (
    Recipe("null", "null control: two identical arms (FlashReinforce) whose runs differ only in their seed; the "
           "true delta is 0, so the verdict must read unresolved (at least 95% of repeats)", _null),
    Recipe("baseline", "positive control: REINFORCE with a baseline (a running mean of the rewards) against the "
           "same update without one, at one rollout per prompt (Williams 1992; SPIRAL's RAE, Liu et al. 2025)",
           _baseline),
    Recipe("clip", "positive control: PPO's clipped ratio against the same surrogate unclipped, on stale rollouts "
           "(Schulman et al. 2017, Table 1)", _clip),
)}
