"""Built-in procedural tasksets, small enough for a random-init byte-level model to learn on a CPU.

Every prompt is under 16 bytes and every answer at most 6; rewards give partial credit in [0, 1]
(1.0 = fully right) so the reward rises smoothly. The split is fixed by a seed: distinct prompts are drawn
without replacement, the first `test_size` form the test split and the next (up to) `train_size` the train
split, so the two never share a prompt. A task's `answer` is a completion that earns reward 1.0.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from whileai.envs import scratch
from whileai.envs.core import Recommended, Task, Taskset
from whileai.errors import ConfigError

LOWER = string.ascii_lowercase
UPPER = string.ascii_uppercase
SPLIT_OPTIONS = {"seed": 0, "test_size": 256, "train_size": 4096}
"""options every built-in takes: the split's seed, the test split's size, the train split's largest size"""
WARM_START = Recommended(warm_start_steps=14)
"""what a built-in model gets on the procedural tasksets: 14 supervised steps put held-out pass@1 on builtin:case
between 0.1 and 0.6 before RL on eight seeds (docs/train.md, "How the default was checked"); the rest is the loop's"""
COPY = Recommended(warm_start_steps=60, learning_rate=1e-3)
"""builtin:copy: 14 warm-up steps and RL at 1e-2 leave held-out pass@1 at 0; 60 steps and RL at 1e-3 gained on 4 of
5 seeds (+0.012 to +0.094, docs/tasksets.md)"""


@dataclass(frozen=True)
class Builtin:
    """One procedural taskset: prompts indexed 0..space-1, an answer and a reward for each."""

    doc: str
    options: Mapping[str, int]
    space: Callable[[Mapping[str, int]], int]
    prompt_at: Callable[[int, Mapping[str, int]], tuple[str, str]]
    """index -> (prompt, answer)"""
    reward: Callable[[Task, str], float]
    max_tokens: Callable[[Mapping[str, int]], int]
    recommended: Recommended = WARM_START
    """what `wai train` uses on a built-in model for the settings left empty (measured; docs/tasksets.md)"""


def char_match(answer: str, completion: str) -> float:
    """Share of positions where the completion has the answer's character, over the longer of the two:
    partial credit by character, and 1.0 only for exactly the answer ("48" vs "4": 0.5, vs "48x": 2/3)."""
    longer = max(len(answer), len(completion))
    if longer == 0:
        return 1.0
    return sum(a == c for a, c in zip(answer, completion)) / longer


def _letters(index: int, length: int, alphabet: str) -> str:
    """The `index`-th string of `length` letters of `alphabet`, in base-26 order."""
    out: list[str] = []
    for _ in range(length):
        index, digit = divmod(index, len(alphabet))
        out.append(alphabet[digit])
    return "".join(reversed(out))


