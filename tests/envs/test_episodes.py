"""The episode runner (whileai.envs.episode) and the lookup tool (whileai.envs.tools).

Most tests drive ``play`` with a scripted sampler (a list of turns to write, as a model would) and the real
byte tokenizer, so every token of a row can be worked out by hand: byte b is token id 3 + b, EOS is 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

import whileai as wai
from whileai.engine.models import byte_tokenizer
from whileai.envs import (
    Env,
    EnvError,
    EnvTaskset,
    GraderError,
    Task,
    Taskset,
    load_taskset,
    play,
    reference_episode,
)
from whileai.envs.tools import Lookup, value_of
from whileai.errors import ConfigError

TOK = byte_tokenizer()
EOS = TOK.eos_token_id


def ids(text: str) -> list[int]:
    return [3 + b for b in text.encode()]


@dataclass
class Sample:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str


class ScriptedSampler:
    """Writes ``turns[k]`` as the model's k-th turn (logprob -0.5 per token), honouring ``max_tokens`` and stop
    strings on the text the way the engine does (the stop is kept); records every call. The turn number is read from
    the context: each finished turn and its reply add two newlines (prompts have none)."""

    def __init__(self, turns: list[str]) -> None:
        self.turns, self.calls = turns, []

    def __call__(self, contexts, n, max_tokens, stop, seed):
        self.calls.append({"contexts": contexts, "n": n, "max_tokens": max_tokens, "stop": stop, "seed": seed})
        return [[self._one(self.turns[min(c.count(ids("\n")[0]) // 2, len(self.turns) - 1)], max_tokens, stop)
                 for _ in range(n)] for c in contexts]

    @staticmethod
    def _one(text: str, max_tokens: int, stop: list[str]) -> Sample:
        tokens = ids(text) if text != "<eos>" else [EOS]
        for end in range(1, len(tokens) + 1):
            if any(s in TOK.decode(tokens[:end]) for s in stop) or tokens[end - 1] == EOS:
                return Sample(tokens[:end], [-0.5] * end, "stop")
        if len(tokens) > max_tokens:
            return Sample(tokens[:max_tokens], [-0.5] * max_tokens, "length")
        return Sample(tokens, [-0.5] * len(tokens), "length")


class Echo(Env):
    """Replies 'ok\\n' to every turn until the model writes 'bye', then rewards 1.0; counts its turns."""

    stop = ("\n",)
    max_turns = 3

    def __init__(self, task: Task) -> None:
        self.seen: list[str] = []

    def step(self, text: str) -> str | None:
        self.seen.append(text)
        return None if text.startswith("bye") else "ok\n"

    def reward(self) -> float:
        return 1.0 if self.seen and self.seen[-1].startswith("bye") else 0.25


def echo_taskset(env=Echo, max_tokens: int = 40) -> EnvTaskset:
    train = [Task(f"t{i}", f"p{i}", ["hi\n", "bye\n"]) for i in range(4)]
    return EnvTaskset("echo", train, [Task("x", "px", ["bye\n"])], env, max_tokens)


def run(turns: list[str], taskset: EnvTaskset | Taskset | None = None, per_task=(2,), **kw):
    taskset = taskset or echo_taskset()
    tasks = taskset.split("train")[:len(per_task)]
    sampler = ScriptedSampler(turns)
    rows = play(sampler, TOK, taskset, tasks, [[1] + ids(t.prompt) for t in tasks], list(per_task),
                max_tokens=kw.pop("max_tokens", taskset.max_tokens or 40), seed=7, **kw)
    return rows, sampler


# ------------------------------------------------------------------------------------- masks and caps
def test_masks_line_up_with_who_wrote_each_token():
    """hi\\n (model, 3) + ok\\n (env, 3) + bye\\n (model, 4): mask 1 1 1 0 0 0 1 1 1 1, env logprobs 0.0."""
    rows, _ = run(["hi\n", "bye\n"], per_task=(1,))
    (row,) = rows
    assert row["tokens"] == ids("hi\nok\nbye\n")
    assert row["action_mask"] == [True] * 3 + [False] * 3 + [True] * 4
    assert row["behavior_logprobs"] == [-0.5] * 3 + [0.0] * 3 + [-0.5] * 4
    assert row["reward"] == 1.0 and row["truncated"] is False
    assert row["completion"] == "hi\nok\nbye\n"
    wai.Batch.from_rows([{**row, "logprobs": row["behavior_logprobs"]}])  # a valid library row


def test_the_environment_sees_each_turn_with_its_stop_string_and_the_sampler_the_stop_strings():
    seen: list[list[str]] = []

    class Spy(Echo):
        def __init__(self, task):
            super().__init__(task)
            seen.append(self.seen)

    _, sampler = run(["hi\n", "bye\n"], echo_taskset(Spy), per_task=(1,))
    assert seen == [["hi\n", "bye\n"]]
    assert [c["stop"] for c in sampler.calls] == [["\n"]] * 2
    # turn 2 samples after the prompt, the model's first turn and the environment's reply
    assert sampler.calls[1]["contexts"] == [[1] + ids("p0") + ids("hi\nok\n")]


def test_turn_cap_truncates_and_drops_the_reply_after_the_last_turn():
    """max_turns = 3 and the model never says bye: three turns, two replies in context, truncated."""
    rows, sampler = run(["hi\n"], per_task=(1,))
    (row,) = rows
    assert len(sampler.calls) == 3
    assert row["tokens"] == ids("hi\nok\nhi\nok\nhi\n")
    assert row["truncated"] is True and row["reward"] == 0.25


def test_token_cap_cuts_a_turn_and_marks_the_episode_truncated():
    """Budget 8: hi\\n (3) + ok\\n (3) leaves 2, so 'bye\\n' is cut to 'by': truncated, reward from the env."""
    rows, sampler = run(["hi\n", "bye\n"], per_task=(1,), max_tokens=8)
    (row,) = rows
    assert row["tokens"] == ids("hi\nok\nby") and len(row["tokens"]) == 8
    assert sampler.calls[1]["max_tokens"] == 2
    assert row["truncated"] is True


def test_a_reply_longer_than_the_budget_is_cut_and_the_episode_ends():
    rows, _ = run(["hi\n"], per_task=(1,), max_tokens=5)
    (row,) = rows
    assert row["tokens"] == ids("hi\nok") and row["action_mask"] == [True] * 3 + [False] * 2
    assert row["truncated"] is True


def test_model_context_caps_the_budget():
    """A context of 10 and a 3-token prompt leave 7 tokens: the first call may write at most 7."""
    rows, sampler = run(["hi\n"], per_task=(1,), max_tokens=40, context=10)
    assert sampler.calls[0]["max_tokens"] == 7
    assert len(rows[0]["tokens"]) == 7


def test_groups_share_one_call_per_turn_and_rows_come_in_task_order():
    """per_task (2, 1, 3): the first turn is one call per group size (n = 1, 2, 3, seeds 7 + n); later
    turns are one call for every live episode."""
    rows, sampler = run(["hi\n", "bye\n"], per_task=(2, 1, 3))
    assert [(c["n"], c["seed"], len(c["contexts"])) for c in sampler.calls[:3]] == [(1, 8, 1), (2, 9, 1), (3, 10, 1)]
    assert len(sampler.calls) == 4 and len(sampler.calls[3]["contexts"]) == 6
    assert [r["task_id"] for r in rows] == ["t1", "t0", "t0", "t2", "t2", "t2"]


def test_a_plain_taskset_is_the_one_turn_case():
    """Graded once on the whole completion, no action_mask; a reply that reaches a cap the taskset set is
    complete (cap_ends_turn), and without that rule it is truncated."""
    plain = Taskset("plain", [Task("a", "p", "xy")], [Task("b", "q", "z")], lambda t, c: float(c == "xyz"), 3)
    rows, _ = run(["xyzw"], plain, per_task=(1,), max_tokens=3, cap_ends_turn=True)
    assert rows[0]["tokens"] == ids("xyz") and rows[0]["reward"] == 1.0
    assert "action_mask" not in rows[0] and rows[0]["truncated"] is False
    rows, _ = run(["xyzw"], plain, per_task=(1,), max_tokens=3)
    assert rows[0]["truncated"] is True


# ------------------------------------------------------------------------------------- errors
def test_a_step_that_raises_names_the_task_and_the_turn():
    class Broken(Echo):
        def step(self, text):
            if len(self.seen) == 1:
                raise KeyError("no such tool")
            return super().step(text)

    with pytest.raises(EnvError, match=r"Broken.step raised KeyError.*task_id='t0' at model turn 2"):
        run(["hi\n"], echo_taskset(Broken), per_task=(1,))


@pytest.mark.parametrize(("reward", "what"), [(math.nan, "nan"), (True, "True"), ("1", "'1'")])
def test_a_reward_that_is_not_a_finite_number_names_the_task(reward, what):
    class Bad(Echo):
        def reward(self):
            return reward

    with pytest.raises(EnvError, match=rf"Bad.reward returned {what} on task_id='t0'"):
        run(["bye\n"], echo_taskset(Bad), per_task=(1,))


def test_a_reply_that_is_not_text_is_refused():
    class Number(Echo):
        def step(self, text):
            return 42

    with pytest.raises(EnvError, match="step returned 42 on task_id='t0' at model turn 1; it must return"):
        run(["hi\n"], echo_taskset(Number), per_task=(1,))


def test_a_plain_graders_error_passes_through_naming_the_task():
    plain = Taskset("plain", [Task("a", "p", "xy")], [Task("b", "q", "z")], lambda t, c: 1 / 0, 3)
    with pytest.raises(GraderError, match="ZeroDivisionError.*task_id='a'"):
        run(["xy"], plain, per_task=(1,))


def test_bad_env_settings_and_factories_are_config_errors():
    class NoStop(Echo):
        stop = "\n"  # a string, not a tuple of strings

    class NoTurns(Echo):
        max_turns = 0

    with pytest.raises(ConfigError, match=r"NoStop.stop='\\n' must be a tuple"):
        run(["hi\n"], echo_taskset(NoStop), per_task=(1,))
    with pytest.raises(ConfigError, match="NoTurns.max_turns=0 must be an integer >= 1"):
        run(["hi\n"], echo_taskset(NoTurns), per_task=(1,))
    with pytest.raises(ConfigError, match="returned dict for task_id='t0'"):
        run(["hi\n"], echo_taskset(lambda task: {}), per_task=(1,))
    with pytest.raises(ConfigError, match="must be callable"):
        EnvTaskset("x", [Task("a", "p")], [Task("b", "q")], env="Echo")
    with pytest.raises(ConfigError, match="played as episodes"):
        echo_taskset().grade(Task("a", "p"), "text")


# ------------------------------------------------------------------------------------- the reference
def test_reference_episode_plays_the_answer_against_the_env():
    tokens, mask = reference_episode(echo_taskset(), Task("t", "p", ["hi\n", "bye\n"]), TOK)
    assert tokens == ids("hi\nok\nbye\n") and mask == [True] * 3 + [False] * 3 + [True] * 4


def test_reference_turns_without_a_stop_string_end_with_eos():
    tokens, mask = reference_episode(echo_taskset(), Task("t", "p", ["hi", "bye"]), TOK)
    assert tokens == ids("hi") + [EOS] + ids("ok\n") + ids("bye") + [EOS]
    assert mask == [True] * 3 + [False] * 3 + [True] * 4


def test_a_plain_reference_ends_with_eos_unless_it_fills_the_cap():
    """An answer that fills the taskset's cap ends at the cap (no EOS); a shorter one, or one under no cap, gets
    EOS so that the warm start teaches the model to stop there (builtin:add's '7' under a cap of 3)."""
    capped = Taskset("c", [Task("a", "p", "xy"), Task("s", "p", "x")], [Task("b", "q", "z")], lambda t, c: 1.0, 2)
    free = Taskset("f", [Task("a", "p", "xy")], [Task("b", "q", "z")], lambda t, c: 1.0, None)
    full, short = capped.split("train")
    assert reference_episode(capped, full, TOK) == (ids("xy"), [True, True])
    assert reference_episode(capped, short, TOK) == (ids("x") + [EOS], [True, True])
    assert reference_episode(free, free.split("train")[0], TOK) == (ids("xy") + [EOS], [True] * 3)


@pytest.mark.parametrize(("answer", "match"), [
    (["bye\n", "hi\n"], "ended the episode after turn 1 of the reference's 2"),
    (["hi\n"], "still answered after the last of turn 1"),
    ("hi\n", "a non-empty list of strings"),
    (None, "has no reference answer"),
])
def test_a_reference_the_env_does_not_follow_is_refused(answer, match):
    with pytest.raises(ConfigError, match=match):
        reference_episode(echo_taskset(), Task("t", "p", answer), TOK)


def test_a_reference_of_max_turns_turns_ends_at_the_turn_cap_as_a_sampled_episode_does():
    """Echo's cap is 3 turns: a reference that never says bye is played to the cap, the env's reply after the
    last turn left out (a sampled episode ends there, truncated); at 2 turns the env still answering is refused."""
    tokens, mask = reference_episode(echo_taskset(), Task("t", "p", ["hi\n", "hi\n", "hi\n"]), TOK)
    assert tokens == ids("hi\nok\nhi\nok\nhi\n") and mask == ([True] * 3 + [False] * 3) * 2 + [True] * 3
    with pytest.raises(ConfigError, match="still answered after the last of turn 2 of the reference's 2"):
        reference_episode(echo_taskset(), Task("t", "p", ["hi\n", "hi\n"]), TOK)


# ------------------------------------------------------------------------------------- builtin:lookup
def test_lookup_tool_answers_errors_and_grades_by_hand():
    task = Task("vcu", "vcu?", ("get vcu\n", "qob\n"), {"key_len": 3, "value_len": 3, "letters": 26})
    env = Lookup(task)
    assert env.value == value_of("vcu", 3, 26) == "qob"
    assert env.step("get vcu\n") == "=qob\n"
    assert env.step("get abc\n") == f"={value_of('abc', 3, 26)}\n"
    assert env.step("get\n") == "error: write get KEY\n"
    assert env.step("get v1\n") == "error: write get KEY\n"
    assert env.step("get ab\n") == "error: no key ab\n"
    assert env.step("qox\n") is None
    assert env.reward() == pytest.approx(2 / 3)  # q, o right; x wrong


def test_lookup_split_and_reference_episodes():
    tasks = load_taskset("builtin:lookup", test_size=16, train_size=64, seed=3)
    train, test = tasks.split("train"), tasks.split("test")
    assert len(train) == 64 and len(test) == 16 and not {t.prompt for t in train} & {t.prompt for t in test}
    for task in train[:8] + test[:8]:
        tokens, mask = reference_episode(tasks, task, TOK)
        key, value = task.prompt[:-1], value_of(task.prompt[:-1], 3, 26)
        assert TOK.decode(tokens) == f"get {key}\n={value}\n{value}\n"
        assert mask == [True] * 8 + [False] * 5 + [True] * 4
        env = tasks.make_env(task)
        for turn in task.answer:
            env.step(turn)
        assert env.reward() == 1.0  # the reference is a pass


def test_lookup_options_are_checked():
    with pytest.raises(ConfigError, match="unknown option"):
        load_taskset("builtin:lookup", key_length=3)
    with pytest.raises(ConfigError, match="leaves no training key"):
        load_taskset("builtin:lookup", letters=2, key_len=2, test_size=4)
    with pytest.raises(ConfigError, match="'lookup'"):
        load_taskset("builtin:nope")


def test_real_model_episodes_are_valid_rows():
    """builtin:tiny playing lookup with the engine's sampler: every row is a valid library row, env tokens
    are exactly what the environment wrote, and nothing exceeds the cap."""
    from whileai.engine import TrainingEngine
    from whileai.engine.sampling import SamplingParams
    from whileai.envs import render_prompt
    from whileai.loop.sources.rollouts import rollouts

    engine = TrainingEngine("builtin:tiny", seed=0)
    tasks = load_taskset("builtin:lookup", test_size=8, train_size=8)
    # a warm start on reference episodes makes the model call the tool, so episodes have env turns
    from whileai.engine.datums import make_datum

    train = tasks.split("train")
    for _ in range(30):
        data = [(render_prompt(engine.tokenizer, t), *reference_episode(tasks, t, engine.tokenizer)) for t in train]
        count = sum(sum(m) for *_, m in data)
        engine.forward_backward([make_datum(p, a, weights=[m / count for m in mask]) for p, a, mask in data],
                                "cross_entropy")
        engine.optim_step({"learning_rate": 1e-2})
    rows = rollouts(engine, tasks, train, [render_prompt(engine.tokenizer, t) for t in train], [2] * 8,
                    SamplingParams(max_tokens=tasks.max_tokens, temperature=1.0), seed=0, sampler_step=0,
                    cap_is_answer_length=True)
    assert len(rows) == 16
    with_env = [r for r in rows if "action_mask" in r]
    assert with_env, "the warm-started model should call the tool at least once in 16 episodes"
    for row in rows:
        n = len(row["tokens"])
        assert n == len(row["behavior_logprobs"]) <= tasks.max_tokens
        mask = np.asarray(row.get("action_mask", [True] * n))
        assert np.all(np.asarray(row["behavior_logprobs"])[~mask] == 0.0)
        assert np.all(np.asarray(row["behavior_logprobs"])[mask] < 0.0)
    for row in with_env:
        mask = np.asarray(row["action_mask"])
        env_text = TOK.decode(np.asarray(row["tokens"])[~mask].tolist())
        assert env_text.startswith(("=", "error:")), env_text
    wai.Batch.from_rows([{**r, "logprobs": r["behavior_logprobs"]} for r in rows])


def test_the_docs_reference_episode_prints_what_the_docs_show(capsys):
    """docs/environments.md's reference-episode block, run as written, prints the output shown under it."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    code, shown = re.search(r"```python\n(from whileai.engine.models import byte_tokenizer.*?)```\n\n```text\n(.*?)```",
                            text, flags=re.S).groups()
    exec(compile(code, "docs/environments.md", "exec"), {})
    assert capsys.readouterr().out == shown
