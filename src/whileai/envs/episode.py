"""Environments: episodes where the model writes a turn and the environment answers, until it ends them.

    class Lookup(Env):
        stop = ("\\n",)                      # a model turn ends at a newline (or at EOS)
        def __init__(self, task): ...
        def step(self, text): ...           # the environment's reply (str), or None: the episode is over
        def reward(self): ...               # asked once, when the episode is over

    tasks = EnvTaskset("lookup", train, test, env=Lookup, max_tokens=32)

An episode is the prompt, then model turn, environment reply, model turn, ... until ``step`` returns None,
the model has had ``max_turns`` turns, or the tokens after the prompt reach the cap (then it is
``truncated``). Its row covers everything after the prompt: the environment's tokens are in ``tokens`` with
``action_mask`` false and a behavior log-probability of 0.0 (the environment wrote them with certainty;
every method gives a masked token c = 0 and leaves it out of its statistics). A plain ``Taskset`` is the
one-turn case: ``OneTurn`` ends after the first turn and its reward is the taskset's grade.

``play`` runs many episodes at once: every turn is one batched call of a sampler for all live episodes.
Nothing here imports torch; the sampler is passed in (``whileai.loop.sources.rollouts`` builds it from an engine).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from whileai.envs.core import GraderError, Task, Taskset
from whileai.errors import ConfigError

ENV_LOGPROB = 0.0
"""behavior log-probability of a token the environment wrote (certain; masked, so no method reads it)"""
TURN_SEED_STRIDE = 7919  # a later turn's sampler seed: seed + stride * turn (turn 0 keeps the one-turn seeds)
GRADE_TIMEOUT_S = 10.0
"""the most one grade (a grader's call, an environment's ``reward()``) may take, in the probe before the warm
start and at every grade of the run: a grade that takes longer stops the run naming its task (a grader that
hangs would stall every step)"""
STOP_SEED_STRIDE = 104_729  # one more stride per group of episodes with other stop strings in the same turn

Sampler = Callable[[list[list[int]], int, int, list[str], int], list[list[Any]]]
"""``sampler(prompts, n, max_tokens, stop, seed)`` -> ``n`` samples per prompt, each with ``.tokens``,
``.logprobs`` and ``.stop_reason`` ("stop" or "length"); ``stop`` holds the environment's stop strings, matched
on the decoded text (``whileai.engine.stops``); every EOS id ends a sample too"""


class EnvError(GraderError):
    """An environment raised, or answered with something that is not a reply, None or a finite reward."""


class Env:
    """One episode of one task. Subclass it: set ``stop`` and ``max_turns``, implement ``step`` and ``reward``."""

    stop: tuple[str, ...] = ()
    """text that ends a model turn, besides every EOS id: matched on the decoded text (``whileai.engine.stops``),
    so the turn ends on the token that completes it (kept, with any text that token holds past it)"""
    max_turns: int = 8
    """most model turns per episode; an episode the environment has not ended by then is truncated"""

    def step(self, text: str) -> str | None:
        """React to the model's turn ``text`` (special tokens removed; a stop string it ended on is kept).

        Return the environment's reply (tool output, a user turn, an error message), which goes into the
        context with action_mask false, or None to end the episode."""
        raise NotImplementedError(f"{type(self).__name__}.step: return the environment's reply or None")

    def reward(self) -> float:
        """The episode's reward (a pass is >= 1.0), asked once when it is over, also when a cap cut it."""
        raise NotImplementedError(f"{type(self).__name__}.reward: return the episode's reward")


class OneTurn(Env):
    """A plain taskset as an environment: one model turn, graded by the taskset's grader."""

    max_turns = 1

    def __init__(self, taskset: Any, task: Task) -> None:
        self.taskset, self.task, self.text = taskset, task, ""

    def step(self, text: str) -> None:
        self.text = text
        return None

    def reward(self) -> float:
        return float(self.taskset.grade(self.task, self.text))


