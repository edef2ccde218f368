"""Built-in tasks whose replies carry a short scratchpad before the answer and end with EOS at varied lengths.

`builtin:count`: count the a's in a string of letters. The reply first writes the a's out (the scratchpad),
then `=` and their number: `abcab?` -> `aa=2`, `bcb?` -> `=0`, `aabaa?` -> `aaaa=4`. Replies run from 2 to
`max_len + 2` characters and end with EOS (the warm start teaches the stop), so a reply's length follows the
prompt and a policy that does not stop loses credit. The reward is the share of characters right over the
longer of answer and reply (`char_match`); a pass is the exact reply. Unlike the other built-ins the prompt
decides how long the reply is: the task GRPO's per-sequence 1/T and Dr. GRPO's constant normaliser weigh
differently (docs/tasksets.md measures it).

This module holds the task's functions only; `whileai.envs.builtin` registers it (BUILTIN) with its options and
measured settings, so the split, the options' checks and `load_taskset` are the other built-ins'.
"""

from __future__ import annotations

from collections.abc import Mapping

from whileai.envs.core import Recommended

COUNT_OPTIONS = {"min_len": 1, "max_len": 5, "letters": 3, "test_size": 64}
"""prompt lengths min_len..max_len (at most 9: the count stays one digit) of the first `letters` of a-z; 363
distinct prompts by default, so the test split is 64 (the recipes' held-out tasks) and the train split the other 299.
At max_len 8 (9,837 prompts) builtin:tiny's warm start stayed at pass@1 0.04-0.06 (docs/tasksets.md)"""
COUNT_MAX_LEN = 9
COUNT = Recommended(warm_start_steps=60, learning_rate=1e-3)
"""builtin:count on a built-in model: 60 supervised steps put builtin:tiny's held-out pass@1 at 0.15-0.40 before RL on
seeds 0-4, and RL at 1e-3 gained on every seed (+0.05 to +0.13); at the loop's 1e-2 RL fell on 2 of 5 seeds
(docs/tasksets.md)"""


def count_space(o: Mapping[str, int]) -> int:
    """Distinct prompts: every string of min_len..max_len letters."""
    return sum(o["letters"] ** n for n in range(o["min_len"], o["max_len"] + 1))


def count_prompt(index: int, o: Mapping[str, int]) -> tuple[str, str]:
    """The index-th prompt (shorter strings first, each length in base-`letters` order) and its reply."""
    length = o["min_len"]
    while index >= o["letters"] ** length:
        index -= o["letters"] ** length
        length += 1
    letters = []
    for _ in range(length):
        index, digit = divmod(index, o["letters"])
        letters.append(chr(ord("a") + digit))
    prompt = "".join(reversed(letters))
    count = prompt.count("a")
    return prompt + "?", "a" * count + "=" + str(count)


def count_max_tokens(o: Mapping[str, int]) -> int:
    """The longest reply (every letter an a) plus one: room for the EOS after it."""
    return o["max_len"] + 3
