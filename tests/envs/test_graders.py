"""Every grader on hand-worked examples; user graders by import path; bad rewards stop with the task named."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

import whileai as wai
from whileai.envs import GraderError, Task, Taskset
from whileai.envs.graders import GRADERS, grader, last_number


def score(name: str, answer, completion: str) -> float:
    return grader(name)(Task("t", "q", answer), completion)


def test_exact():
    assert score("exact", "42", " 42\n") == 1.0   # surrounding whitespace stripped on both sides
    assert score("exact", 42, "42") == 1.0        # a number answer compares as its text
    assert score("exact", "42", "42.") == 0.0
    assert score("exact", "Paris", "paris") == 0.0


def test_chars():
    assert score("chars", "48", "48") == 1.0
    assert score("chars", "48", "4") == 0.5
    assert score("chars", "48", "49") == 0.5
    assert score("chars", "48", "48x") == pytest.approx(2 / 3)
    assert score("chars", "48", " 48") == 0.0     # no stripping: every position shifted


def test_numeric():
    assert score("numeric", 1234.5, "so it is 1,234.5 apples") == 1.0
    assert score("numeric", "5", "3 then 5") == 1.0       # the last number counts
    assert score("numeric", "3", "3 then 5") == 0.0
    assert score("numeric", -7, "x = -7") == 1.0
    assert score("numeric", 1000, "1e3") == 1.0
    assert score("numeric", "0.3333333", "0.33333334") == 1.0  # |diff| 4e-8 <= 1e-6
    assert score("numeric", "0.3333333", "0.333") == 0.0
    assert score("numeric", 12, "no number here") == 0.0
    assert last_number("a 1.5 b .5") == 0.5


def test_regex():
    assert score("regex", "(?i)yes", "YES\n") == 1.0
    assert score("regex", "ye", "yes") == 0.0          # the whole completion must match
    assert score("regex", r"\d+ apples", "12 apples") == 1.0
    assert score("regex", r".*\b42\b.*", "it is 42, I think") == 1.0


def test_math():
    pytest.importorskip("math_verify")
    assert score("math", "1/2", r"The answer is \boxed{0.5}") == 1.0
    assert score("math", r"\frac{1}{2}", "0.5") == 1.0
    assert score("math", "1/2", "1/3") == 0.0
    assert score("math", "x^2", "$x^2$") == 1.0
    assert score("math", "42", "so 41") == 0.0


def test_user_grader_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_graders.py").write_text(
        "def length(task, completion):\n    return len(completion) / 10\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = grader("my_graders:length")
    assert fn(Task("t", "q"), "abcde") == 0.5
    sys.modules.pop("my_graders", None)


def test_user_grader_by_file_path(tmp_path, monkeypatch):
    """'./graders.py:fn' (a newcomer's first guess) loads the file; it was a raw TypeError from importlib."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "graders.py").write_text("def half(task, completion):\n    return 0.5\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.chdir(tmp_path)
    for path in ("./lib/graders.py:half", "lib/graders.py:half", str(tmp_path / "lib" / "graders.py") + ":half"):
        assert grader(path)(Task("t", "q"), "x") == 0.5
    with pytest.raises(wai.ConfigError, match="no file 'missing.py'"):
        grader("./missing.py:half")
    with pytest.raises(wai.ConfigError, match="running 'broken.py' failed: RuntimeError: boom"):
        grader("broken.py:half")
    with pytest.raises(wai.ConfigError, match="has no callable 'other'"):
        grader("lib/graders.py:other")


@pytest.mark.parametrize(("path", "why"), [("bogus", r"use one of \['chars', 'exact', 'math', 'numeric', 'regex'\]"),
                                           ("no_such_module_xyz:f", "cannot be imported"),
                                           ("os:no_such_function", "has no callable 'no_such_function'"),
                                           (":f", "module:function")])
def test_bad_grader_names(path, why):
    with pytest.raises(wai.ConfigError, match=why):
        grader(path)


def test_callable_passes_through_and_names_are_listed():
    def fn(task, completion):
        return 1.0

    assert grader(fn) is fn
    assert set(GRADERS) == {"exact", "chars", "numeric", "regex", "math"}


def taskset_with(fn) -> Taskset:
    return Taskset("t", [Task("a", "x")], [Task("b", "y")], fn)


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1", None, True])
def test_bad_reward_names_the_task(bad):
    tasks = taskset_with(lambda task, completion: bad)
    with pytest.raises(GraderError, match=r"task_id='b'.*finite number"):
        tasks.grade(tasks.split("test")[0], "out")


def test_raising_grader_names_the_task_and_is_a_batch_error():
    def broken(task, completion):
        raise KeyError("score")

    tasks = taskset_with(broken)
    with pytest.raises(wai.BatchError, match=r"raised KeyError.*task_id='a'") as err:
        tasks.grade(tasks.split("train")[0], "out")
    assert isinstance(err.value.__cause__, KeyError)


def test_numpy_rewards_accepted_as_floats():
    tasks = taskset_with(lambda task, completion: np.float32(0.5))
    reward = tasks.grade(tasks.split("train")[0], "out")
    assert reward == 0.5 and type(reward) is float


def test_overlapping_splits_refused():
    with pytest.raises(wai.BatchError, match="overlap"):
        Taskset("t", [Task("a", "x")], [Task("b", "x")], lambda t, c: 0.0)   # same prompt
    with pytest.raises(wai.BatchError, match="overlap"):
        Taskset("t", [Task("a", "x")], [Task("a", "y")], lambda t, c: 0.0)   # same id
    with pytest.raises(wai.BatchError, match=r"\['a'\] repeat in split 'train'"):
        Taskset("t", [Task("a", "x"), Task("a", "z")], [Task("b", "y")], lambda t, c: 0.0)