class EnvTaskset(Taskset):
    """A taskset played as episodes: ``env(task)`` makes a fresh ``Env`` for every episode of ``task``.

    ``Task.answer`` is the reference episode's model turns (a list of strings), which the supervised warm
    start imitates with the environment's replies in between (masked). ``max_tokens`` caps every token
    after the prompt, the model's and the environment's together."""

    def __init__(self, name: str, train: Sequence[Task], test: Sequence[Task], env: Callable[[Task], Env],
                 max_tokens: int | None = None) -> None:
        if not callable(env):
            raise ConfigError(f"taskset {name!r}: env={env!r} must be callable, task -> Env (e.g. an Env subclass "
                              "whose __init__ takes the task)")
        super().__init__(name, train, test, _no_grader, max_tokens)
        self.env = env

    def make_env(self, task: Task) -> Env:
        """A fresh environment for one episode of ``task`` (checked: an ``Env`` with valid settings)."""
        env = self.env(task)
        if not isinstance(env, Env):
            raise ConfigError(f"taskset {self.name!r}: env(task) returned {type(env).__name__} for task_id="
                              f"{task.task_id!r}; it must return an instance of a whileai.envs.Env subclass")
        check_env(env, self.name)
        return env

    def grade(self, task: Task, completion: str) -> float:
        raise ConfigError(f"taskset {self.name!r} is played as episodes, so there is no grade of one completion: "
                          "its rewards come from Env.reward(); run it with wai.train or whileai.envs.play")


def _no_grader(task: Task, completion: str) -> float:
    raise ConfigError("an EnvTaskset has no grader: its rewards come from Env.reward()")


def check_env(env: Env, taskset_name: str) -> None:
    """``stop`` a tuple of non-empty strings, ``max_turns`` an integer >= 1; a ConfigError naming the field."""
    where = f"taskset {taskset_name!r}: {type(env).__name__}"
    stop = env.stop
    if isinstance(stop, str) or not isinstance(stop, (tuple, list)) or not all(isinstance(s, str) and s for s in stop):
        raise ConfigError(f"{where}.stop={stop!r} must be a tuple of non-empty strings, e.g. ('\\n',)")
    turns = env.max_turns
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise ConfigError(f"{where}.max_turns={turns!r} must be an integer >= 1 (model turns per episode)")


def is_episodic(taskset: Any) -> bool:
    """Whether the taskset makes its own environments (multi-turn), rather than grading one completion."""
    return callable(getattr(taskset, "make_env", None))


def make_env(taskset: Any, task: Task) -> Env:
    """The taskset's environment for ``task``, or ``OneTurn`` for a plain taskset."""
    return taskset.make_env(task) if is_episodic(taskset) else OneTurn(taskset, task)


# ------------------------------------------------------------------------------------- one episode
@dataclass
class Episode:
    """An episode in progress: its environment, the tokens after the prompt so far, and what is left."""

    task: Task
    prompt: list[int]
    env: Env
    budget: int
    """tokens still allowed after the prompt"""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    turns: int = 0
    done: bool = False
    truncated: bool = False

    def add(self, tokens: Sequence[int], logprobs: Sequence[float], action: bool) -> None:
        self.tokens += [int(t) for t in tokens]
        self.logprobs += [float(x) for x in logprobs]
        self.mask += [action] * len(tokens)
        self.budget -= len(tokens)

    def end(self, truncated: bool) -> None:
        self.done, self.truncated = True, truncated


def env_step(env: Env, taskset_name: str, task: Task, turn: int, text: str) -> str | None:
    """``env.step(text)``, with any failure or a reply that is not text or None named by task and turn."""
    try:
        reply = env.step(text)
    except GraderError:
        raise
    except Exception as exc:
        raise EnvError(f"taskset {taskset_name!r}: {type(env).__name__}.step raised {type(exc).__name__}: {exc} on "
                       f"task_id={task.task_id!r} at model turn {turn} (text {text[:80]!r}); fix the environment so "
                       "step returns its reply (str) or None for every turn") from exc
    if reply is not None and not isinstance(reply, str):
        raise EnvError(f"taskset {taskset_name!r}: {type(env).__name__}.step returned {reply!r:.60} on task_id="
                       f"{task.task_id!r} at model turn {turn}; it must return the reply as a str, or None to end")
    return reply


def within(call: Callable[[], Any], who: str, where: str, seconds: float | None = None) -> Any:
    """``call()``, or an EnvError saying ``who`` (the grader) did not return within ``seconds`` ``where`` (the task)
    (default ``GRADE_TIMEOUT_S``). The call runs in a daemon thread, which cannot be stopped from outside: a call
    that hangs is left behind and the run stops."""
    seconds = GRADE_TIMEOUT_S if seconds is None else seconds
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread
            out["error"] = err

    worker = threading.Thread(target=run, daemon=True, name="whileai-grade")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise EnvError(f"{who} did not return within {seconds:g} s {where}: a grade must be quick, since every step grades "
                       "a batch; make it return (a timeout of its own, no network call without one)")
    if "error" in out:
        raise out["error"]
    return out["value"]


