"""Built-in tasksets with a real tool, played as episodes (``whileai.envs.episode``).

``builtin:lookup``: the prompt names a key (``vcu?``); the answer is the key's value in a key-value store
the model cannot see. The model must call the tool, ``get vcu``, read the value the store answers
(``=qob``), then write it::

    vcu?get vcu\\n=qob\\nqob\\n          model: "get vcu\\n" and "qob\\n"; environment: "=qob\\n" (masked)

A model turn ends at a newline (or EOS). A turn that starts with ``get`` is a tool call: a malformed one
gets an error message turn, and so does a key that is not in the store; any other turn is the final
answer. Reward: the share of the value's characters the answer has right (``char_match``; 1.0 only for
exactly the value). Values are a fixed function of the key, so a held-out key's value can only be read
through the tool. The split follows the other built-ins: distinct keys drawn by ``seed``, the first
``test_size`` held out.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from whileai.envs.builtin import LOWER, _letters, _options, char_match
from whileai.envs.core import Recommended, Task
from whileai.envs.episode import Env, EnvTaskset
from whileai.errors import ConfigError

LOOKUP_OPTIONS = {"key_len": 3, "value_len": 3, "letters": 26}
"""lookup's own options: letters per key and per value, and how many letters of the alphabet they use"""
LOOKUP_MAX_TOKENS = 48
"""the cap on an episode's tokens after the prompt: a call, an error and a retry, the value and the answer fit"""

LOOKUP_RECOMMENDED = Recommended(warm_start_steps=200, warm_start_learning_rate=3e-3, learning_rate=1e-3, steps=60)
"""a built-in model's defaults on lookup (docs/environments.md, "Learning to use the tool"): 14 warm-start steps
leave a model that never calls the tool, and RL at the warm start's rate undoes it within ten steps"""

TOOL_TASKSETS: dict[str, str] = {
    "lookup": "a key-value store behind a tool: the prompt names a key ('vcu?'), the model calls 'get vcu', "
              "the store answers '=qob', the model writes 'qob'; reward = share of the value's characters right",
}
"""name -> one line saying what the task is; `load_taskset("builtin:NAME", **options)`"""


def value_of(key: str, length: int, letters: int) -> str:
    """The store's value for ``key``: ``length`` letters drawn by a generator seeded with the key alone."""
    rng = random.Random(f"whileai-lookup:{key}")
    return "".join(rng.choice(LOWER[:letters]) for _ in range(length))


class Lookup(Env):
    """One episode of a lookup task: the store behind ``get KEY``, and the grade of the final answer."""

    stop = ("\n",)
    max_turns = 3

    def __init__(self, task: Task) -> None:
        self.options: Mapping[str, int] = task.info
        self.value = value_of(str(task.prompt)[:-1], self.options["value_len"], self.options["letters"])
        self.answer = ""

    def step(self, text: str) -> str | None:
        line = text.strip()
        if not line.startswith("get"):
            self.answer = line
            return None
        call = re.fullmatch(r"get ([a-z]+)", line)
        if call is None:
            return "error: write get KEY\n"
        key = call[1]
        if len(key) != self.options["key_len"] or any(c not in LOWER[:self.options["letters"]] for c in key):
            return f"error: no key {key}\n"
        return f"={value_of(key, self.options['value_len'], self.options['letters'])}\n"

    def reward(self) -> float:
        return char_match(self.value, self.answer)


def load_tool_taskset(name: str, **given: Any) -> EnvTaskset:
    """The built-in tool taskset ``name`` (a key of TOOL_TASKSETS) with its options."""
    if name not in TOOL_TASKSETS:
        raise ConfigError(f"builtin:{name!r} is not a built-in tool taskset; use one of {sorted(TOOL_TASKSETS)}")
    options = _options(name, given, LOOKUP_OPTIONS)
    space = options["letters"] ** options["key_len"]
    if options["test_size"] >= space:
        raise ConfigError(f"builtin:{name}: test_size={options['test_size']} leaves no training key: there are "
                          f"only {space} keys with these options; lower test_size or lengthen the keys (key_len)")
    count = min(space, options["test_size"] + options["train_size"])
    info = {k: options[k] for k in LOOKUP_OPTIONS}
    tasks = []
    for index in random.Random(options["seed"]).sample(range(space), count):
        key = _letters(index, options["key_len"], LOWER[:options["letters"]])
        value = value_of(key, options["value_len"], options["letters"])
        tasks.append(Task(key, f"{key}?", (f"get {key}\n", f"{value}\n"), info))
    test = tasks[:options["test_size"]]
    taskset = EnvTaskset(f"builtin:{name}", tasks[options["test_size"]:], test, Lookup, LOOKUP_MAX_TOKENS)
    taskset.recommended = LOOKUP_RECOMMENDED
    return taskset
