"""Every method default, declared once, with its paper, equation and the paper's own value.

``DEFAULTS[method_name][knob_name]`` is a ``Knob``. Method classes take their field defaults from
here (``knob(...)`` in ``base.py``); ``wai methods``, the docs and the prime-rl writer read it too.
Where our value differs from the paper's, ``why`` says why.
"""

from __future__ import annotations

from whileai.methods.knobs import Knob, integer, interval, number, one_of

FLASH_REINFORCE = "Hu et al. 2026, FlashREINFORCE (NVIDIA)"
SAO_PAPER = "Hou et al. 2026, SAO, arXiv:2607.07508"
BPCO_PAPER = "Qi et al. 2026, BPCO, arXiv:2608.23566"
SCALE_RL = "ScaleRL, arXiv:2510.13786"

DEFAULTS: dict[str, dict[str, Knob]] = {
    "flash_reinforce": {
        "trust": Knob(0.003, "sequence trust region: a trajectory whose mean per-token Bernoulli KL to the "
                      "sampler exceeds this is dropped whole", number(0.0, open_low=True), f"{FLASH_REINFORCE}, Eq. 8"),
        "off_policy_steps": Knob(8, "largest lag, in optimizer steps, between the sampler and the policy",
                                 integer(0), f"{FLASH_REINFORCE}, experiments (lag 8)"),
        "temperature": Knob(1.0, "sampling temperature the trajectories were drawn at",
                            number(0.0, open_low=True), f"{FLASH_REINFORCE}, experiments"),
        "max_tokens": Knob(8192, "generation cap per trajectory", integer(1), f"{FLASH_REINFORCE}, experiments"),
    },
    "sao": {
        "ratio": Knob((0.7, 6.0), "band (1 - eps_low, 1 + eps_high): a token whose ratio leaves it is masked",
                      interval(0.0), f"{SAO_PAPER}, Eq. 2-3"),
        "gae_alpha": Knob(1.5, "length-adaptive GAE: lambda = 1 - 1/(gae_alpha * L)",
                          number(0.0, open_low=True), f"{SAO_PAPER}, Eq. 5"),
        "critic_steps": Knob(2, "critic updates per policy update", integer(1), f"{SAO_PAPER}, training setup"),
        "critic_warmup": Knob(10, "critic-only updates before the policy moves", integer(0),
                              f"{SAO_PAPER}, training setup"),
        "temperature": Knob(1.0, "sampling temperature", number(0.0, open_low=True), f"{SAO_PAPER}, training setup"),
        "max_tokens": Knob(131072, "generation cap per trajectory", integer(1), f"{SAO_PAPER}, training setup"),
        "critic_learning_rate": Knob(5e-06, "critic learning rate", number(0.0, open_low=True),
                                     f"{SAO_PAPER}, training setup"),
    },
    "bpco": {
        "clip": Knob(0.2, "DPPO clip on probability: the ratio may move within 1 +/- clip / mu_t",
                     number(0.0, open_low=True), f"{BPCO_PAPER}, Eq. 2"),
        "gae_alpha": Knob(0.4, "length-adaptive GAE: lambda = 1 - 1/(gae_alpha * L)",
                          number(0.0, open_low=True), f"{BPCO_PAPER}, Eq. 14"),
        "reward_range": Knob((0.0, 1.0), "(R_min, R_max): the bounded critic's output range", interval(),
                             f"{BPCO_PAPER}, Eq. 9"),
        "critic_warmup": Knob(15, "critic-only updates before the policy moves", integer(0),
                              f"{BPCO_PAPER}, training setup"),
        "temperature": Knob(1.0, "sampling temperature", number(0.0, open_low=True), f"{BPCO_PAPER}, training setup"),
        "max_tokens": Knob(12000, "generation cap per trajectory", integer(1), f"{BPCO_PAPER}, training setup"),
        "lr": Knob(1e-06, "policy learning rate", number(0.0, open_low=True), f"{BPCO_PAPER}, training setup"),
        "critic_lr": Knob(1e-05, "critic learning rate", number(0.0, open_low=True), f"{BPCO_PAPER}, training setup"),
    },
    # --- grouped / async tables (engineer M1) ---
    # --- supervised / distillation / shaping tables (engineer M2) ---
}

__all__ = ["DEFAULTS", "one_of"]
