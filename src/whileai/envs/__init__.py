"""Tasksets: prompts, fixed train / test splits and graders. They produce rewards; they never train.

    from whileai.envs import load_taskset, render_prompt
    tasks = load_taskset("builtin:case")
    task = tasks.split("train")[0]
    ids = render_prompt(tokenizer, task)          # chat template when the tokenizer has one, else BOS + text
    reward = tasks.grade(task, completion_text)   # finite; a pass is reward >= 1.0
    tools = load_taskset("builtin:lookup")        # an EnvTaskset: episodes with a tool (docs/environments.md)

numpy and the standard library only at import (no torch); the optional extras (`math-verify`, `datasets`,
`reasoning-gym`) are imported when a taskset or grader needs them. See docs/tasksets.md.
"""

from whileai.envs.builtin import BUILTIN_TASKSETS, char_match
from whileai.envs.core import GraderError, Recommended, Task, Taskset, render_prompt
from whileai.envs.episode import Env, EnvError, EnvTaskset, OneTurn, play, reference_episode
from whileai.envs.graders import GRADERS, grader
from whileai.envs.load import load_taskset
from whileai.envs.tools import TOOL_TASKSETS

__all__ = ["BUILTIN_TASKSETS", "GRADERS", "TOOL_TASKSETS", "Env", "EnvError", "EnvTaskset", "GraderError", "OneTurn",
           "Recommended", "Task", "Taskset", "char_match", "grader", "load_taskset", "play", "reference_episode", "render_prompt"]
