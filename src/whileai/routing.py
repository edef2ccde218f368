"""Pick the training method from graded rows: the guide's questions, asked in order, first answer wins.

This module sits above both ``whileai.rows`` (the questions are asked of graded rows) and
``whileai.methods`` (the answer is a ready method object): it imports both, and neither imports it.

    route = wai.route(rows, model="Qwen/Qwen3-4B")
    print(route)          # the questions asked, the one that decided, the numbers, what to do next
    route.config          # a ready method object, e.g. GRPO(...), with its knobs

The order (the guide "pick a method", section 6, plus its DPO row):

1. Can a cut-off reply pass? -> fix the reward (nothing to train yet)
2. How many rollouts per prompt? k = 1 -> FlashReinforce (or SAO, BPCO; prime-rl's rae)
3. What is the per-task band? floor -> OPSD (SFT from a stronger model under ~7B);
   saturated -> GroupwiseGrading, or a harder eval
4. Is there a stronger teacher? clears PROVE_EFFECT with intervals apart -> OPD
5. Is every prompt a natural better/worse pair? -> DPO
6. Did the model you'll train write these rows? no -> SFT on them, or OPD from their model
7. Otherwise: split tasks, on-policy -> GRPO
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from whileai.endpoints import Endpoint
from whileai.errors import ConfigError
from whileai.methods.base import Method
from whileai.methods.distill import OPD, OPSD
from whileai.methods.registry import method as build_method
from whileai.methods.shaping import GroupwiseGrading
from whileai.rows.checks import (
    PROVE_EFFECT,
    expected_split_share,
    model_mix,
    on_policy,
    teacher_gap,
    truncated_passes,
)
from whileai.rows.io import GradedRows, as_graded, pass_threshold, plural
from whileai.rows.stats import Rows, population_interval, task_counts

# OPSD's self-teacher needs a model big enough to use the privileged context (the guide: "about 7B
# or more"; the repo's Qwen3-0.6B run lost 0.554 against GRPO).
OPSD_MIN_BILLIONS = 7.0
# Below this share of split tasks the guide's "few split tasks" advice applies (our threshold: a
# grouped update then spends most of its rollouts on groups with no signal).
FEW_SPLIT = 0.1
PRIVILEGED = ("reference", "demonstration", "hint", "feedback")

Q_TRUNCATED = "1. Can a cut-off reply pass?"
Q_ROLLOUTS = "2. How many rollouts per prompt?"
Q_BAND = "3. What is the per-task band?"
Q_TEACHER = "4. Is there a stronger teacher?"
Q_PAIRS = "5. Is every prompt a natural better/worse pair?"
Q_POLICY = "6. Did the model you'll train write these rows?"
Q_GRPO = "7. Split tasks, on-policy rows?"


@dataclass(frozen=True, eq=False)
class Route:
    """The answer: which branch decided, the method and a ready object for it, and why."""

    branch: str  # "fix the reward", "k = 1", "floor", "saturated", "strong teacher", "dpo pairs", ...
    method: str | None  # registry name of what to train with; None: fix the reward first
    config: Method | None  # a ready method object with its knobs (None: nothing to train yet, or no grader given)
    question: str  # the question that decided
    answer: str  # its answer, in a sentence
    numbers: dict[str, Any]
    asked: tuple[tuple[str, str], ...]  # every question asked, in order, with its answer
    alternatives: tuple[str, ...] = ()
    next_steps: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"branch": self.branch, "method": self.method, "config": _config_dict(self.config),
                "question": self.question, "answer": self.answer, "numbers": _plain(self.numbers),
                "asked": [list(a) for a in self.asked], "alternatives": list(self.alternatives),
                "next_steps": list(self.next_steps), "notes": list(self.notes)}

    def __str__(self) -> str:
        title = self.method or "nothing yet"
        lines = [f"route: {title}  (branch: {self.branch})",
                 f"decided by {self.question} {self.answer}", "", "questions, in order:"]
        width = max(len(q) for q, _ in self.asked)
        lines += [f"  {q.ljust(width)}  {a}" for q, a in self.asked]
        if self.config is not None:
            lines += ["", f"train with: {self.config!r}"]
        elif self.method is not None:
            lines += ["", f"train with: {self.method}, not built yet (see next)"]
        lines += [f"  or: {alt}" for alt in self.alternatives]
        lines += ["", "numbers:"] + [f"  {k}: {_short(v)}" for k, v in self.numbers.items()]
        lines += ["", "next:"] + [f"  - {step}" for step in self.next_steps]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def route(rows: Rows, model: str, teacher_rows: Rows | None = None, *, grader: Any = None,
          teacher: Any = None, privileged: str = "reference", threshold: float | None = None) -> Route:
    """Ask the rows the guide's questions in order and stop at the first that decides.

    ``model`` is the model you will train. ``teacher_rows``: a candidate teacher scored on the same
    held-out tasks at the student's max_tokens. ``teacher``: its ``wai.Endpoint`` (or base URL) for
    the OPD object. ``grader``: what ``GroupwiseGrading`` ranks passes with when every task passes.
    ``privileged``: the context OPSD shows its self-teacher ("reference", "demonstration", "hint",
    "feedback"). ``threshold``: a row passes at reward >= threshold; it may be left out only when
    every reward is 0 or 1, since routing on a guessed pass would pick the method by that guess.
    Returns a ``Route`` whose ``config`` is a ready method object (or None when there is nothing
    to train yet); anything that cannot be built raises.
    """
    if privileged not in PRIVILEGED:
        raise ConfigError(f"route: privileged={privileged!r} is not one of {', '.join(map(repr, PRIVILEGED))}.")
    if isinstance(teacher, str):  # a bad URL is refused whichever question decides
        Endpoint(base_url=teacher)
    graded = as_graded(rows)
    teacher_graded = None if teacher_rows is None else as_graded(teacher_rows)
    if teacher_graded is not None:  # the teacher's rewards are read by the same rule
        pass_threshold(teacher_graded.reward_R, threshold, f"teacher rows: {teacher_graded.source}")
    threshold = pass_threshold(graded.reward_R, threshold, graded.source)
    decided = _decide(graded, teacher_graded, model, grader, teacher, privileged, threshold)
    return dataclasses.replace(decided, notes=decided.notes + graded.field_notes)


def _decide(graded: GradedRows, teacher_rows: GradedRows | None, model: str, grader: Any, teacher: Any,
            privileged: str, threshold: float) -> Route:
    asked: list[tuple[str, str]] = []
    for step in (_truncation, _rollouts, _band):
        decided = step(graded, asked, threshold, model=model, grader=grader, privileged=privileged)
        if decided is not None:
            return decided
    if teacher_rows is not None:
        decided = _teacher(graded, asked, threshold, teacher_rows, teacher)
        if decided is not None:
            return decided
    else:
        asked.append((Q_TEACHER, "no teacher rows given (pass teacher_rows=, or --teacher-rows, to check one)"))
    return _pairs(graded, asked) or _policy(graded, asked, model) or _grpo(graded, asked, threshold, model)


# --------------------------------------------------------------------------- the questions
def _truncation(graded: GradedRows, asked: list[tuple[str, str]], threshold: float, **_: Any) -> Route | None:
    cut = truncated_passes(graded, threshold)
    numbers = {"truncated_passes": cut, "truncated_rows": int(graded.truncated_R.sum()), "n_rows": graded.n_rows}
    if not cut:
        asked.append((Q_TRUNCATED, f"no: 0 truncated passes ({plural(numbers['truncated_rows'], 'truncated row')})"))
        return None
    answer = f"yes: {plural(cut, 'row')} cut at the token cap still {_verb(cut, 'passes', 'pass')}"
    asked.append((Q_TRUNCATED, answer))
    return Route("fix the reward", None, None, Q_TRUNCATED, answer, numbers, tuple(asked), (), (
        "make a truncated reply fail: score it 0 (GRPO's truncated='zero') or give it no gradient "
        "(truncated='mask'), or raise max_tokens so replies finish",
        "re-grade the rows and route again: until then truncation, not the model, decides every rate"))


def _rollouts(graded: GradedRows, asked: list[tuple[str, str]], threshold: float, **_: Any) -> Route | None:
    samples = np.bincount(graded.task_R, minlength=graded.n_tasks)
    k = int(samples.min())
    numbers = {"rollouts_per_task": k, "tasks_with_one_rollout": int(np.count_nonzero(samples == 1)),
               "n_tasks": graded.n_tasks}
    if k > 1:
        asked.append((Q_ROLLOUTS, f"k = {k} (the fewest any task has)"))
        return None
    ones = numbers["tasks_with_one_rollout"]
    answer = f"k = 1: {ones} of {plural(graded.n_tasks, 'task')} {_verb(ones, 'has', 'have')} a single rollout"
    asked.append((Q_ROLLOUTS, answer))
    config = build_method("flash_reinforce")
    return Route("k = 1", "flash_reinforce", config, Q_ROLLOUTS, answer, numbers, tuple(asked), (
        "wai.SAO(): a value critic plus a token band on the ratio", "wai.BPCO(): a critic bounded to the "
        "reward range", "prime-rl: wai.prime_rl_config(env, 'rae', model=..., **{'orchestrator.group_size': 1}) "
        "(REINFORCE against an EMA of past rewards; prime-rl refuses the three above)"), (
        "if you can re-run the prompts, sample k >= 4 per prompt and route again: usually the cheaper fix",
        "give every row logprobs and the sampler's behavior_logprobs (the ratio needs both), then "
        "config.update(batch) inside your trainer"))


def _band(graded: GradedRows, asked: list[tuple[str, str]], threshold: float, *, model: str, grader: Any,
          privileged: str) -> Route | None:
    samples, passes = task_counts(graded, threshold)
    rates = passes / samples
    numbers = {"pass_at_1": float(rates.mean()), "ci95": population_interval(rates, graded.n_rows), "n_tasks": graded.n_tasks,
               "tasks_all_fail": int(np.count_nonzero(passes == 0)),
               "tasks_all_pass": int(np.count_nonzero(passes == samples)),
               "split_share": float(np.mean((passes > 0) & (passes < samples)))}
    if (passes == 0).all():
        answer = f"floor: {_all(graded.n_tasks, 'task')} {_verb(graded.n_tasks, 'fails', 'fail')} every rollout"
        asked.append((Q_BAND, answer))
        return _floor(graded, asked, answer, numbers, model, privileged)
    if (passes == samples).all():
        answer = f"saturated: {_all(graded.n_tasks, 'task')} {_verb(graded.n_tasks, 'passes', 'pass')} every rollout"
        asked.append((Q_BAND, answer))
        return _saturated(asked, answer, numbers, grader)
    asked.append((Q_BAND, f"mixed: {numbers['split_share']:.1%} of tasks split"))
    return None


def _floor(graded: GradedRows, asked: list[tuple[str, str]], answer: str, numbers: dict[str, Any], model: str,
           privileged: str) -> Route:
    size = model_billions(model)
    numbers["model_billions"] = size
    steps = ["more rollouts do nothing here: k draws keep a pass with probability 1 - (1 - p)^k, 0 at p = 0"]
    if size is not None and size < OPSD_MIN_BILLIONS:
        config = build_method("sft")
        steps.insert(0, f"{model} looks like {size:g}B, under OPSD's ~{OPSD_MIN_BILLIONS:g}B: train SFT on a "
                     "stronger model's passing completions (sft-from-traces), then route again")
        return Route("floor", "sft", config, Q_BAND, answer + f"; the model is {size:g}B", numbers, tuple(asked),
                     (f"OPSD(privileged={privileged!r}) once the model is ~{OPSD_MIN_BILLIONS:g}B or more",),
                     tuple(steps))
    config = OPSD(privileged=privileged)
    steps.insert(0, f"show the self-teacher the context the task really has: privileged={privileged!r} "
                 f"(one of {', '.join(PRIVILEGED)}); each is a different paper")
    if size is None:
        steps.append(f"OPSD needs about {OPSD_MIN_BILLIONS:g}B parameters or more; under that, SFT on a "
                     "stronger model's completions")
    return Route("floor", "opsd", config, Q_BAND, answer, numbers, tuple(asked),
                 ("SFT on a stronger model's completions (sft-from-traces)",), tuple(steps))


def _saturated(asked: list[tuple[str, str]], answer: str, numbers: dict[str, Any], grader: Any) -> Route:
    steps = ["if no grader can tell the passes apart, the eval is too easy: harden it (strengthen-your-evals)"]
    if grader is None:
        config = None
        steps.insert(0, "pass grader= (a program that ranks passes; audit it first) to get "
                     "wai.GroupwiseGrading(grader, mode='reward')")
    else:
        config = GroupwiseGrading(grader, mode="reward")
        steps.insert(0, "audit the grader before trusting its ranks (audit-your-judge); mode='advantage' is GAR")
    return Route("saturated", "groupwise_grading", config, Q_BAND, answer, numbers, tuple(asked),
                 ("a harder eval (strengthen-your-evals)",), tuple(steps))


def _teacher(graded: GradedRows, asked: list[tuple[str, str]], threshold: float, teacher_rows: GradedRows,
             teacher: Any) -> Route | None:
    gap = teacher_gap(teacher_rows, graded, threshold)
    t_lo, t_hi = gap["teacher_ci95"]
    s_lo, s_hi = gap["student_ci95"]
    said = (f"teacher {gap['teacher_pass_at_1']:.3f} [{t_lo:.3f}, {t_hi:.3f}], student "
            f"{gap['student_pass_at_1']:.3f} [{s_lo:.3f}, {s_hi:.3f}], gap {gap['gap']:+.3f}")
    clears = gap["gap"] >= PROVE_EFFECT and gap["apart"]
    if not clears:
        why = "intervals overlap" if not gap["apart"] else f"gap under PROVE_EFFECT {PROVE_EFFECT}"
        asked.append((Q_TEACHER, f"no: {said} ({why})"))
        return None
    answer = f"yes: {said}, clears PROVE_EFFECT {PROVE_EFFECT} with intervals apart"
    asked.append((Q_TEACHER, answer))
    teacher_models = list(model_mix(teacher_rows))
    endpoint, notes = _endpoint(teacher, teacher_models[0] if teacher_models else "")
    config = OPD(endpoint)
    steps = ["check one tokenizer: the teacher's len(tokenizer) must equal the student's (per-token "
             "supervision; a mismatch drops the signal silently)",
             "score the teacher at the student's max_tokens: a teacher that wins only with a longer budget is "
             "cut off inside the OPD run"]
    return Route("strong teacher", "opd", config, Q_TEACHER, answer, _plain(gap), tuple(asked), (), tuple(steps),
                 notes)


def _pairs(graded: GradedRows, asked: list[tuple[str, str]]) -> Route | None:
    samples = np.bincount(graded.task_R, minlength=graded.n_tasks)
    lo = np.full(graded.n_tasks, np.inf)
    hi = np.full(graded.n_tasks, -np.inf)
    np.minimum.at(lo, graded.task_R, graded.reward_R)
    np.maximum.at(hi, graded.task_R, graded.reward_R)
    paired = int(np.count_nonzero((samples == 2) & (hi > lo)))
    if paired < graded.n_tasks:
        asked.append((Q_PAIRS, f"no: {paired} of {plural(graded.n_tasks, 'task')} {_verb(paired, 'is', 'are')} exactly one better and one worse row"))
        return None
    answer = f"yes: {_all(graded.n_tasks, 'task', 'each of the')} has exactly two rows with different rewards"
    asked.append((Q_PAIRS, answer))
    config = build_method("dpo")
    return Route("dpo pairs", "dpo", config, Q_PAIRS, answer, {"pairs": paired, "n_rows": graded.n_rows},
                 tuple(asked), (), ("wai select ROWS --mode dpo --out pairs.jsonl: length-matched pairs with "
                                    "'pair' and 'chosen' set",))


def _policy(graded: GradedRows, asked: list[tuple[str, str]], model: str) -> Route | None:
    mix = model_mix(graded)
    if on_policy(graded, model):
        asked.append((Q_POLICY, f"yes: {_all(graded.n_rows, 'row')} {_verb(graded.n_rows, 'is', 'are')} from {model}"))
        return None
    mine = mix.get(model, 0)
    others = ", ".join(f"{m} ({n})" for m, n in mix.items() if m != model)
    answer = (f"no: {graded.n_rows - mine} of {plural(graded.n_rows, 'row')} {_verb(graded.n_rows - mine, 'is', 'are')} "
              f"from another model: {others}")
    asked.append((Q_POLICY, answer))
    config = build_method("sft")
    writer = next((m for m in mix if m not in (model, "(none)")), None)
    return Route("another model's rows", "sft", config, Q_POLICY, answer, {"model_mix": mix, "model": model},
                 tuple(asked), (f"OPD with {writer or 'the model that wrote them'} as the teacher",), (
                     "wai select ROWS --mode sft --out passes.jsonl, then SFT on the passes (sft-from-traces)",
                     "rows from an older copy of this model (an async sampler) are a different case: wrap the "
                     "method, wai.Async('grpo', correction='icepop') in your own loop, or correction='ipo' to write it "
                     "for prime-rl (the pinned prime-rl has no icepop)",
                     "rows without a 'model' field count as another model's: record which model wrote each row"))


def _grpo(graded: GradedRows, asked: list[tuple[str, str]], threshold: float, model: str) -> Route:
    samples, passes = task_counts(graded, threshold)
    rates = passes / samples
    split = float(np.mean((passes > 0) & (passes < samples)))
    k = int(samples.min())
    numbers = {"split_share": split, "rollouts_per_task": k, "n_tasks": graded.n_tasks,
               "rl_keeps_rows": int(samples[(passes > 0) & (passes < samples)].sum()),
               f"expected_split_share_at_k{k}": float(expected_split_share(rates, k).mean()),
               f"expected_split_share_at_k{2 * k}": float(expected_split_share(rates, 2 * k).mean())}
    answer = f"yes: {split:.1%} of tasks split, every row from {model}"
    asked.append((Q_GRPO, answer))
    config = build_method("grpo", rollouts_per_prompt=k)
    steps = [f"rollouts_per_prompt={k} matches the rows (the fewest rollouts any task has); sample each prompt that "
             "many times in training, or set it to the k you will use",
             "wai select ROWS --mode rl --out kept.jsonl: drop the unanimous groups before the GPU",
             "size the held-out test with holdout_size(effect, k=...) and train a random selection of the "
             "same size beside the real one as a control"]
    alternatives: tuple[str, ...] = ()
    if split < FEW_SPLIT:
        now, more = numbers[f"expected_split_share_at_k{k}"], numbers[f"expected_split_share_at_k{2 * k}"]
        steps.insert(0, f"few split tasks ({split:.1%}): raising k from {k} to {2 * k} moves the expected split "
                     f"share from about {now:.1%} to {more:.1%} (plug-in from each task's rate, on the low side: "
                     "a task seen unanimous counts as never splitting)")
        alternatives = ("wai.methods.ReinforceAda: samples until a prompt has a pass and a fail (an "
                        "experiment: flat against GRPO at three seeds)",)
    return Route("grpo", "grpo", config, Q_GRPO, answer, numbers, tuple(asked), alternatives, tuple(steps))


# --------------------------------------------------------------------------- helpers
def _all(n: int, word: str, every: str = "all") -> str:
    """'the only task' or 'all 3 tasks'."""
    return f"the only {word}" if n == 1 else f"{every} {n} {word}s"


def _verb(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def model_billions(model: str) -> float | None:
    """Parameters in billions read off a model name ("Qwen/Qwen3-0.6B" -> 0.6), or None."""
    match = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])", model or "")
    return float(match.group(1)) if match else None


def _endpoint(teacher: Any, teacher_model: str) -> tuple[Any, tuple[str, ...]]:
    if teacher is None:
        return None, (f"OPD's teacher is not set: config.replace(teacher=wai.Endpoint(base_url=..., "
                      f"model={teacher_model!r})) with the URL that serves it (from the shell: --teacher-url URL)",)
    if isinstance(teacher, str):
        return Endpoint(base_url=teacher, model=teacher_model), ()
    return teacher, ()


def _config_dict(config: Any) -> Any:
    if config is None:
        return None
    if dataclasses.is_dataclass(config):
        name = getattr(config, "name", None)  # a method has a registry name; a nested Endpoint does not
        out = {"method": name} if isinstance(name, str) else {"type": type(config).__name__}
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            out[f.name] = _config_dict(value) if dataclasses.is_dataclass(value) else _plain(value)
        return out
    return repr(config)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (tuple, list)) and all(isinstance(v, float) for v in value):
        return "[" + ", ".join(f"{v:.3f}" for v in value) + "]"
    return str(value)
