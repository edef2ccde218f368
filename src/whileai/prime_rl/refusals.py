"""Why prime-rl cannot run a method, as errors that say what is missing and what to do instead.

The writer must never produce a file that trains a different method under this one's name, so a
method prime-rl cannot run is refused with a ``ConfigError`` (a ``ValueError``). Every message has
the same three parts: what the method needs and what prime-rl lacks (with the file in prime-rl),
the nearest thing prime-rl has and why it is a different method, and ``What you can do:``.

Facts are read at the pinned commit (``schema.PINNED``; reference page sections 2, 3 and 8).
"""

from __future__ import annotations

from typing import Any

from whileai.errors import ConfigError
from whileai.prime_rl.schema import PINNED_SHORT

RAE_INSTEAD = ("; or, at one rollout per prompt on prime-rl, write prime_rl_config(env, 'rae', model=..., "
               "**{'orchestrator.group_size': 1}) and call it rae (REINFORCE against an EMA of past rewards, "
               "no critic)")
OWN_LOOP = ("apply method.update(batch) inside your own trainer loop (the coefficients multiply each token's "
            "log-probability gradient; the batch contract is Batch in whileai/rows/batch.py, the result is "
            "Update in whileai/methods/base.py)")
SUPPORTED = "grpo, max_rl, rae, rloo, wai.OPD(teacher), wai.OPSD(...), wai.Async(..., correction='ipo'), wai.SFT()"


def _refuse(method: str, needs: str, nearest: str, instead: str) -> ConfigError:
    return ConfigError(f"prime_rl_config: {method} {needs}. {nearest} What you can do: {instead}.")


def _label(method: Any) -> str:
    return f"wai.{type(method).__name__}"


# --------------------------------------------------------------------- whole methods
CRITIC = ("needs a value model (a critic for GAE advantages), and prime-rl only ever hosts the trainable policy "
          "(prime_rl/configs/algorithm.py, FrozenModelConfig); it has no value network, no GAE, no PPO ratio clip "
          "and one optimizer step per batch (prime_rl/trainer/rl/train.py)")

