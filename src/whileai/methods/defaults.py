"""Every method default, declared once, with its paper, equation and the paper's own value.

``DEFAULTS[method_name][knob_name]`` is a ``Knob``. Method classes take their field defaults from
here (``knob(...)`` in ``base.py``); ``wai methods``, the docs and the prime-rl writer read it too.
Where our value differs from the paper's, ``why`` says why.
"""

from __future__ import annotations

from whileai.knobs import Knob, anything, integer, interval, number, one_of, optional

FLASH_REINFORCE = "Hu et al. 2026, FlashREINFORCE (NVIDIA)"
SAO_PAPER = "Hou et al. 2026, SAO, arXiv:2607.07508"
BPCO_PAPER = "Qi et al. 2026, BPCO, arXiv:2608.23566"
SCALE_RL = "ScaleRL, arXiv:2510.13786"
GRPO_PAPER = "Shao et al. 2024, DeepSeekMath (GRPO), arXiv:2402.03300"
PPO_PAPER = "Schulman et al. 2017, PPO, arXiv:1707.06347"
DAPO_PAPER = "Yu et al. 2025, DAPO, arXiv:2503.14476"
RLOO_PAPER = "Ahmadian et al. 2024, Back to Basics (RLOO), arXiv:2402.14740"
MAX_RL_PAPER = "MaxRL, arXiv:2602.02710"
SPIRAL_PAPER = "Liu et al. 2025, SPIRAL, arXiv:2506.24119"
ICEPOP_PAPER = "Ring-1T (IcePop), arXiv:2510.18855"
DUAL_CLIP_PAPER = "Ye et al. 2020, Mastering Complex Control in MOBA Games (dual-clip PPO), arXiv:1912.09729"
# supervised, distillation and shaping sources
SFT_SOURCE = "methods reference, L_SFT"
DPO_PAPER = "Rafailov et al. 2023, DPO, arXiv:2305.18290"
OUYANG_PAPER = "Ouyang et al. 2022, InstructGPT, arXiv:2203.02155"
PICK_GUIDE = "pick-a-method guide, question 1"
GKD_PAPER = "Agarwal et al. 2023, GKD, arXiv:2306.13649"
TOPK_OPD_PAPER = "Li et al. 2026, arXiv:2604.13016; Fu et al. 2026, arXiv:2603.25562"
THINKING_MACHINES_OPD = "Thinking Machines 2025, On-Policy Distillation"
SDFT_PAPER = "Shenfeld et al. 2026, SDFT, arXiv:2601.19897"
SDPO_PAPER = "Huebotter et al. 2026, SDPO, arXiv:2601.20802"
OPSD_REFERENCE_PAPER = "Zhao et al. 2026, arXiv:2601.18734"
MIMO_PAPER = "LLM-Core Xiaomi 2026, MiMo-V2.6 (GRS / GAR), section 4.3"
# the report itself was not reachable here; its formulas were read in a page-cited reading of the PDF:
MIMO_READ = "read in github.com/xiaofengShi/paper-reading-skill, examples/mimo-v2.6-deep-read.md"
REINFORCE_ADA_PAPER = "Xiong et al. 2025, Reinforce-Ada, arXiv:2510.04996"
REINFORCE_ADA_CODE = "RLHFlow/Reinforce-Ada (verl), scripts/run_reinforce_ada.sh"
REINFORCE_ADA_SAMPLER = ("RLHFlow/Reinforce-Ada, ray_trainer.py _generate_multi_round_adaptive_downsampling; "
                         "RLHFlow/Reinforce-Ada-Tinker, rl/adaptive_sampling.py")

