"""What can be checked about a run's inputs before the warm start, with the model's tokenizer but not its
weights: the grader on a probe of tasks (within the time limit every grade has, each return a finite number, its range),
every prompt's length against the model's context, prompts repeated with answers that disagree, and numbers
that are legal but unlikely to be meant (``report``). Each problem stops the run before anything loads; each
note is printed under the run plan (``RunPlan.notes``)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from whileai.errors import WhileaiError

if TYPE_CHECKING:  # the plan reads these checks' notes; they read the plan as a type only
    from whileai.envs.core import Task, Taskset
    from whileai.loop.plan.config import TrainConfig
    from whileai.loop.plan.run_plan import RunPlan

PROBE_TASKS = 8
"""train tasks (and a quarter as many test tasks) the grader is probed on"""
LISTED = 5
"""examples a problem or a note names (then a count)"""
MANY_STEPS = 100_000
"""RL or warm-start steps beyond this earn a note (days on a CPU)"""


def report(config: TrainConfig, taskset: Taskset | None, plan: RunPlan) -> tuple[list[str], list[str]]:
    """(problems, notes) for the run's taskset against its model and plan; nothing when there is no taskset."""
    problems: list[str] = []
    notes = flag_notes(plan)
    if taskset is None:
        return problems, notes
    from whileai.envs.episode import EnvTaskset

    if not isinstance(taskset, EnvTaskset):  # an environment's rewards come from its episodes, not a grader
        more, said = grader_probe(taskset)
        problems, notes = problems + more, notes + said
    notes += duplicate_notes(taskset)
    if config.url is None:
        more, said = length_problems(taskset, config.model, plan, config.max_tokens is not None)
        problems, notes = problems + more, notes + said
    return problems, notes


# ----------------------------------------------------------------------------- the grader
def grade_within(taskset: Taskset, task: Task, completion: str) -> float:
    """``taskset.grade(task, completion)``, or an error naming the task when it takes longer than
    ``whileai.envs.episode.GRADE_TIMEOUT_S`` (the limit every grade of the run has)."""
    from whileai.envs import episode

    return float(episode.within(lambda: taskset.grade(task, completion), "the grader",
                                f"on task_id={task.task_id!r} (completion {completion[:40]!r})"))