# registry name -> (what it needs and prime-rl lacks, the nearest thing prime-rl has, what to do instead)
WHOLE_METHODS: dict[str, tuple[str, str, str]] = {
    "flash_reinforce": (
        "needs a baseline from the whole batch's mean reward, a trust region that drops a whole trajectory "
        "whose mean per-token KL to the sampler exceeds trust, and equal weight 1/T_i per trajectory; "
        f"{PINNED_SHORT} has none of the three: its baselines are the group mean (zero over a group of one, "
        "prime_rl/orchestrator/algo/grpo.py) or a running average of past rewards (algo/rae.py), its losses mask "
        "single tokens rather than drop a stale trace (prime_rl/trainer/rl/loss.py), and it normalizes by the "
        "step's total token count",
        "The nearest thing it runs at one rollout per prompt is 'rae' (REINFORCE against an EMA of past "
        "rewards, no trajectory gate), which is a different method.",
        f"{OWN_LOOP}, with behavior_logprobs on each row; or write prime_rl_config(env, 'rae', model=...) and "
        "call it rae"),
    "sao": (
        "needs a value critic, and prime-rl only ever hosts the trainable policy (prime_rl/configs/algorithm.py, "
        "FrozenModelConfig): no value network, so no GAE advantage",
        "The half prime-rl has is a token trust region, and it is not SAO's: at the pinned commit its rl losses "
        "are 'default' and 'ipo' (prime_rl/configs/trainer.py), which mask a token on how far its probability "
        "moved, not on a ratio band (ratio_low, ratio_high), and they sit around a group-mean or EMA baseline, "
        "which is a different method.",
        f"{OWN_LOOP}, with your critic's 'values' on each trajectory{RAE_INSTEAD}"),
    "bpco": (
        "needs a bounded value critic (outputs inside reward_range) for its GAE advantage, and prime-rl only ever "
        "hosts the trainable policy (prime_rl/configs/algorithm.py, FrozenModelConfig): no value network",
        "The half prime-rl has is the probability trust region: its default loss masks a token whose probability "
        "moved more than dppo_mask_low/high (prime_rl/trainer/rl/loss.py), close to BPCO's clip, but around a "
        "group-mean or EMA baseline, which is a different method.",
        f"{OWN_LOOP}, with your critic's 'values' on each trajectory{RAE_INSTEAD}"),
    "ppo": (
        "clips the trainer/sampler ratio of each token to [1 - clip, 1 + clip_high] (the engine's ppo loss), and "
        f"{PINNED_SHORT} never clips the ratio: its losses mask a token on how far its probability moved "
        "(prime_rl/trainer/rl/loss.py)",
        "The nearest thing it runs is 'grpo' with its default loss, the same group-centred advantage under a "
        "different trust region, which is a different method.",
        f"{OWN_LOOP}; or write prime_rl_config(env, 'grpo', model=...) and call it grpo"),
    "dpo": (
        "trains offline on chosen/rejected pairs against a frozen reference, and prime-rl has no preference mode: "
        "its algorithms are grpo, max_rl, rae, hierarchical_grpo, echo, opd, opsd and sft "
        "(prime_rl/configs/algorithm.py), all on-policy, and no frozen reference is kept for a KL term",
        "The separate `uv run sft` entrypoint trains on a dataset, which is SFT, a different method.",
        f"{OWN_LOOP} with ref_logprobs on each row; or, if a program can check the task, "
        "prime_rl_config(env, 'grpo', model=...)"),
    "rm": (
        "trains a scalar reward head on preference pairs, and prime-rl neither trains nor hosts reward models: "
        "every algorithm in prime_rl/configs/algorithm.py trains the policy only, and rewards come from the "
        "taskset's reward functions or a judge configured inside the env (verifiers/v1/configs)",
        "Nothing in prime-rl trains a reward head.",
        f"{OWN_LOOP}; then serve the trained model as a judge inside your taskset's reward function"),
    "groupwise_grading": (
        "ranks the passes of a group with a grader and moves their rewards or advantages by that rank, and "
        "prime-rl has no hook for it: rewards come from the taskset, and advantages from a fixed algorithm class "
        "with no config hook for user code (prime_rl/orchestrator/algo/; the custom advantage was removed)",
        "Its grpo trains on the taskset's rewards as they are, which is a different method.",
        f"put the grader's ranking into the taskset's reward function (that is mode='reward') and write "
        f"'grpo'; or {OWN_LOOP}"),
    "reinforce_ada": (
        "keeps sampling a prompt until its group holds both passes and fails, and prime-rl samples a fixed "
        "group_size per prompt (prime_rl/configs/orchestrator.py)",
        "The nearest thing it has is a curriculum gate (advantage_range) that rejects a unanimous group and asks "
        "for other work, without the balanced stopping rule, which is a different method.",
        f"sample adaptively yourself and {OWN_LOOP}; or write 'grpo' with a larger rollouts_per_prompt"),
}


def whole_method(name: str, method: Any) -> ConfigError:
    """The refusal of a method prime-rl cannot run at all; ``method`` is the object, or the name alone."""
    return _refuse(method if isinstance(method, str) else _label(method), *WHOLE_METHODS[name])


def critic(method: Any) -> ConfigError:
    """Any method that needs a value model (rows with 'values')."""
    return _refuse(method if isinstance(method, str) else _label(method), *CRITIC_REFUSAL)


CRITIC_REFUSAL = (CRITIC, "The nearest thing it runs is 'grpo', a group-mean baseline with no critic, which is a "
                  "different method.", "train it with a critic in your own loop (whileai's engine has a critic "
                  "head); or write prime_rl_config(env, 'grpo', model=...) and call it grpo")


