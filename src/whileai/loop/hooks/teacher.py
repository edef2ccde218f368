"""The run's teacher: built from the run spec's ``teacher`` (which weights, which context, how many top-k
slots) and the config's ``teacher`` setting (OPD's model), it fills ``teacher_logprobs``,
``teacher_topk_tokens`` and ``teacher_topk_logprobs`` on the student's own rows.

The teacher's context is the row's prompt, or, for a privileged teacher (OPSD), the task's prompt with the
privileged text added (``teacher_prompt``): the student's rows keep their own ``prompt_tokens`` and never
see it. The teacher scores every completion token, environment tokens included (the method gives those
c = 0), at the temperature the student sampled with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whileai.envs import render_prompt
from whileai.errors import ConfigError
from whileai.loop.hooks.context import Context
from whileai.loop.types import Hook, Loop, Scoring, Tokenizer, engine_of

if TYPE_CHECKING:
    from whileai.engine.teacher import Teacher
    from whileai.envs.core import Prompt, Task, Taskset
    from whileai.loop.plan.config import TrainConfig
    from whileai.methods.run_spec import RunSpec, TeacherSpec
    from whileai.trainers import Trainer

# What each privileged kind shows the teacher, and where it comes from (docs/train.md, "Teachers").
PRIVILEGED: dict[str, str] = {
    "reference": "Reference answer: {text}",
    "demonstration": "A passing solution: {text}",
    "hint": "Hint: {text}",
    "feedback": "An earlier attempt: {completion}\nFeedback: {text}",
}


def check(spec: RunSpec, method_name: str, teacher: str | None, taskset: Taskset | None, no_tasks: bool = False) -> list[str]:
    """Problems with the run's teacher, found before any model loads (each with a fix). ``no_tasks``: the run
    has no taskset (it trains from a rows file), so no task can give privileged text."""
    if spec is None or spec.teacher is None:
        return [f"teacher = {teacher!r}: method {method_name!r} distills from no teacher (its run spec names "
                "none); drop --teacher"] if teacher is not None else []
    if spec.teacher.weights != "model":
        problems = [f"teacher = {teacher!r}: method {method_name!r}'s teacher is the student's own weights (anchor "
                    f"{spec.teacher.weights!r}); drop --teacher"] if teacher is not None else []
        if no_tasks and spec.teacher.privileged not in (None, "feedback"):
            problems.append(f"privileged = {spec.teacher.privileged!r} takes its text from the taskset's tasks, and "
                            "this run trains from rows without one: use --set privileged=feedback (the row's own "
                            "grade), or train on a taskset")
        return problems + _privileged_problems(spec.teacher.privileged, taskset)
    if teacher is None:
        return [f"method {method_name!r} distills from a teacher model: give --teacher builtin:NAME or the directory "
                "of a model with the student's tokenizer (e.g. an earlier run's RUN_DIR/final)"]
    return _source_problems(teacher)


def _source_problems(teacher: str) -> list[str]:
    from whileai.engine.models import BUILTINS

    if teacher.startswith("builtin:"):
        if teacher.removeprefix("builtin:") in BUILTINS:
            return []
        return [f"teacher = {teacher!r} is not a built-in model: use one of "
                f"{', '.join('builtin:' + n for n in BUILTINS)}, or a model directory"]
    path = Path(teacher).expanduser()
    if not path.is_dir():
        return [f"teacher = {teacher!r}: no such directory; give builtin:NAME or the directory of a Hugging Face "
                "model (config.json + weights), e.g. an earlier run's RUN_DIR/final"]
    if not (path / "config.json").is_file():
        return [f"teacher = {teacher!r} has no config.json: it is not a model directory; give a directory that "
                "transformers can load (an earlier run's RUN_DIR/final is one; a LoRA adapter folder is not, "
                "export it merged)"]
    return []


def _privileged_problems(kind: str | None, taskset: Taskset | None) -> list[str]:
    if kind not in ("reference", "hint") or taskset is None:
        return []
    tasks = taskset.split("train")
    lacking = [t.task_id for t in tasks if (t.answer if kind == "reference" else t.info.get("hint")) is None]
    if not lacking:
        return []
    where = "a reference answer (Task.answer)" if kind == "reference" else "a hint (Task.info['hint'])"
    return [f"privileged = {kind!r} shows the teacher {where}, and {len(lacking)} of {len(tasks)} training tasks "
            f"have none (e.g. task_id={lacking[0]!r}): add it to the taskset, or pick another privileged= "
            "(--set privileged=feedback needs nothing from the taskset)"]


def privileged_text(kind: str, task: Task | None, row: Mapping[str, Any], completion: str = "") -> str:
    """The text a privileged teacher sees for ``row`` (a rollout of ``task``, whose text is ``completion``)."""
    if kind == "feedback":  # SDPO: the environment's feedback on this very attempt, or its grade
        text = row.get("feedback") or f"it scored {float(row['reward']):g} (a pass is 1)"
        return PRIVILEGED[kind].format(text=text, completion=completion)
    if task is None:  # only the feedback kind reads no task (``RunTeacher.context`` asks the others for one)
        raise ConfigError(f"privileged = {kind!r}: the row has no task to take the text from")
    if kind == "reference":
        text = task.answer
    elif kind == "demonstration":  # a passing solution; the built-ins' answer is one
        text = task.info.get("demonstration", task.answer)
    else:
        text = task.info.get("hint")
    if text is None:
        raise ConfigError(f"privileged = {kind!r}: task_id={task.task_id!r} has no text to show the teacher; "
                          "add it to the taskset, or pick another privileged=")
    return PRIVILEGED[kind].format(text=text)


def teacher_prompt(tokenizer: Tokenizer, task: Task, text: str) -> list[int]:
    """The task's prompt with ``text`` added: before a plain-text prompt (which the completion continues), at
    the end of the last message of a chat prompt."""
    if isinstance(task.prompt, str):
        prompt: Prompt = f"{text}\n{task.prompt}"
    else:
        messages = [dict(m) for m in task.prompt]
        messages[-1]["content"] = f"{messages[-1].get('content', '')}\n\n{text}"
        prompt = messages
    return render_prompt(tokenizer, dataclasses.replace(task, prompt=prompt))


def _before_tokens(tokenizer: Tokenizer, prompt_tokens: Sequence[int], text: str) -> list[int]:
    """A row's own prompt tokens with ``text`` before them (after BOS): rows with no task (from a file)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    head = [int(bos)] if bos is not None and prompt_tokens and prompt_tokens[0] == bos else []
    return head + tokenizer.encode(text + "\n", add_special_tokens=False) + list(prompt_tokens)[len(head):]


