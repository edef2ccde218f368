"""Tasksets: prompts, fixed train / test splits and graders. They produce rewards; they never train.

    from whileai.envs import load_taskset, render_prompt
    tasks = load_taskset("builtin:case")
    task = tasks.split("train")[0]
    ids = render_prompt(tokenizer, task)          # chat template when the tokenizer has one, else BOS + text
    reward = tasks.grade(task, completion_text)   # finite; a pass is reward >= 1.0

numpy and the standard library only at import (no torch); the optional extras (`math-verify`, `datasets`,
`reasoning-gym`) are imported when a taskset or grader needs them. See docs/tasksets.md.
"""

from whileai.envs.builtin import BUILTIN_TASKSETS, char_match
from whileai.envs.core import GraderError, Task, Taskset, render_prompt
from whileai.envs.graders import GRADERS, grader
from whileai.envs.load import load_taskset

__all__ = ["BUILTIN_TASKSETS", "GRADERS", "GraderError", "Task", "Taskset", "char_match", "grader", "load_taskset",
           "render_prompt"]