def grader_probe(taskset: Taskset) -> tuple[list[str], list[str]]:
    """Grade a few tasks' reference answers, an empty completion and another task's answer: each grade must
    return a finite number within ``episode.GRADE_TIMEOUT_S`` (problems); rewards above 1 or reference answers that do
    not pass are notes (a pass is reward >= 1.0). A taskset that wraps another's grader (``wrapped``: the
    random-reward control's, which draws its rewards from the grades it has seen) is probed through the one it
    wraps, so that the probe's grades do not become training rewards."""
    taskset = getattr(taskset, "wrapped", taskset)
    train, test = taskset.split("train"), taskset.split("test")
    tasks = train[:PROBE_TASKS] + test[: max(1, PROBE_TASKS // 4)]
    graded: list[tuple[Task, str, float]] = []
    for i, task in enumerate(tasks):
        other = tasks[(i + 1) % len(tasks)].answer
        for completion in dict.fromkeys(str(a) for a in (task.answer, "", other) if _plain(a)):
            try:
                graded.append((task, completion, grade_within(taskset, task, completion)))
            except WhileaiError as err:
                return [f"taskset {taskset.name!r}: the grader, probed before the warm start: {err}"], []
    notes = []
    high = max(graded, key=lambda g: g[2], default=None)
    if high is not None and high[2] > 1.0:
        notes.append(f"the grader returned {high[2]:g} on task_id={high[0].task_id!r} (completion {high[1][:40]!r}): a "
                     "pass is reward >= 1.0, so on a 0-10 scale almost any partial credit passes; return the reward "
                     "divided by its maximum (0..1)")
    answers = [(t, c, r) for t, c, r in graded if _plain(t.answer) and c == str(t.answer)]
    failing = [(t, r) for t, c, r in answers if r < 1.0]
    if failing:
        shown = ", ".join(f"{t.task_id!r} ({r:g})" for t, r in failing[:LISTED])
        notes.append(f"{len(failing)} of the {len(answers)} reference answers probed do not pass their own grader "
                     f"(reward < 1.0 on task_id {shown}): the warm start imitates them and held-out pass@1 counts "
                     "only rewards >= 1.0; check the grader and the answer field")
    return [], notes


def _plain(answer: object) -> bool:
    return isinstance(answer, str | int | float) and not isinstance(answer, bool)


# ----------------------------------------------------------------------------- prompts
def duplicate_notes(taskset: Taskset) -> list[str]:
    """Prompts given more than once with answers that disagree (within and across splits)."""
    seen: dict[str, list[Task]] = defaultdict(list)
    for task in taskset.split("train") + taskset.split("test"):
        seen[json.dumps(task.prompt, sort_keys=True)].append(task)
    clashes = [tasks for tasks in seen.values()
               if len({json.dumps(t.answer, sort_keys=True, default=str) for t in tasks}) > 1]
    if not clashes:
        return []
    shown = "; ".join(f"{_short(tasks[0].prompt)}: " + ", ".join(f"task_id {t.task_id!r} answer {_short(t.answer)}"
                                                                  for t in tasks[:3]) for tasks in clashes[:LISTED])
    more = "; ..." if len(clashes) > LISTED else ""
    if len(clashes) == 1:
        what = f"1 prompt is given on {len(clashes[0])} tasks with different answers ({shown})"
    else:
        what = (f"{len(clashes)} prompts are each given on more than one task with different answers "
                f"({sum(map(len, clashes))} tasks in all: {shown}{more})")
    return [f"{what}: an exact grader passes at most one answer per prompt, and the warm start is taught each; keep "
            "one answer per prompt, or grade with a function that accepts every one"]


def _short(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 30 else text[:27] + "..."


def context_of(model: str) -> int | None:
    """The model's context in tokens without loading its weights: a built-in's config, a folder's config.json
    (``max_position_embeddings``, ``n_positions``); None when unknown (a hub id)."""
    if model.startswith("builtin:"):
        from whileai.engine.models import BUILTINS

        return BUILTINS.get(model.split(":", 1)[1], {}).get("max_position_embeddings")
    path = Path(model) / "config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings", config.get("n_positions"))
    return int(value) if isinstance(value, int) else None


def length_problems(taskset: Taskset, model: str, plan: RunPlan, cap_given: bool) -> tuple[list[str], list[str]]:
    """Every prompt (both splits, rendered as training renders it) against the model's context: a prompt that
    fills it is a problem naming the tasks; a cap at or past the context is a problem when the user set it (a
    note when it is the method's or the taskset's); prompt + cap past the context is a note."""
    context = context_of(model)
    if context is None:
        return [], []
    try:
        from whileai.envs import render_prompt
        from whileai.trainers.base import load_tokenizer

        tokenizer = load_tokenizer(model)
        lengths = [(t, len(render_prompt(tokenizer, t))) for t in taskset.split("train") + taskset.split("test")]
    except (WhileaiError, OSError, ValueError):  # a prompt it cannot render is refused where it is sampled
        return [], []
    problems, notes = [], []
    long = [(t, n) for t, n in lengths if n >= context]
    if long:
        shown = ", ".join(f"task_id {t.task_id!r} ({n} tokens)" for t, n in long[:LISTED])
        problems.append(f"{len(long)} prompt{'s' * (len(long) != 1)} fill the model's context of {context} tokens, "
                        f"leaving no room for a reply: {shown}{', ...' if len(long) > LISTED else ''} (a JSONL "
                        "file's task_id is its line number unless it names its own); shorten them or drop them")
    if plan.max_tokens >= context:
        text = (f"max_tokens = {plan.max_tokens} is not below the model's context of {context} tokens, so no reply "
                f"can be that long")
        if cap_given:
            problems.append(f"{text}: set --max-tokens below {context} (less the prompt)")
        else:
            notes.append(f"{text}: replies stop at the context (the cap is {plan.source('max_tokens')}'s; "
                         "--max-tokens sets it)")
    elif lengths:
        longest = max(lengths, key=lambda x: x[1])
        if longest[1] + plan.max_tokens > context:
            over = sum(n + plan.max_tokens > context for _, n in lengths)
            notes.append(f"{over} prompt{'s' * (over != 1)} (the longest, task_id {longest[0].task_id!r}, "
                         f"{longest[1]} tokens) leave less than the cap of {plan.max_tokens} tokens under the "
                         f"context of {context}: their replies are cut at the context")
    return problems, notes


# ----------------------------------------------------------------------------- numbers
def flag_notes(plan: RunPlan) -> list[str]:
    """Numbers a user may mean but rarely does (the impossible ones are refused by the config's own check)."""
    notes = []
    for name in ("steps", "warm_start_steps"):
        value = getattr(plan, name)
        if value > MANY_STEPS:
            notes.append(f"{name} = {value:,}: at a tenth of a second a step on builtin:tiny this is "
                         f"{value / 10 / 3600:,.0f} hours; Ctrl-C stops it with a checkpoint at any time")
    rate = plan.learning_rate
    if rate > 0.1:
        notes.append(f"learning_rate = {rate:g}: Adam moves each weight by about this much a step, so rates above "
                     "0.1 usually diverge (the rules give 1e-2 at most)")
    return notes


def model_problems(config: TrainConfig) -> list[str]:
    """The model, when it can never load: a missing folder named as one, not as a hub id (a run from --rows
    names it where the file's tokens are read; a run over --url holds its model on the server)."""
    if config.url is not None or config.rows is not None:
        return []
    from whileai.engine.models import model_problem

    problem = model_problem(config.model)
    return [] if problem is None else [f"--model {config.model!r}: {problem}"]