class RunTeacher:
    """The teacher of one run: fills the teacher fields of rows, follows the student (EMA), checkpoints."""

    def __init__(self, spec: TeacherSpec, scorer: Teacher, tokenizer: Tokenizer, tasks: Sequence[Task]) -> None:
        self.spec, self.scorer, self.tokenizer = spec, scorer, tokenizer
        self.tasks = {t.task_id: t for t in tasks}

    def context(self, row: Mapping[str, Any]) -> list[int]:
        """The teacher's prompt for ``row``: the student's, or the task's with the privileged text."""
        kind = self.spec.privileged
        if kind is None:
            return list(row["prompt_tokens"])
        task = self.tasks.get(str(row.get("task_id")))
        completion = row.get("completion") or self.tokenizer.decode(list(row["tokens"]), skip_special_tokens=True)
        if task is None and kind == "feedback":  # a row from a file: its own prompt, the text before it
            return _before_tokens(self.tokenizer, row["prompt_tokens"], privileged_text(kind, None, row, completion))
        if task is None:
            raise ConfigError(f"privileged = {kind!r}: row of task_id={row.get('task_id')!r} is not a task of the "
                              "taskset's train split, so there is no privileged text for it")
        return teacher_prompt(self.tokenizer, task, privileged_text(kind, task, row, completion))

    def fill(self, rows: list[dict[str, Any]], sampling_params: Scoring) -> None:
        """Set ``teacher_logprobs`` (and the top-k fields) on every row that lacks them."""
        from whileai.engine.logprobs import scoring

        todo = [r for r in rows if "teacher_logprobs" not in r]
        if not todo:
            return
        sequences = [(self.context(r), r["tokens"]) for r in todo]
        for row, scores in zip(todo, self.scorer.score(sequences, scoring(sampling_params), self.spec.top_k)):
            row["teacher_logprobs"] = scores.logprobs.tolist()
            if scores.topk_tokens is not None:
                row["teacher_topk_tokens"] = scores.topk_tokens.tolist()
                row["teacher_topk_logprobs"] = scores.topk_logprobs.tolist()

    def after_step(self, trainer: Trainer) -> None:
        """An EMA teacher follows the student's weights (a separate model's teacher has nothing to do); an EMA
        teacher is made of an in-process engine's weights (``policy_teacher``), whose ``named_params`` it reads."""
        if self.scorer.ema is not None:
            self.scorer.after_step(engine_of(trainer, "an EMA teacher").named_params)

    def save(self, path: Path) -> bool:
        """Write what a resume needs (an EMA teacher's average); False when there is nothing to save."""
        if self.scorer.ema is None:
            return False
        import torch

        torch.save(self.scorer.ema.state_dict(), path)
        return True

    def load(self, path: Path) -> None:
        if self.scorer.ema is None:
            return
        if not path.is_file():
            raise ConfigError(f"the checkpoint has no {path.name}: the EMA teacher's average was not saved with it, "
                              "so the run cannot resume as it was; start it again in a new --run-dir")
        import torch

        self.scorer.ema.load_state_dict(torch.load(path, weights_only=True))