# --------------------------------------------------------------------- a knob value prime-rl cannot run
# knob -> (what that value needs and prime-rl lacks, the nearest thing prime-rl has, what to do instead)
KNOB_VALUES: dict[str, tuple[str, str, str]] = {
    "correction": (
        f"{PINNED_SHORT} has no such loss: [trainer.loss] type is 'default' (DPPO masks plus a log-ratio^2 term), "
        "'ipo' or 'custom' (prime_rl/configs/trainer.py, prime_rl/trainer/rl/loss.py), and the ratio is never "
        "clipped or banded",
        "The nearest correction it has is 'ipo', which masks on how far the probability moved "
        "(|pi - mu| > threshold), not on the ratio, which is a different correction.",
        "write correction='ipo' and call it ipo; or implement the correction as a [trainer.loss] type='custom' "
        f"function of your own (this writer does not emit one); or {OWN_LOOP}"),
    "beta": (
        "adds beta * KL(pi || pi_ref) to a frozen reference, and prime-rl keeps no reference beside reward RL: "
        "its kl_tau is the trainer/inference mismatch term, not a KL to a reference, and a custom loss gets no "
        "ref_logprobs for grpo samples (prime_rl/trainer/rl/loss.py)",
        "Writing it without the term would train beta = 0, which is a different method.",
        f"set beta=0 (DAPO, Dr. GRPO and CISPO all train without it); or {OWN_LOOP}"),
    "loss_type": (
        "divides each advantage by its group's standard deviation, and prime-rl's grpo is reward minus group "
        "mean with no std (prime_rl/orchestrator/algo/grpo.py; std normalization was removed on 2025-11-17, "
        "#1304) and no config hook for another advantage",
        "Without the division it is Dr. GRPO's advantage, which is a different method.",
        "write wai.GRPO(loss_type='dr_grpo') (no std), or 'max_rl' (divides by the group mean); or drop "
        f"strict=True to let the std go to cfg.ignored; or {OWN_LOOP}"),
    "divergence": (
        "needs that divergence between teacher and student, and prime-rl's ref_kl component is fixed: the "
        "sampled-token reverse-KL signal (ref_logprobs - trainer_logprobs) with hard-coded constants and no "
        "config (prime_rl/trainer/rl/loss.py, ref_kl_loss_fn)",
        "Writing it would train divergence='reverse_kl', which is a different method.",
        f"set divergence='reverse_kl'; or {OWN_LOOP}"),
    "privileged": (
        "needs the environment's feedback on the student's own attempt in the teacher's context (SDPO), and "
        "prime-rl's opsd can only prepend a fixed field of the example (demo_key, "
        "prime_rl/orchestrator/algo/opsd.py)",
        "Prepending a static field is a different method.",
        "store the text in the taskset's info and use privileged='hint', 'reference' or 'demonstration'; or "
        f"{OWN_LOOP}"),
}
CORRECTIONS = {"icepop": "masks a token whose trainer/sampler ratio leaves the band ratio=(low, high)",
               "tis": "multiplies each token by its ratio capped at max_ratio (truncated importance sampling)"}


def knob_value(method: Any, knob: str) -> ConfigError:
    """The refusal of the value ``method`` holds in ``knob`` (one of ``KNOB_VALUES``)."""
    value = getattr(method, knob)
    needs, nearest, instead = KNOB_VALUES[knob]
    if knob == "correction":
        needs = f"{CORRECTIONS[value]}, and {needs}"
    return _refuse(f"{_label(method)}({knob}={value!r})", needs, nearest, instead)


