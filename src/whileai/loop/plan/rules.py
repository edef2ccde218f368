"""The rules that fill a run's settings from its inputs when nobody set them: each a pure function of facts
about the taskset and the model, returning ``(value, source)`` where ``source`` is one sentence a console and
summary.json can print ("... because ...").

Precedence (the run plan applies it; these functions are its last link): a flag or the config file, then the
method's declared value (its paper), then the taskset's ``Recommended`` (built-in tasksets, measured), then
the rule here. The measurements behind every constant are in docs/tasksets.md, "Your own taskset: the
defaults and how they were chosen".

| setting | rule |
|---|---|
| warm-start steps | a random-init model on a taskset whose every train task has a reference answer: ``WARM_START_STEPS``; else 0 |
| warm-start learning rate | ``SHORT_WARM_START_LEARNING_RATE`` for a warm start of at most ``SHORT_WARM_START_STEPS`` steps, ``WARM_START_LEARNING_RATE`` for a longer one, which falls linearly to 0 over its steps (``warm_start_rate_at``; a rate given or recommended stays constant) |
| generation cap | the taskset's own; else, when a completion is graded (or taught) as the whole answer, the longest reference answer in tokens + a margin + EOS; else the method's; else ``FALLBACK_MAX_TOKENS`` |
| learning rate | random init: ``WARM_STARTED_LEARNING_RATE`` after a warm start, ``RANDOM_INIT_LEARNING_RATE`` without; a loaded model under ``SMALL_MODEL_PARAMETERS``: ``SMALL_MODEL_LEARNING_RATE`` (``SMALL_LORA_LEARNING_RATE`` under LoRA); a larger one: ``FULL_LEARNING_RATE``, ``LORA_LEARNING_RATE`` under LoRA |

The loop's side: the sampling cap from ``generation_cap``'s
answer rule is not an answer length (``RunPlan.cap_is_answer_length`` stays False: a reply that reaches it
is truncated).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
Ruled = tuple[T, str]
"""(value, source sentence); ``Ruled[float]`` for a rate (a bare ``Ruled`` leaves the value's type open)"""

WARM_START_STEPS = 1200
"""warm-start steps on a taskset of the user's own (own_tasks, two seeds: at 3e-3 falling linearly to 0, 1200 steps
ended at or above every constant-rate count tried, 200 to 3200, on all six tasks; docs/decisions.md)"""
WARM_START_LEARNING_RATE = 3e-3
"""the supervised learning rate of a long warm start (own_tasks benchmark: 200 steps at 1e-2 lost to 3e-3 on every
task; builtin:lookup's 200 steps are measured at 3e-3; docs/decisions.md)"""
SHORT_WARM_START_STEPS = 100
"""a warm start of at most this many steps is short: it runs at ``SHORT_WARM_START_LEARNING_RATE``"""
SHORT_WARM_START_LEARNING_RATE = 1e-2
"""a short warm start's rate: the built-ins' measured one (case, reverse, add: 14 steps; copy, count: 60), and 14
steps of builtin:case at 3e-3 end at held-out 0.02-0.05 where 1e-2 ends at 0.23-0.53 (seeds 0, 1)"""
ANSWER_MARGIN = 0.25
"""the generation cap's margin over the longest answer, as a share of it (at least one token)"""
FALLBACK_MAX_TOKENS = 256
"""the cap when neither the taskset, its answers nor the method give one"""
WHOLE_ANSWER_GRADERS = frozenset({"exact", "chars"})
"""graders that score the whole completion against the answer: a completion longer than it cannot pass"""
RANDOM_INIT_LEARNING_RATE = 1e-2
"""a random-init model's RL rate with no warm start (builtin:case learns at it, docs/train.md)"""
WARM_STARTED_LEARNING_RATE = 1e-3
"""a random-init model's RL rate after a warm start (1e-2 undid it on copy, 0.391 -> 0.051, and on parity, -0.135
pooled over three seeds; on upper and successor it gained no more than 1e-3)"""
SMALL_MODEL_PARAMETERS = 50_000_000
"""parameters outside the embeddings below which a loaded model is of the built-ins' size (an exported whileai run, a
toy body with a real vocabulary); above, a pretrained LLM (GPT-2 has 85M; Qwen2.5-0.5B 360M)"""
SMALL_MODEL_LEARNING_RATE = 1e-3
"""full fine-tuning of a small loaded model (an exported builtin:tiny: 1e-5 gained +0.001 and barely moves it,
1e-3 +0.010, 3e-3 -0.017 on a taskset it knew; +0.031 on logs in issue 21)"""
SMALL_LORA_LEARNING_RATE = 1e-2
"""LoRA on a small loaded model: 10x full fine-tuning's (the Tinker cookbook's LoRA multiplier); on an exported
builtin:tiny 2e-4 gained +0.000, 1e-3 +0.003, 1e-2 +0.014 (none resolved, docs/tasksets.md)"""
FULL_LEARNING_RATE = 1e-5
"""full fine-tuning of a pretrained LLM (TRL's SFT default; not measured here)"""
LORA_LEARNING_RATE = 2e-4
"""LoRA on a pretrained LLM (the PEFT examples' rate; not measured here)"""


# ------------------------------------------------------------------------------------- warm start
def warm_start_steps(*, random_init: bool, train_size: int, answered: int) -> Ruled[int]:
    """The supervised steps on the reference answers before RL.

    ``random_init``: the model starts from random weights (a ``builtin:`` model); ``train_size``: tasks in the
    train split; ``answered``: how many of them have a reference answer (``Task.answer`` not None)."""
    if not random_init:
        return 0, ("0: the model is loaded, not random-init, and already writes text (--warm-start-steps N "
                   "imitates the reference answers first)")
    if train_size == 0 or answered < train_size:
        return 0, (f"0: {train_size - answered} of the {train_size} train tasks have no reference answer to "
                   "imitate, and RL alone from random weights rarely passes (give every task an answer)")
    return WARM_START_STEPS, (f"{WARM_START_STEPS}: a random-init model with reference answers for all {train_size} "
                              "train tasks imitates them first (the best measured on every own_tasks task)")


def warm_start_rate_at(rate: float, step: int, steps: int, ruled: bool = True) -> float:
    """The learning rate of warm-start step ``step`` (0-based) of ``steps`` at ``rate``: constant for a short warm
    start (at most ``SHORT_WARM_START_STEPS``) or a rate not from this rule (``ruled`` False: given by the user, or a
    taskset's measured recommendation), else falling linearly to 0 (``rate * (1 - step / steps)``). At a
    constant 3e-3 a long warm start's loss, once near 0, spikes under Adam and where the last step lands decides
    the model RL starts from (own_tasks: rot1 seed 0 0.887 at 1600 steps, 0.832 at 2400); falling to 0 it ends
    settled (commas 0.883 -> 0.992 after 1200 steps instead of 2400)."""
    if steps <= SHORT_WARM_START_STEPS or not ruled:
        return rate
    return rate * (1.0 - step / steps)


def warm_start_learning_rate(steps: int) -> Ruled:
    """The supervised learning rate of a warm start of ``steps`` steps (a taskset's recommendation comes first): a
    short one needs the larger rate to teach anything, a long one the smaller to keep what it taught."""
    if steps <= SHORT_WARM_START_STEPS:
        return SHORT_WARM_START_LEARNING_RATE, (f"{SHORT_WARM_START_LEARNING_RATE:g}: a warm start of {steps} steps "
                                                f"(at most {SHORT_WARM_START_STEPS}: the built-ins' short-warm-start rate)")
    return WARM_START_LEARNING_RATE, (f"{WARM_START_LEARNING_RATE:g}: a warm start of {steps} steps (over "
                                      f"{SHORT_WARM_START_STEPS}: the rate chosen on the own_tasks benchmark, falling "
                                      "linearly to 0 over the steps)")


def keep_warm_start(compare: Mapping[str, Any]) -> str | None:
    """Why a run's final weights go back to the end of its warm start, or None: RL lowered held-out pass@1 by a
    resolved margin (``compare``: the paired before/after comparison, its 95% interval wholly below 0). A choice
    between two weights on the held-out tasks, made only on a resolved fall (issue 30: count, seed 1, 200
    warm-start steps, then RL at 1e-3: 0.961 -> 0.445)."""
    low, high = compare["ci95"]
    if compare["delta"] >= 0 or high >= 0:
        return None
    return (f"RL lowered held-out pass@1 from {compare['before']:.3f} (the end of the warm start) to "
            f"{compare['after']:.3f}, a paired delta of {compare['delta']:+.3f} [{low:+.3f}, {high:+.3f}]: it undid "
            "what the warm start taught (a lower --learning-rate, or a longer warm start)")


# ------------------------------------------------------------------------------------- generation cap
def answer_tokens(answers: Iterable[object], encode: Callable[[str], Sequence[int]]) -> list[int]:
    """Token counts of the reference answers that are text (``encode(text) -> ids``, no special tokens);
    an answer that is None or not a plain value (a list of an episode's turns) is skipped."""
    return [len(encode(str(a))) for a in answers if isinstance(a, str | int | float) and not isinstance(a, bool)]


def generation_cap(*, taskset_cap: int | None, answer_lengths: Sequence[int], whole_answer: bool,
                   method_cap: int | None) -> Ruled[int]:
    """The sampling cap (tokens per rollout) when no flag sets it.

    ``answer_lengths``: the train split's reference answers in tokens (``answer_tokens``); ``whole_answer``: a
    completion is the answer itself, not reasoning that ends in it (the grader is one of
    ``WHOLE_ANSWER_GRADERS``, or the run warm-starts on the answers): only then do the answers bound the cap.
    ``method_cap``: the method's run spec's ``max_tokens``."""
    if taskset_cap is not None:
        return taskset_cap, f"{taskset_cap}: the taskset's own max_tokens"
    if whole_answer and answer_lengths:
        longest = max(answer_lengths)
        margin = max(1, math.ceil(ANSWER_MARGIN * longest))
        cap = longest + margin + 1
        return cap, (f"{cap}: the longest reference answer ({longest} token{'s' * (longest != 1)}) + a margin of "
                     f"{margin} + EOS (the taskset sets no max_tokens; a reply that reaches it is cut short, not a "
                     "whole answer: cap_is_answer_length False)")
    why = ("its completions are graded by a grader that reads reasoning, not the answer alone" if answer_lengths
           else "its tasks have no text reference answers")
    if method_cap is not None:
        return method_cap, f"{method_cap}: the method's max_tokens (the taskset sets none and {why})"
    return FALLBACK_MAX_TOKENS, (f"{FALLBACK_MAX_TOKENS}: the loop's fallback (neither the taskset nor the method "
                                 f"sets a cap, and {why})")


def whole_answer(grader: object, warm_start_steps: int) -> bool:
    """``generation_cap``'s ``whole_answer``: the taskset's grader (its name, as the JSONL option gives it)
    scores the whole completion, or the warm start teaches the model to write the answer and stop."""
    return warm_start_steps > 0 or (isinstance(grader, str) and grader in WHOLE_ANSWER_GRADERS)


# ------------------------------------------------------------------------------------- learning rate
def learning_rate(*, random_init: bool, warm_start_steps: int, lora_rank: int, parameters: int | None) -> Ruled[float]:
    """The RL policy learning rate by model kind and size.

    ``random_init``: a ``builtin:`` model; ``warm_start_steps``: the resolved warm start; ``parameters``: a
    loaded model's parameter count (``model_parameters``; None when unknown: treated as a pretrained LLM)."""
    if random_init:
        if warm_start_steps:
            return WARM_STARTED_LEARNING_RATE, (f"{WARM_STARTED_LEARNING_RATE:g}: a random-init model after a "
                                                f"warm start of {warm_start_steps} steps (1e-2 undoes it)")
        return RANDOM_INIT_LEARNING_RATE, f"{RANDOM_INIT_LEARNING_RATE:g}: a random-init model without a warm start"
    how = f"LoRA rank {lora_rank}" if lora_rank else "full fine-tuning"
    if parameters is not None and parameters < SMALL_MODEL_PARAMETERS:
        rate = SMALL_LORA_LEARNING_RATE if lora_rank else SMALL_MODEL_LEARNING_RATE
        return rate, (f"{rate:g}: {how} of a small loaded model ({parameters / 1e6:.2g}M parameters, under "
                      f"{SMALL_MODEL_PARAMETERS / 1e6:.0f}M outside the embeddings: the built-ins' size)")
    rate = LORA_LEARNING_RATE if lora_rank else FULL_LEARNING_RATE
    size = "of unknown size" if parameters is None else f"of {parameters / 1e6:.0f}M parameters outside the embeddings"
    return rate, f"{rate:g}: {how} of a pretrained model {size}"


def estimate_parameters(config: Mapping[str, Any], *, embeddings: bool = True) -> int | None:
    """A transformer's parameter count from its Hugging Face ``config.json`` fields (Llama/Qwen style
    ``hidden_size`` ..., or GPT-2 style ``n_embd`` ...); None when the fields are missing. Rough (norms and
    biases left out), enough to tell a built-in-sized model from a pretrained LLM. ``embeddings=False``: the
    layers only (what the size rule reads: a 150k vocabulary's embedding would make a 2-layer toy look
    pretrained)."""
    width = config.get("hidden_size", config.get("n_embd", config.get("d_model")))
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    vocab = config.get("vocab_size")
    if not all(isinstance(v, int) and v > 0 for v in (width, layers, vocab)):
        return None
    inner = config.get("intermediate_size") or config.get("n_inner") or 4 * width
    heads = config.get("num_attention_heads") or 1
    kv = (config.get("num_key_value_heads") or heads) * (width // heads)
    mlp = (3 if "intermediate_size" in config else 2) * width * inner
    table = vocab * width * (1 if config.get("tie_word_embeddings", True) else 2) if embeddings else 0
    return int(table + layers * (2 * width * width + 2 * width * kv + mlp))


def model_parameters(model: str) -> int | None:
    """``estimate_parameters`` of a local model folder's config.json, outside the embeddings (None for a hub id
    or a folder without one, and for ``builtin:`` models, which are random-init and need no size)."""
    path = Path(model) / "config.json"
    if model.startswith("builtin:") or not path.is_file():
        return None
    try:
        return estimate_parameters(json.loads(path.read_text()), embeddings=False)
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------- threads
MAX_THREADS = 8
"""the most torch CPU threads the rule gives (small models gain nothing past a few)"""


def threads(*, omp: str | None, cores: int, load: float) -> Ruled[int]:
    """torch CPU threads: ``omp`` ($OMP_NUM_THREADS) when it is a whole number >= 1; else ``cores`` (the CPUs this
    process may run on) less ``load`` (the 1-minute load average, what others already run), rounded, within
    [1, ``MAX_THREADS``]. torch's own default is every core, which on a shared machine oversubscribes it."""
    if omp is not None and omp.strip().isdigit() and int(omp) >= 1:
        return int(omp), f"{int(omp)}: $OMP_NUM_THREADS"
    free = int(cores - load + 0.5)
    value = min(MAX_THREADS, max(1, free))
    return value, (f"{value}: {cores} core{'s' * (cores != 1)} for this process less a load average of {load:.2f} "
                   f"(within 1..{MAX_THREADS}; --threads N or $OMP_NUM_THREADS sets it)")