def env_reward(env: Env, taskset_name: str, task: Task) -> float:
    """``env.reward()`` as a finite float within ``GRADE_TIMEOUT_S``, or an EnvError naming the task."""
    who = "the grader" if isinstance(env, OneTurn) else f"{type(env).__name__}.reward"
    text = f" (completion {env.text[:40]!r})" if isinstance(env, OneTurn) else ""
    try:
        reward = within(env.reward, f"taskset {taskset_name!r}: {who}", f"on task_id={task.task_id!r}{text}")
    except GraderError:
        raise
    except Exception as exc:
        raise EnvError(f"taskset {taskset_name!r}: {type(env).__name__}.reward raised {type(exc).__name__}: {exc} on "
                       f"task_id={task.task_id!r}; fix the environment so reward returns a number") from exc
    if isinstance(reward, bool) or not isinstance(reward, Real) or not math.isfinite(float(reward)):
        raise EnvError(f"taskset {taskset_name!r}: {type(env).__name__}.reward returned {reward!r} on task_id="
                       f"{task.task_id!r}; a reward must be a finite number (a pass is >= 1.0)")
    return float(reward)


# ------------------------------------------------------------------------------------- many episodes
def play(sampler: Sampler, tokenizer: Any, taskset: Any, tasks: Sequence[Task], prompts: Sequence[list[int]],
         per_task: Sequence[int], *, max_tokens: int, seed: int, context: int | None = None,
         cap_ends_turn: bool = False) -> list[dict[str, Any]]:
    """``per_task[i]`` episodes of ``tasks[i]`` (a group per prompt), played turn by turn; one row each.

    ``max_tokens`` caps the tokens after the prompt (model and environment together; also the model's
    ``context`` when given). ``cap_ends_turn``: a one-turn reply that reaches the cap is complete, not
    truncated (a taskset whose cap is its answers' length). Rows come in order of group size, then task.
    """
    episodes: list[Episode] = []
    for n in sorted(set(per_task) - {0}):
        members = [i for i, k in enumerate(per_task) if k == n]
        started = [_start(taskset, tasks[i], prompts[i], max_tokens, context) for i in members for _ in range(n)]
        _first_turn(sampler, tokenizer, taskset, started, n, seed + n, cap_ends_turn)
        episodes += started
    turn = 1
    while live := [e for e in episodes if not e.done]:
        for g, group in enumerate(_by_stop(live)):
            samples = sampler([e.prompt + e.tokens for e in group], 1, max(e.budget for e in group),
                              list(group[0].env.stop),
                              seed + TURN_SEED_STRIDE * turn + STOP_SEED_STRIDE * g)
            for episode, (sample,) in zip(group, samples):
                _take(tokenizer, taskset, episode, sample, cap_ends_turn)
        turn += 1
    return [_row(tokenizer, taskset, e) for e in episodes]


def _start(taskset: Any, task: Task, prompt: list[int], max_tokens: int, context: int | None) -> Episode:
    budget = max_tokens if context is None else min(max_tokens, context - len(prompt))
    return Episode(task, list(prompt), make_env(taskset, task), max(budget, 1))


def _first_turn(sampler: Sampler, tokenizer: Any, taskset: Any, started: list[Episode], n: int, seed: int,
                cap_ends_turn: bool) -> None:
    """The first turn of a group size's episodes: ``n`` samples per prompt, one call per set of stop strings."""
    blocks = [started[k:k + n] for k in range(0, len(started), n)]  # one prompt's n episodes each
    calls: dict[tuple[str, ...], list[list[Episode]]] = {}
    for block in blocks:
        stop = tuple(block[0].env.stop)
        if any(tuple(e.env.stop) != stop for e in block):
            raise ConfigError(f"taskset {taskset.name!r}: the environments of task_id={block[0].task.task_id!r} "
                              "have different stop strings; one task's episodes must share them")
        calls.setdefault(stop, []).append(block)
    for g, (stop, group) in enumerate(calls.items()):
        samples = sampler([b[0].prompt for b in group], n, max(b[0].budget for b in group),
                          list(stop), seed + STOP_SEED_STRIDE * g)
        for block, sequences in zip(group, samples):
            for episode, sample in zip(block, sequences):
                _take(tokenizer, taskset, episode, sample, cap_ends_turn)


def _by_stop(episodes: list[Episode]) -> list[list[Episode]]:
    """Episodes grouped by their stop strings (one sampler call per group), in order of first appearance."""
    groups: dict[tuple[str, ...], list[Episode]] = {}
    for e in episodes:
        groups.setdefault(tuple(e.env.stop), []).append(e)
    return list(groups.values())