# what is missing -> (why prime-rl needs it, what it has instead, what to do)
MISSING: dict[str, tuple[str, str, str]] = {
    "group": (
        "needs at least two rollouts per prompt: its baseline comes from the group, so a group of one has "
        "advantage 0 everywhere (prime-rl aborts after 10 consecutive empty batches, "
        "prime_rl/orchestrator/orchestrator.py)",
        "The one prime-rl baseline that stands at one rollout per prompt is 'rae', an EMA of past rewards.",
        "raise rollouts_per_prompt (or orchestrator.group_size) to 4 or more; or write "
        "prime_rl_config(env, 'rae', model=..., **{'orchestrator.group_size': 1}) and call it rae"),
    "teacher": (
        "without a teacher cannot be written: prime-rl's opd needs [orchestrator.algo.teacher] with the served "
        "model's name and base_url (prime_rl/configs/algorithm.py, FrozenModelConfig), and its launcher never "
        "starts it",
        "There is no self-teacher form of opd.",
        "pass wai.OPD(teacher=wai.Endpoint(base_url='http://host:8001/v1', model='<served name>')) or "
        "teacher=wai.Endpoint(...) to prime_rl_config, serve it with vLLM yourself; or use wai.OPSD for a "
        "self-teacher"),
    "teacher_name": (
        "has no model name, and prime-rl's FrozenModelConfig requires name (prime_rl/configs/algorithm.py): "
        "it is the model the endpoint serves",
        "prime-rl cannot guess it.",
        "set wai.Endpoint(base_url=..., model='<the name the server serves>')"),
    "source": (
        "on prime-rl trains on a frozen model's samples: its sft algorithm needs "
        "[orchestrator.algo.sampling.source] with that model's name and base_url "
        "(prime_rl/configs/algorithm.py), and nothing else (it may not sample the policy)",
        "SFT on rows you already hold is the separate `uv run sft` entrypoint, which this writer does not write.",
        "pass teacher=wai.Endpoint(base_url=..., model=...) for the frozen model; or train on your rows with "
        "whileai's own loop"),
    "mapping": (
        f"has no mapping to {PINNED_SHORT} in this writer",
        "Writing the nearest prime-rl algorithm would train a different method under this name.",
        f"use one of {SUPPORTED}; or {OWN_LOOP}"),
}


def group_of_one(method: Any, group_size: int) -> ConfigError:
    return _refuse(f"{_label(method)} at group_size={group_size}", *MISSING["group"])


def opd_without_teacher(method: Any) -> ConfigError:
    return _refuse(_label(method), *MISSING["teacher"])


def teacher_without_name(where: str) -> ConfigError:
    return _refuse(where, *MISSING["teacher_name"])


def sft_without_source(method: Any) -> ConfigError:
    return _refuse(_label(method), *MISSING["source"])


def no_mapping(label: str) -> ConfigError:
    return _refuse(label, *MISSING["mapping"])


def vocab_mismatch(teacher_vocab: int, student_vocab: int, model: str) -> ConfigError:
    return _refuse(
        "wai.OPD",
        f"needs one tokenizer on both sides, and the teacher's vocabulary ({teacher_vocab}) differs from "
        f"{model!r}'s ({student_vocab}): prime-rl's teacher scores the policy's own token ids "
        "(prime_rl/utils/client.py, InferencePool.score) and nothing checks that they mean the same text",
        "A teacher with another tokenizer scores the wrong tokens and the signal is lost silently "
        "(SimCT, arXiv:2605.07711).",
        "pick a same-family teacher (equal len(tokenizer)); or train SFT on the teacher's completions "
        "(wai.SFT() with teacher=wai.Endpoint(...): the student's renderer re-tokenizes them)",
    )


def strict(label: str, reason: str) -> ConfigError:
    return _refuse(
        label,
        f"cannot be honoured by {PINNED_SHORT}: {reason}",
        "With strict=True the writer refuses rather than leave a knob unread.",
        "drop strict=True to write the config with this knob in cfg.ignored; or set the knob to a value "
        "prime-rl runs",
    )


def unknown(name: str, valid: list[str]) -> ConfigError:
    return ConfigError(f"prime_rl_config: unknown method {name!r}; the writer knows {SUPPORTED} "
                       f"and refuses the rest with a reason; method names: {', '.join(valid)}")
