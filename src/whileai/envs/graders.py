"""Graders: `(task, completion) -> reward`, a pass being reward >= 1.0.

Built-in graders by name (`GRADERS`), or any function by import path "module:function". Each built-in
also says which answers it can grade (`check_answer`), so a file's bad answers are reported at load time
with their line numbers instead of failing mid-run.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whileai.envs.builtin import char_match
from whileai.envs.core import Grader, Task
from whileai.errors import ConfigError

NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
"""a decimal number, thousands separators allowed ("1,234.5"); the numeric grader reads the last one"""
NUMERIC_TOLERANCE = 1e-6
"""numeric grader: |got - answer| <= NUMERIC_TOLERANCE * max(1, |answer|) is a pass"""
MATH_TIMEOUT_S = 5
"""math grader: seconds math-verify may spend parsing or comparing (its default; main thread only)"""


def exact(task: Task, completion: str) -> float:
    """1.0 when the completion, stripped of surrounding whitespace, equals the stripped answer; else 0.0."""
    return float(completion.strip() == str(task.answer).strip())


def chars(task: Task, completion: str) -> float:
    """Partial credit by character: share of positions where completion and answer agree, over the longer
    of the two (answer "48": "48" -> 1.0, "4" -> 0.5, "49" -> 0.5, "48x" -> 2/3). No whitespace stripping."""
    return char_match(str(task.answer), completion)


def last_number(text: str) -> float | None:
    """The last decimal number in `text` ("x = 1,234.5 apples" -> 1234.5), or None when there is none."""
    found = NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def numeric(task: Task, completion: str) -> float:
    """1.0 when the last number in the completion equals the answer within NUMERIC_TOLERANCE (relative,
    absolute below 1); 0.0 otherwise, and when the completion holds no number."""
    got, want = last_number(completion), float(task.answer)
    return float(got is not None and abs(got - want) <= NUMERIC_TOLERANCE * max(1.0, abs(want)))


def regex(task: Task, completion: str) -> float:
    """1.0 when the answer, a Python regular expression, matches the whole stripped completion
    (`re.fullmatch`; put `(?i)`, `(?s)` or `.*` in the pattern for case-blind, multi-line or partial)."""
    return float(re.fullmatch(str(task.answer), completion.strip()) is not None)


def math_answer(task: Task, completion: str) -> float:
    """1.0 when `math-verify` finds the completion's final answer (LaTeX, \\boxed{}, or a plain expression)
    mathematically equal to the answer ("\\frac{1}{2}" == "0.5"); optional extra `whileai[math]`."""
    math_verify = _import_math_verify()
    # math-verify's time limits use SIGALRM, which exists only on the main thread: off it, no limit
    limit = MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = math_verify.parse(_as_math(str(task.answer)), parsing_timeout=limit)
    guess = math_verify.parse(completion, parsing_timeout=limit)
    return float(bool(gold) and math_verify.verify(gold, guess, timeout_seconds=limit))


def _as_math(answer: str) -> str:
    """A bare answer ("1/2") wrapped in $...$ so math-verify reads it as LaTeX as well as an expression."""
    return answer if ("$" in answer or "\\boxed" in answer) else f"${answer}$"


def _import_math_verify() -> Any:
    try:
        return importlib.import_module("math_verify")
    except ImportError as exc:
        raise ConfigError("grader 'math' needs the optional extra math-verify: pip install 'whileai[math]'") from exc


# ----------------------------------------------------------------------------- answers each one grades
def _text_answer(answer: Any) -> str | None:
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        return f"answer {answer!r} must be a string or a number"
    return None


def _numeric_answer(answer: Any) -> str | None:
    try:
        value = float(str(answer).replace(",", "")) if not isinstance(answer, bool) else math.nan
    except ValueError:
        value = math.nan
    return None if math.isfinite(value) else f"answer {answer!r} is not a finite number"


def _regex_answer(answer: Any) -> str | None:
    if not isinstance(answer, str):
        return f"answer {answer!r} must be a regular-expression string"
    try:
        re.compile(answer)
    except re.error as exc:
        return f"answer {answer!r} is not a valid regular expression ({exc})"
    return None


@dataclass(frozen=True)
class BuiltinGrader:
    grade: Grader
    check: Callable[[Any], str | None]
    """None when the answer is gradable, else why not"""


GRADERS: dict[str, BuiltinGrader] = {
    "exact": BuiltinGrader(exact, _text_answer),
    "chars": BuiltinGrader(chars, _text_answer),
    "numeric": BuiltinGrader(numeric, _numeric_answer),
    "regex": BuiltinGrader(regex, _regex_answer),
    "math": BuiltinGrader(math_answer, _text_answer),
}


def grader(name_or_callable: str | Grader) -> Grader:
    """A grader: a built-in name (`GRADERS`), "module:function" (imported), or a callable passed through."""
    if callable(name_or_callable):
        return name_or_callable
    if not isinstance(name_or_callable, str):
        raise ConfigError(f"grader {name_or_callable!r} must be a name {sorted(GRADERS)}, "
                          f"'module:function', or a callable (task, completion) -> float")
    if name_or_callable in GRADERS:
        if name_or_callable == "math":
            _import_math_verify()  # fail at load time, not at the first grade
        return GRADERS[name_or_callable].grade
    return _import_grader(name_or_callable)


def check_answer(name_or_callable: str | Grader, answer: Any) -> str | None:
    """Why the built-in grader cannot grade `answer` (None when it can, and always for user graders)."""
    if isinstance(name_or_callable, str) and name_or_callable in GRADERS:
        return GRADERS[name_or_callable].check(answer)
    return None


def _module_from_file(path: str, file: Path) -> Any:
    """A grader module given as a file ('graders.py:score', './lib/graders.py:score'), loaded as is."""
    if not file.is_file():
        raise ConfigError(f"grader {path!r}: no file {str(file)!r} (from {os.getcwd()}); give an existing "
                          f"Python file, or an importable module name 'module:function'")
    spec = importlib.util.spec_from_file_location(f"whileai_grader_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"grader {path!r}: {str(file)!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(f"grader {path!r}: running {str(file)!r} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _import_grader(path: str) -> Grader:
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"grader {path!r} is not known: use one of {sorted(GRADERS)} or an import path "
                          f"'module:function' (e.g. 'my_pkg.graders:score')")
    if module_name.endswith(".py") or "/" in module_name:
        module = _module_from_file(path, Path(module_name))
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(f"grader {path!r}: module {module_name!r} cannot be imported ({exc}); check the "
                              f"name and that it is on PYTHONPATH, or give the file: 'path/to/graders.py:"
                              f"{attr}'") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"grader {path!r}: module {module_name!r} has no callable {attr!r}; give the name "
                          f"of a function (task, completion) -> float")
    return fn  # type: ignore[no-any-return]