def _take(tokenizer: Any, taskset: Any, episode: Episode, sample: Any, cap_ends_turn: bool) -> None:
    """Add one sampled model turn (cut to the episode's budget), then the environment's answer."""
    tokens, logprobs = list(sample.tokens)[:episode.budget], list(sample.logprobs)[:episode.budget]
    cut = sample.stop_reason == "length" or len(sample.tokens) > episode.budget
    episode.add(tokens, logprobs, action=True)
    episode.turns += 1
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    reply = env_step(episode.env, taskset.name, episode.task, episode.turns, text)
    if reply is None:
        episode.end(truncated=cut and not (cap_ends_turn and episode.turns == 1))
        return
    if episode.turns >= episode.env.max_turns or episode.budget <= 0:
        episode.end(truncated=True)  # the environment wanted another turn that there is no room for
        return
    ids = [int(t) for t in tokenizer.encode(reply, add_special_tokens=False)][:episode.budget]
    episode.add(ids, [ENV_LOGPROB] * len(ids), action=False)
    if episode.budget <= 0:
        episode.end(truncated=True)


def _row(tokenizer: Any, taskset: Any, episode: Episode) -> dict[str, Any]:
    """The library's row: ``action_mask`` only when the environment wrote tokens (absent: all actions)."""
    row: dict[str, Any] = {
        "task_id": episode.task.task_id, "reward": env_reward(episode.env, taskset.name, episode.task),
        "prompt_tokens": list(episode.prompt), "tokens": list(episode.tokens),
        "behavior_logprobs": list(episode.logprobs), "truncated": bool(episode.truncated),
        "completion": tokenizer.decode(episode.tokens, skip_special_tokens=True)}
    if not all(episode.mask):
        row["action_mask"] = list(episode.mask)
    return row


# ------------------------------------------------------------------------------------- the reference
def reference_episode(taskset: Any, task: Task, tokenizer: Any) -> tuple[list[int], list[bool]]:
    """The tokens after the prompt of ``task``'s reference episode, and which the model wrote (the mask).

    The model's turns come from ``task.answer`` (one string for a plain taskset, a list of turns for an
    ``EnvTaskset``); the environment's replies in between come from playing them against a fresh env. A
    turn that does not end on a stop string gets EOS, except a plain taskset's answer that fills the taskset's
    cap (the cap ends it); a shorter answer gets EOS, so that the model learns to stop there. A reference of
    ``max_turns`` turns that the environment would still answer ends at the turn cap, as a sampled episode does
    (a demonstration that never reaches the goal); a shorter one it still answers, or one it ends early, is refused."""
    env = make_env(taskset, task)
    turns = _reference_turns(taskset, task)
    eos = getattr(tokenizer, "eos_token_id", None)
    capped = isinstance(env, OneTurn) and taskset.max_tokens is not None
    tokens: list[int] = []
    mask: list[bool] = []
    for k, turn in enumerate(turns, start=1):
        ids = [int(t) for t in tokenizer.encode(turn, add_special_tokens=False)]
        fills_cap = capped and len(ids) >= taskset.max_tokens
        if eos is not None and not fills_cap and not any(turn.endswith(s) for s in env.stop):
            ids.append(int(eos))
        tokens += ids
        mask += [True] * len(ids)
        reply = env_step(env, taskset.name, task, k, tokenizer.decode(ids, skip_special_tokens=True))
        if reply is not None and k == len(turns) == env.max_turns:
            break  # the turn cap ends it, as it ends a sampled episode (truncated): an imperfect demonstration
        if (reply is None) != (k == len(turns)):
            what = "ended the episode after" if reply is None else "still answered after the last of"
            raise ConfigError(f"taskset {taskset.name!r}: task_id={task.task_id!r}: the environment {what} turn {k} "
                              f"of the reference's {len(turns)}; fix Task.answer (the model's turns) or the env")
        if reply is not None:
            ids = [int(t) for t in tokenizer.encode(reply, add_special_tokens=False)]
            tokens += ids
            mask += [False] * len(ids)
    return tokens, mask


def _reference_turns(taskset: Any, task: Task) -> list[str]:
    answer = task.answer
    if answer is None:
        raise ConfigError(f"warm_start_steps: task_id={task.task_id!r} has no reference answer to imitate; set "
                          "--warm-start-steps 0 or give the taskset answers")
    if not is_episodic(taskset):
        return [str(answer)]
    if isinstance(answer, str) or not isinstance(answer, Sequence) or not answer \
            or not all(isinstance(t, str) for t in answer):
        raise ConfigError(f"taskset {taskset.name!r}: task_id={task.task_id!r} has answer {answer!r:.80}; an "
                          "EnvTaskset's answer is the reference episode's model turns, a non-empty list of strings")
    return list(answer)