# The clipped surrogate's two optional ends, shared by every method that uses it (GRPO, DrGRPO, RLOO,
# MaxRL, RAE, ReinforceAda): declared once here, placed in each method's table below.
CLIP_HIGH = Knob(None, "DAPO clip-higher: the upper end of the clip band is 1 + clip_high instead of 1 + clip "
                 "(None: symmetric, 1 + clip)", optional(number(0.0, open_low=True), "symmetric"),
                 f"{DAPO_PAPER}, section 3.1 (clip-higher, eps_high = 0.28); TRL epsilon_high, verl clip_ratio_high",
                 paper_value=0.28,
                 why="None keeps PPO's symmetric band, the default of TRL (epsilon_high=None) and verl "
                 "(clip_ratio_high = clip_ratio_low = 0.2); DAPO raises the upper end so unlikely tokens can grow")
DUAL_CLIP = Knob(None, "dual clip for A < 0: a token whose ratio is above dual_clip carries 0 (its loss is capped at "
                 "-dual_clip * A); None: off", optional(number(1.0, open_low=True), "off"),
                 f"{DUAL_CLIP_PAPER} (the bound c > 1 for A < 0); verl clip_ratio_c = 3.0, OpenRLHF "
                 "--actor.dual_clip (None)", paper_value=None,
                 why="off so the surrogate is the one the GRPO, RLOO and MaxRL papers state, as OpenRLHF's default; "
                 "verl applies it in its default loss with clip_ratio_c = 3.0 (dual_clip=3.0 matches verl); the "
                 "paper's own c was not in what we could read")
# The sampling knobs of the methods that sample as GRPO does (RLOO, MaxRL, RAE, REINFORCE++, CustomLoss).
AS_GRPO_MAX_TOKENS = Knob(1024, "generation cap per trajectory", integer(1), "as GRPO's max_tokens")
AS_GRPO_TEMPERATURE = Knob(1.0, "sampling temperature", number(0.0, open_low=True), "as GRPO's temperature")
AS_GRPO_CLIP = Knob(0.2, "PPO clip on the ratio (same surrogate as GRPO)", number(0.0, open_low=True),
                    f"{PPO_PAPER}, Eq. 7")
# GRPO's surrogate ends and sampling, in the rows of the group baselines that share them (RLOO, MaxRL, RAE)
AS_GRPO = {"clip_high": CLIP_HIGH, "dual_clip": DUAL_CLIP, "max_tokens": AS_GRPO_MAX_TOKENS,
           "temperature": AS_GRPO_TEMPERATURE}
SPEC_SERVICE = "training service page, 'More algorithms' (spec 004)"
REINFORCE_PP_PAPER = "Hu 2025, REINFORCE++, arXiv:2501.03262"
PPO_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "gspo")
# Which engine loss the step runs, shared by every grouped method (GRPO, DrGRPO, RLOO, MaxRL and the service
# page's algorithms): declared once here, placed in each method's table below.
LOSS = Knob("cross_entropy", "the engine loss the step runs: 'cross_entropy' sends the coefficients c as weights "
            "(ratio and clip computed from the rows); 'importance_sampling', 'ppo', 'cispo' or 'gspo' send the "
            "advantages with the sampler's logprobs and the engine takes the live ratio in the graph, with clip / "
            "clip_high as the bounds 1 - clip, 1 + clip_high", one_of(*PPO_LOSSES),
            f"{SPEC_SERVICE}: one build_loss per engine loss")


def loss_knob(value: str, source: str) -> Knob:
    """The ``loss`` knob of a method that runs ``value`` by default."""
    return Knob(value, LOSS.doc, LOSS.check, source)


# OPD's and OPSD's engine-loss form (the service page's opd.py / opsd.py / sdpo.py), declared once.
DISTILL_LOSS = Knob("cross_entropy", "the engine loss the step runs: 'cross_entropy' sends c; 'importance_sampling' "
                    "sends the advantage kl_coef * (teacher - behavior_logprobs) and the engine takes the ratio "
                    "(reverse_kl only, max_ratio None: the service page's opd.py)",
                    one_of("cross_entropy", "importance_sampling"), f"{SPEC_SERVICE} (opd.py, opsd.py, sdpo.py)")
DISTILL_KL_COEF = Knob(1.0, "scale of every coefficient (of the teacher gap, in the service form)",
                       number(0.0, open_low=True), "Tinker cookbook distillation kl_penalty_coef default 1.0")