# ---------------------------------------------------------------------------------------------- case
def _case_prompt(index: int, o: Mapping[str, int]) -> tuple[str, str]:
    alphabet = (LOWER, UPPER)[index // 26 ** o["prompt_len"]]
    prompt = _letters(index % 26 ** o["prompt_len"], o["prompt_len"], alphabet)
    return prompt, (prompt * o["completion_len"])[:o["completion_len"]]


def _case_reward(task: Task, completion: str) -> float:
    """Share of the first `completion_len` characters that are letters of the prompt's case (a missing
    character, e.g. after an early EOS, counts as a miss): the grading of recipes/rl_loop.py."""
    n = task.info["completion_len"]
    letters = UPPER if str(task.prompt)[-1] in UPPER else LOWER
    return sum(c in letters for c in completion[:n]) / n


# ------------------------------------------------------------------------------------- copy, reverse
def _copy_prompt(index: int, o: Mapping[str, int]) -> tuple[str, str]:
    letters = _letters(index, o["prompt_len"], LOWER[:o["letters"]])
    return letters + "=", letters


def _reverse_prompt(index: int, o: Mapping[str, int]) -> tuple[str, str]:
    letters = _letters(index, o["prompt_len"], LOWER[:o["letters"]])
    return letters + "=", letters[::-1]


def _answer_reward(task: Task, completion: str) -> float:
    return char_match(str(task.answer), completion)


# ----------------------------------------------------------------------------------------------- add
def _add_prompt(index: int, o: Mapping[str, int]) -> tuple[str, str]:
    a, b = divmod(index, 10 ** o["digits"])
    return f"{a}+{b}=", str(a + b)


BUILTIN: dict[str, Builtin] = {
    "case": Builtin(
        "continue a few letters, all lower or all upper case ('abq'), with completion_len letters of the "
        "same case; reward = share of them in that case (recipes/rl_loop.py's task)",
        {"prompt_len": 3, "completion_len": 4},
        lambda o: 2 * 26 ** o["prompt_len"], _case_prompt, _case_reward, lambda o: o["completion_len"]),
    "copy": Builtin(
        "repeat the letters before '=' ('abc=' -> 'abc'); reward = share of characters right",
        {"prompt_len": 3, "letters": 26},
        lambda o: o["letters"] ** o["prompt_len"], _copy_prompt, _answer_reward, lambda o: o["prompt_len"], COPY),
    "reverse": Builtin(
        "the letters before '=' backwards ('abc=' -> 'cba'); reward = share of characters right",
        {"prompt_len": 3, "letters": 26},
        lambda o: o["letters"] ** o["prompt_len"], _reverse_prompt, _answer_reward, lambda o: o["prompt_len"]),
    "add": Builtin(
        "the sum of two numbers of up to `digits` digits ('3+45=' -> '48'); reward = share of characters "
        "right, over the longer of answer and completion",
        {"digits": 2},
        lambda o: 10 ** (2 * o["digits"]), _add_prompt, _answer_reward, lambda o: o["digits"] + 1),
    "count": Builtin(
        "count the a's: write them out, then '=' and their number ('abcab?' -> 'aa=2'); replies of 2 to "
        "max_len + 2 characters ending with EOS; reward = share of characters right (whileai.envs.scratch)",
        scratch.COUNT_OPTIONS, scratch.count_space, scratch.count_prompt, _answer_reward, scratch.count_max_tokens,
        scratch.COUNT),
}

BUILTIN_TASKSETS: dict[str, str] = {name: b.doc for name, b in BUILTIN.items()}
"""name -> one line saying what the task is; `load_taskset("builtin:NAME", **options)`"""

MAX_OPTION = {"prompt_len": 6, "completion_len": 6, "digits": 2, "letters": 26, "test_size": 1_000_000,
              "train_size": 1_000_000, "key_len": 6, "value_len": 6, "min_len": scratch.COUNT_MAX_LEN,
              "max_len": scratch.COUNT_MAX_LEN}
"""largest values: prompts stay under 16 bytes and answers at most 6; a split stays a list in memory"""


def _options(name: str, given: Mapping[str, Any], own: Mapping[str, int] | None = None) -> dict[str, int]:
    """The built-in's options (`own`, else BUILTIN[name]'s) with `given` applied; every bad one reported at once."""
    defaults = {**SPLIT_OPTIONS, **(BUILTIN[name].options if own is None else own)}
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ConfigError(f"builtin:{name}: unknown option(s) {unknown}; valid options are {sorted(defaults)}")
    options = {**defaults, **given}
    least = {"seed": 0}
    bad = [f"{k}={v!r} must be an integer >= {least.get(k, 1)}" for k, v in options.items()
           if isinstance(v, bool) or not isinstance(v, int) or v < least.get(k, 1)]
    bad += [f"{k}={options[k]} must be <= {top}" for k, top in MAX_OPTION.items()
            if isinstance(options.get(k), int) and options[k] > top]
    if bad:
        raise ConfigError(f"builtin:{name}: " + "; ".join(bad) + " (fix the options)")
    return options


def load_builtin(name: str, **given: Any) -> Taskset:
    """The built-in taskset `name` (a key of BUILTIN_TASKSETS) with its options."""
    if name not in BUILTIN:
        from whileai.envs.tools import TOOL_TASKSETS  # here, not at the top: tools builds on this module

        raise ConfigError(f"builtin:{name!r} is not a built-in taskset; use one of {sorted([*BUILTIN, *TOOL_TASKSETS])}")
    spec, options = BUILTIN[name], _options(name, given)
    space = spec.space(options)
    if options["test_size"] >= space:
        raise ConfigError(f"builtin:{name}: test_size={options['test_size']} leaves no training prompt: "
                          f"there are only {space} distinct prompts with these options; lower test_size "
                          f"or lengthen the prompts")
    count = min(space, options["test_size"] + options["train_size"])
    indices = random.Random(options["seed"]).sample(range(space), count)
    info = {k: v for k, v in options.items() if k in spec.options}
    tasks = [Task(prompt, prompt, answer, info) for prompt, answer in (spec.prompt_at(i, options) for i in indices)]
    test = tasks[:options["test_size"]]
    return Taskset(f"builtin:{name}", tasks[options["test_size"]:], test, spec.reward, spec.max_tokens(options),
                   spec.recommended)