def build(spec: TeacherSpec, config: TrainConfig, engine: Trainer, taskset: Taskset | None) -> RunTeacher:
    """Load or make the run's teacher (the student's weights as they are now, for an EMA)."""
    from whileai.engine.teacher import model_teacher, policy_teacher, tokenizer_mismatch

    options = {"micro_batch_tokens": config.micro_batch_tokens}
    if spec.weights == "model":
        from whileai.engine.models import load_model

        assert config.teacher is not None  # checked before anything loads (check())
        loaded = load_model(config.teacher, device=config.device, seed=config.seed)
        # a trainer over HTTP does not say its output size: the student's tokenizer bounds the ids it writes
        vocab_size = getattr(engine, "vocab_size", None) or len(engine.tokenizer)
        problem = tokenizer_mismatch(engine.tokenizer, loaded.tokenizer, vocab_size)
        if loaded.vocab_size < vocab_size:
            problem = (f"the teacher's output layer scores {loaded.vocab_size} token ids and the student's "
                       f"{vocab_size}")
        if problem:
            raise ConfigError(f"teacher = {config.teacher!r} cannot score the student's tokens: {problem}. OPD needs "
                              f"one tokenizer on both sides: pick a teacher of {config.model!r}'s family")
        scorer = model_teacher(loaded, **options)
    else:
        scorer = policy_teacher(engine, spec.weights, spec.ema_rate, **options)
    return RunTeacher(spec, scorer, engine.tokenizer, taskset.split("train") if taskset is not None else [])


@dataclass
class TeacherHook(Hook):
    """The run spec's teacher, built once the weights RL starts from are in place (an EMA starts from them);
    a resume restores an EMA teacher's average from the checkpoint."""

    ctx: Context

    def before(self, loop: Loop) -> None:
        spec = self.ctx.method.run_spec().teacher
        if spec is None:
            return
        loop.teacher = build(spec, self.ctx.config, loop.trainer, self.ctx.taskset)
        if self.ctx.resuming and loop.state.step > 0:
            loop.teacher.load(self.ctx.run_dir / "checkpoint" / f"teacher-{int(loop.trainer.step):08d}.pt")