# Distillation under a stale sampler: each token's c is multiplied by min(rho, max_ratio).
DISTILL_MAX_RATIO_SOURCE = ("TRL experimental self-distillation (SDFT / SDPO), distillation_is_clip = 2.0: the "
                            "per-token loss times min(rho, 2)")

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
                      interval(0.0, contains=1.0, strictly=True), f"{SAO_PAPER}, Eq. 2-3"),
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
        "learning_rate": Knob(1e-06, "policy learning rate", number(0.0, open_low=True), f"{BPCO_PAPER}, training setup"),
        "critic_learning_rate": Knob(1e-05, "critic learning rate", number(0.0, open_low=True), f"{BPCO_PAPER}, training setup"),
    },
    # --- the group baselines and the async wrapper ---
    "grpo": {
        "rollouts_per_prompt": Knob(8, "k: rollouts sampled per prompt; rows sharing a task_id form one group", integer(1),
                            f"{GRPO_PAPER}, section 4.2 (64 samples per question)", paper_value=64,
                            why="8 is the spec's and TRL's default (num_generations=8); DeepSeekMath's 64 costs "
                            "8x the sampling per prompt"),
        "clip": Knob(0.2, "PPO clip: the ratio may move within [1 - clip, 1 + clip] before its token stops "
                     "pushing (the upper end is 1 + clip_high when that is set)", number(0.0, open_low=True),
                     f"{PPO_PAPER}, Eq. 7 (GRPO keeps PPO's epsilon)"),
        "clip_high": CLIP_HIGH,
        "dual_clip": DUAL_CLIP,
        "beta": Knob(0.0, "weight of the k3 KL to the reference (needs ref_logprobs on every row when > 0)",
                     number(0.0), f"{GRPO_PAPER}, Eq. 3-4", paper_value=0.04,
                     why="DAPO (arXiv:2503.14476), Dr. GRPO (arXiv:2503.20783) and CISPO all train without "
                     "the KL term, and it needs a reference forward pass per batch"),
        "loss_type": Knob("grpo", "length weight w_i: 'grpo' 1/(B*T_i), 'bnpo' 1/N, 'dr_grpo' 1/(B*max_tokens) "
                          "and no std", one_of("grpo", "bnpo", "dr_grpo"), f"{GRPO_PAPER}, Eq. 3 (1/G * 1/|o_i|)"),
        "truncated": Knob("mask", "a reply cut at max_tokens: 'mask' gives it c = 0 and leaves it out of its "
                          "group's statistics; 'zero' scores it R = 0; 'keep' trains it on its graded reward like "
                          "any other", one_of("mask", "zero", "keep"),
                          f"{DAPO_PAPER}, section 3.4 (overlong filtering: a truncated sample's loss is masked; "
                          "DeepSeekMath itself scores a cut reply like any other, R = 0)"),
        "max_tokens": Knob(1024, "generation cap per trajectory; also L_max in dr_grpo's weight", integer(1),
                           f"{GRPO_PAPER}, section 4.2 (max length 1024)"),
        "temperature": Knob(1.0, "sampling temperature the trajectories were drawn at",
                            number(0.0, open_low=True), "TRL GRPOConfig (temperature=1.0)"),
        "loss": LOSS,
    },
    "dr_grpo": {
        "loss_type": Knob("dr_grpo", "fixed for DrGRPO: A = R - mean (no std) and w_i = 1/(B*max_tokens); use "
                          "GRPO(loss_type=...) for the other weights", one_of("dr_grpo"),
                          "Liu et al. 2025, Dr. GRPO, arXiv:2503.20783, section 3 (unbiased optimization)"),
        "length": Knob("max_tokens", "the one length every advantage is divided by: 'max_tokens' L_max (the paper), "
                       "'own' each trajectory's T_i (the service page's drgrpo.py), 'none' 1 (its grpo_nostd.py)",
                       one_of("max_tokens", "own", "none"),
                       f"Liu et al. 2025, arXiv:2503.20783 ('own' and 'none': {SPEC_SERVICE})"),
    },
    "rloo": {
        "rollouts_per_prompt": Knob(8, "k: rollouts per prompt; each is judged against the mean of the other k - 1",
                            integer(1), f"{RLOO_PAPER}, experiments (k = 2 and 4)", paper_value=4,
                            why="kept equal to GRPO's k so the two compare at the same sampling cost"),
        "clip": Knob(0.2, "PPO clip on the ratio (same surrogate as GRPO)", number(0.0, open_low=True),
                     f"{PPO_PAPER}, Eq. 7", paper_value=None,
                     why="the paper runs on-policy REINFORCE without a clip; we share GRPO's surrogate so a "
                     "stale batch is handled the same way"),
        **AS_GRPO,
        "loss": LOSS,
    },
    "max_rl": {
        "rollouts_per_prompt": Knob(8, "k: rollouts per prompt; a group whose mean reward is 0 carries nothing",
                            integer(1), f"{MAX_RL_PAPER}; k as GRPO's rollouts_per_prompt"),
        "clip": AS_GRPO_CLIP,
        **AS_GRPO,
        "loss": LOSS,
        "estimator": Knob("mean", "'mean': A = (R - mean) / mean (the paper); 'beat_the_best': A_i = R_i minus the "
                          "best other reward of the group (the service page's maxrl.py)",
                          one_of("mean", "beat_the_best"), f"{MAX_RL_PAPER} ('beat_the_best': {SPEC_SERVICE})"),
    },
    "rae": {
        "decay": Knob(0.95, "per-agent running baseline: b <- decay * b + (1 - decay) * R, in batch order",
                      number(0.0, 1.0, open_high=True), f"{SPIRAL_PAPER}, role-conditioned advantage estimation; "
                      "prime-rl algo 'rae' (decay = 0.95)"),
        "rollouts_per_prompt": Knob(1, "rollouts per prompt; the running baseline works at one", integer(1),
                            f"{SPIRAL_PAPER}; prime-rl 'rae' accepts any group_size, including 1"),
        "clip": AS_GRPO_CLIP,
        **AS_GRPO,
    },
    "async": {
        "correction": Knob("ipo", "per-token sampler/trainer correction: 'ipo' masks |pi - mu| > threshold, "
                           "'icepop' masks a ratio outside the band, 'tis' caps the ratio at max_ratio",
                           one_of("ipo", "icepop", "tis"), "prime-rl trainer.loss type 'ipo' (its masking default "
                           "family); Yao et al. 2025 for the three corrections"),
        "off_policy_steps": Knob(8, "largest lag, in optimizer steps, between the sampler and the policy",
                                 integer(0), f"{SCALE_RL}, off-policy bound 8; prime-rl max_off_policy_steps = 8"),
        "threshold": Knob(0.3, "ipo: a token is masked when its probability moved more than this",
                          number(0.0, 1.0, open_low=True), "methods reference, Staleness (Yao et al. 2025, "
                          "epsilon = 0.3)", paper_value=0.3,
                          why="prime-rl's own ipo_threshold default is 0.1; the spec's 0.3 is used here"),
        "ratio": Knob((0.5, 5.0), "icepop: the band [low, high] a token's ratio must stay inside",
                      interval(0.0, contains=1.0), f"{ICEPOP_PAPER}; OpenRLHF is_correction thresholds [0.5, 5.0]"),
        "max_ratio": Knob(2.0, "tis: the cap on the ratio inside c", number(1.0),
                          "verl rollout_correction TIS; Yao et al. 2025 (C = 2)"),
    },
    # --- supervised, distillation and shaping ---
    "sft": {
        "normalize": Knob("sum", "normalizer inside c: 'sum' c = 1 (the reference's L_SFT), 'token_mean' c = 1/N, "
                          "'sequence_mean' c = 1/(B*T_i)", one_of("sum", "token_mean", "sequence_mean"),
                          f"{SFT_SOURCE} (a plain sum over kept tokens)"),
    },
    "dpo": {
        "beta": Knob(0.1, "strength of the implicit KL to the reference: z = beta * (policy margin - reference "
                     "margin)", number(0.0, open_low=True), f"{DPO_PAPER}, Eq. 7 (beta = 0.1 in its experiments)"),
        "pass_reward": Knob(1.0, "a row with reward >= this is a pass (chosen); below it a fail (rejected); used "
                            "only when rows carry no explicit 'pair'/'chosen'", number(),
                            f"{PICK_GUIDE} (a pass is reward >= 1.0)"),
    },
    "rm": {
        "pass_reward": Knob(1.0, "a row with reward >= this is a pass (chosen); below it a fail (rejected); used "
                            "only when rows carry no explicit 'pair'/'chosen'", number(),
                            f"{PICK_GUIDE} (a pass is reward >= 1.0); Bradley-Terry as in {OUYANG_PAPER}, Eq. 1"),
    },
    "opd": {
        "top_k": Knob(32, "K: teacher slots per position in the top-k form (the rows' K when smaller)", integer(1),
                      f"{TOPK_OPD_PAPER}; methods reference, OPD defaults"),
        "rollouts_per_prompt": Knob(4, "student rollouts per prompt the loop draws (no group is formed)", integer(1),
                        f"{THINKING_MACHINES_OPD}; methods reference, OPD defaults"),
        "divergence": Knob("reverse_kl", "per-token divergence: 'reverse_kl' KL(student || teacher), 'forward_kl' "
                           "KL(teacher || student), 'jsd' Jensen-Shannon (beta = 0.5)",
                           one_of("reverse_kl", "forward_kl", "jsd"), f"{GKD_PAPER}, section 3 (divergences)"),
        "max_ratio": Knob(2.0, "stale sampler: every token's c is multiplied by min(rho, max_ratio), rho = "
                          "exp(logprobs - behavior_logprobs) (None: by rho uncapped)",
                          optional(number(1.0), "uncapped"), DISTILL_MAX_RATIO_SOURCE, paper_value=None,
                          why="tinker-cookbook's on-policy distillation trains with the importance_sampling loss, "
                          "rho uncapped (max_ratio=None); the cap keeps one token the sampler thought unlikely from "
                          "outweighing the rest of the batch"),
        "temperature": Knob(1.0, "sampling temperature, the same on both sides so the teacher scores the "
                            "distribution the student drew from", number(0.0, open_low=True),
                            "methods reference, OPD defaults"),
        "max_tokens": Knob(8192, "generation cap per student rollout", integer(1), "whileai default",
                           paper_value=None, why="the papers tie the cap to their tasks; 8192 matches "
                           "FlashReinforce's cap"),        "loss": DISTILL_LOSS,
        "kl_coef": DISTILL_KL_COEF,
    },
    "opsd": {
        "privileged": Knob("reference", "what the teacher copy sees that the student does not: 'reference' answer, "
                           "a passing 'demonstration', a 'hint', or the environment's 'feedback'",
                           one_of("reference", "demonstration", "hint", "feedback"),
                           f"{OPSD_REFERENCE_PAPER} ('reference'); {SDFT_PAPER} ('demonstration'); "
                           f"{SDPO_PAPER} ('feedback')"),
        "anchor": Knob("ema:0.01", "teacher weights: 'ema:<rate>' a moving average theta_bar <- (1 - rate) "
                       "theta_bar + rate theta, 'initial' the frozen start, 'live' the current student",
                       anything("'ema:<rate>' with 0 < rate <= 1, 'initial' or 'live'"),
                       f"{SDFT_PAPER} (EMA teacher, rate 0.01); {OPSD_REFERENCE_PAPER} ('initial')"),
        "top_k": Knob(32, "K: teacher slots per position in the top-k form", integer(1),
                      f"{TOPK_OPD_PAPER}; methods reference, OPD defaults"),
        "rollouts_per_prompt": Knob(1, "student rollouts per prompt; there is no group to form", integer(1),
                        f"{SDFT_PAPER}; methods reference, OPSD"),
        "divergence": Knob("reverse_kl", "per-token divergence (as OPD's)", one_of("reverse_kl", "forward_kl", "jsd"),
                           f"{SDFT_PAPER}; {GKD_PAPER}, section 3"),
        "max_ratio": Knob(2.0, "stale sampler: every token's c is multiplied by min(rho, max_ratio) (as OPD's; None: "
                          "by rho uncapped)", optional(number(1.0), "uncapped"), DISTILL_MAX_RATIO_SOURCE),
        "temperature": Knob(1.0, "sampling temperature, the same on both sides", number(0.0, open_low=True),
                            "methods reference, OPD defaults"),
        "max_tokens": Knob(8192, "generation cap per student rollout", integer(1), "whileai default",
                           paper_value=None, why="as OPD's max_tokens"),        "loss": DISTILL_LOSS,
        "kl_coef": DISTILL_KL_COEF,
    },
    # --- the service page's algorithms (spec 004): Dr. GRPO's advantage under an engine loss, DAPO, REINFORCE++
    "ppo": {
        "loss": loss_knob("ppo", f"{SPEC_SERVICE} (ppo.py: group-relative advantages, no critic)"),
        "length": Knob("none", "as DrGRPO's length (none: the advantage as it is)", one_of("max_tokens", "own", "none"),
                       f"{SPEC_SERVICE} (ppo.py)"),
        "truncated": Knob("keep", "as GRPO's truncated", one_of("mask", "zero", "keep"), f"{SPEC_SERVICE} (ppo.py "
                          "trains every completion)"),
    },
    "cispo": {
        "loss": loss_knob("cispo", f"{SPEC_SERVICE} (cispo.py)"),
        "clip": Knob(1.0, "lower bound 1 - clip of the held-constant ratio", number(0.0, open_low=True),
                     "Tinker tutorial 202 (one-sided 0.0 / 4.0); MiniMax-M1, arXiv:2506.13585"),
        "clip_high": Knob(3.0, "upper bound 1 + clip_high of the held-constant ratio", CLIP_HIGH.check,
                          "Tinker tutorial 202 (one-sided 0.0 / 4.0)"),
    },
    "gspo": {
        "loss": loss_knob("gspo", f"{SPEC_SERVICE} (gspo.py)"),
    },
    "dppo": {
        "loss": Knob("dppo", "fixed for DPPO: the engine's dppo loss", one_of("dppo"), f"{SPEC_SERVICE} (dppo.py)"),
        "delta_low": Knob(0.2, "divergence bound for negative advantages", number(0.0),
                          "arXiv:2602.04879, as SkyRL (delta_low 0.2)"),
        "delta_high": Knob(0.2, "divergence bound for positive advantages", number(0.0),
                           "arXiv:2602.04879, as SkyRL (delta_high 0.2)"),
        "divergence": Knob("binary_tv", "the mask's divergence, sent as dppo_type", one_of("binary_tv", "binary_kl"),
                           "arXiv:2602.04879, as SkyRL (binary_tv)"),
    },
    "sapo": {
        "loss": Knob("sapo", "fixed for SAPO: the engine's sapo loss", one_of("sapo"), f"{SPEC_SERVICE} (sapo.py)"),
        "tau_pos": Knob(1.0, "gate temperature for A > 0", number(0.0, open_low=True), "arXiv:2511.20347, as SkyRL"),
        "tau_neg": Knob(1.05, "gate temperature for A <= 0", number(0.0, open_low=True), "arXiv:2511.20347, as SkyRL"),
    },
    "dapo": {
        "clip_high": Knob(0.28, CLIP_HIGH.doc, CLIP_HIGH.check, f"{DAPO_PAPER}, section 3.1 (eps_high = 0.28)"),
        "loss_type": Knob("bnpo", "as GRPO's loss_type; 'bnpo' is DAPO's token-level normalization (Eq. 8)",
                          one_of("grpo", "bnpo", "dr_grpo"), f"{DAPO_PAPER}, Eq. 8"),
        "loss": loss_knob("ppo", f"{SPEC_SERVICE} (dapo.py: loss ppo with the clip-higher bounds)"),
        "min_retained": Knob(2, "fewest untruncated rollouts a group keeps; fewer asks the loop for more (up to "
                             "max_rounds rounds), and a group still short carries nothing", integer(1),
                             f"{SPEC_SERVICE} (dapo.py MIN_GROUP_SIZE); 2 is the least a baseline needs"),
        "max_rounds": Knob(4, "resampling rounds per group before it is dropped", integer(0),
                           "whileai: bounds the extra sampling per step"),
        "dynamic_sampling": Knob(True, "a group whose kept rewards are all equal is not admitted (and its tokens "
                                 "leave the 1/N normalizer)", one_of(True, False), f"{DAPO_PAPER}, section 3.2"),
    },
    "reinforce_pp": {
        "rollouts_per_prompt": Knob(8, "k: rollouts per prompt (the group of kl_in='token')", integer(1),
                            "as GRPO's rollouts_per_prompt"),
        "kl_coef": Knob(0.01, "beta: weight of the K2 penalty 1/2 (log pi - log pi_ref)^2", number(0.0),
                        "OpenRLHF --algo.kl.init_coef default 0.01 (reference/peers.md)"),
        "kl_in": Knob("return", "'return': the penalty summed into the return-to-go, then z-scored over the batch's "
                      "tokens (the paper); 'token': the group-centred reward minus the token's penalty (the service "
                      "page's reinforce_pp.py)", one_of("return", "token"),
                      f"{REINFORCE_PP_PAPER} ('token': {SPEC_SERVICE})"),
        "max_tokens": AS_GRPO_MAX_TOKENS,
        "temperature": AS_GRPO_TEMPERATURE,
    },
    "custom_loss": {
        "loss": Knob("importance_sampling", "the engine loss the function's advantages go through ('cross_entropy': "
                     "they are the coefficients)", one_of(*PPO_LOSSES), f"{SPEC_SERVICE} (build_loss)"),
        "clip": Knob(0.2, "ppo / cispo / gspo: the bounds 1 - clip, 1 + clip_high", number(0.0, 1.0, open_low=True),
                     f"{PPO_PAPER}, Eq. 7"),
        "clip_high": CLIP_HIGH,
        "rollouts_per_prompt": Knob(1, "rollouts per prompt the loop samples", integer(1), "whileai default"),
        "temperature": AS_GRPO_TEMPERATURE,
        "max_tokens": AS_GRPO_MAX_TOKENS,
    },
    "groupwise_grading": {
        "mode": Knob("reward", "'reward' (GRS, Eq. 2): each pass's reward is multiplied by its quality factor f "
                     "before the grouped method runs; 'advantage' (GAR, Eq. 3): the positive advantages of a group's "
                     "passes are redistributed in proportion to f A, their total kept",
                     one_of("reward", "advantage"), f"{MIMO_PAPER}, Eq. 2-3 ({MIMO_READ})"),
        "scores": Knob("rank", "what the grader returns: 'rank' any finite score, higher is better, turned into "
                       "f = 1 - spread * h / (n_p - 1) (h = passes of the group that outscore it); 'factor' the "
                       "quality factor f in [0, 1] itself", one_of("rank", "factor"),
                       "pick-a-method guide, 'Saturated: every task passes' (GroupwiseGrading ranks the passes)",
                       paper_value="factor",
                       why="the guide's grader only ranks passes; the paper's graders return rubric scores, which "
                       "scores='factor' takes as they are"),
        "spread": Knob(0.5, "scores='rank': the worst pass of a group gets factor 1 - spread, the best 1",
                       number(0.0, 1.0, open_low=True, open_high=True), "whileai (rank to factor map)",
                       paper_value=None, why="the paper grades with rubric scores, not ranks, so it has no such "
                       "knob; 0.5 keeps the worst pass of a 0/1-reward group (reward 0.5 in GRS) above every fail"),
        "cap": Knob(2.0, "GAR: the largest lam = sum_P A / sum_P f A, the factor the passes' positive advantages "
                    "are scaled by; when it binds, the group is re-centred", number(1.0),
                    f"{MIMO_PAPER}, Eq. 3 (the cap on the amplification factor)", paper_value=None,
                    why="the paper caps lam but its value was not in what we could read; 2.0 lets the best pass "
                    "of two take at most twice its advantage"),
        "pass_reward": Knob(1.0, "a row with reward >= this is a pass, and only passes are graded", number(),
                            f"{PICK_GUIDE} (a pass is reward >= 1.0)"),
    },
    "reinforce_ada": {
        "exit": Knob("balance", "when a prompt stops being sampled: 'balance' once it holds group_size // 2 passes "
                     "and group_size - group_size // 2 fails, 'pos' once it holds one pass", one_of("balance", "pos"),
                     f"{REINFORCE_ADA_PAPER}, Reinforce-Ada-balance / -pos; {REINFORCE_ADA_CODE} "
                     "(reinforce_ada_choice='balanced')"),
        "group_size": Knob(4, "n: rows per prompt kept for the update, n // 2 passes first when there are "
                           "enough", integer(2), f"{REINFORCE_ADA_CODE} (rollout.n = 4, the final group kept)"),
        "round_size": Knob(8, "rollouts drawn per active prompt per sampling round", integer(1),
                           f"{REINFORCE_ADA_SAMPLER} (round_repeat = samples_per_round = 8)"),
        "max_rounds": Knob(4, "rounds after which a prompt stops being sampled even without exit (with "
                           "round_size 8: at most 32 rollouts)", integer(1),
                           f"{REINFORCE_ADA_SAMPLER} (max_rounds = 4)"),
        "pass_reward": Knob(1.0, "a row with reward >= this is a pass", number(),
                            f"{PICK_GUIDE} (a pass is reward >= 1.0)", paper_value=0.7,
                            why="the authors' sampler counts reward > 0.7 as positive (positive_threshold); for "
                            "0/1 rewards both split passes and fails the same"),
        "divide_by_std": Knob(True, "divide A = R - mean (over every row sampled for the prompt) by that pool's "
                              "sample std", one_of(False, True),
                              f"{REINFORCE_ADA_CODE} (global_stat_est=True, norm_adv_by_std_in_grpo=False)",
                              paper_value=False,
                              why="the authors' code can divide (the repo README: global statistics for 'the mean "
                              "and std') but their run turns it off while their GRPO baseline keeps it; ours keeps "
                              "wai.GRPO's std division so the two differ only in sampling, kept group and baseline, "
                              "and learning rates carry over (the toy policy at lr 5 for 30 steps reaches reward 0.6 "
                              "with it, 0.36 without); divide_by_std=False is the authors' run"),
        "clip": Knob(0.2, "PPO clip of the grouped update on the kept rows (the upper end is 1 + clip_high when "
                     "that is set)", number(0.0, open_low=True), f"{REINFORCE_ADA_CODE} (clip_ratio_low)"),
        "clip_high": Knob(None, CLIP_HIGH.doc, CLIP_HIGH.check, f"{REINFORCE_ADA_CODE} (clip_ratio_high = 0.28); "
                          f"{DAPO_PAPER}, section 3.1", paper_value=0.28,
                          why="the authors' verl run clips above at 0.28 (clip-higher, a setting of their GRPO "
                          "baseline too, not of Reinforce-Ada); None keeps wai.GRPO's symmetric default so the two "
                          "compare; clip_high=0.28 is the authors' run"),
        "dual_clip": DUAL_CLIP,
    },
}

__all__ = ["DEFAULTS", "one_of"]
