"""What a run does differently when it trains from a rows / traces file instead of sampling a taskset.

No environment and no sampler: the batch is read from the file, the policy scores the logged tokens
(``rescore``) and ``policy_step`` runs as for rollouts. Lag does not apply (the log's staleness is whatever it
is, and is measured per batch as drift). Before training, ``route`` reads the file and its verdict is saved.
Without ``--eval-taskset`` nothing can measure pass@1, so a slice of whole tasks is held out and its surrogate
and drift are reported before and after, under names that cannot be mistaken for a pass rate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from whileai.errors import WhileaiError
from whileai.loop.sources.traces import RowsFile
from whileai.loop.step import BOOKKEEPING, fill, plain, score, step_stats
from whileai.loop.types import PASS, Scoring
from whileai.routing import Route, route
from whileai.rows.io import plural

if TYPE_CHECKING:
    from whileai.loop.plan.config import TrainConfig
    from whileai.loop.step import MethodState
    from whileai.methods.base import Method, Update
    from whileai.trainers import Trainer

HELDOUT_FILE = "heldout_traces.json"
NO_EVAL = ("no held-out evaluation was possible: the traces cannot be replayed and no --eval-taskset was given, "
           "so there is no pass@1 to report. Give --eval-taskset SPEC (prompts and a grader of the same task) to "
           "measure one")


def rows_problems(config: TrainConfig, method: Method | None, python_rows: bool) -> list[str]:
    """The config rules of a run from a rows / traces file (``check`` adds them to the rest)."""
    problems = []
    if config.rows is not None and not python_rows and not Path(config.rows).is_file():
        problems.append(f"rows = {config.rows!r}: no such file; give a JSONL file of rows or traces (one JSON "
                        "object a line, docs/traces.md)")
    if config.eval_taskset is not None and config.rows is None and config.rows_from is None:
        problems.append(f"eval_taskset = {config.eval_taskset!r} is for runs from --rows; a taskset run evaluates "
                        "on its own test split: drop --eval-taskset")
    if config.rows is None:
        return problems
    if (config.lag or 0) > 0:
        problems.append(f"lag = {config.lag}: lag does not apply to rows from a file (there is no sampler to lag; "
                        "the log's own staleness is measured per batch as drift): set --lag 0 or leave it out")
    if method is not None and method.run_spec().source == "rollouts" and config.taskset is not None:
        problems.append(f"taskset = {config.taskset!r} with --rows: method {method.name!r} trains from the traces, "
                        "not from new rollouts; to measure pass@1 on a taskset give it as --eval-taskset instead")
    return problems


def grouped(method: Method) -> bool:
    """Whether a batch keeps a task's traces (or a pair) together: rows methods and group methods do."""
    spec = method.run_spec()
    return spec.source == "rows" or spec.rollouts_per_prompt > 1


def step_record(update: Update, lines: Sequence[int]) -> dict[str, Any]:
    """What a step adds to metrics.jsonl from a file: the lines the method dropped, and its notes (why)."""
    admitted = np.asarray(update.admitted, dtype=bool)
    dropped = [int(line) for line, kept in zip(lines, admitted) if not kept]
    # the notes name trajectories by their index in the batch: traces/lines[i] is trajectory i's file line
    return {"traces/dropped": len(dropped), "traces/dropped_lines": dropped, "traces/notes": list(update.notes),
            "traces/lines": [int(line) for line in lines]}


def dropped_note(record: Mapping[str, Any]) -> str | None:
    """A sentence naming the file lines a step dropped, for the run's log."""
    lines = record.get("traces/dropped_lines") or []
    if not lines:
        return None
    shown = ", ".join(map(str, lines[:12])) + (f" and {len(lines) - 12} more" if len(lines) > 12 else "")
    return f"step {record['step']}: dropped {len(lines)} trace(s), file lines {shown}"


# ----------------------------------------------------------------------------- before training
def route_file(source: RowsFile, model: str, run_dir: Path) -> Route | None:
    """``route`` on the file's tasks and rewards; the verdict goes to RUN_DIR/route.txt. None when route
    could not answer (the reason is saved instead)."""
    try:
        answer = route(source.graded(), model=model, threshold=PASS)
    except WhileaiError as err:
        (run_dir / "route.txt").write_text(f"route could not read these rows: {err}\n")
        return None
    (run_dir / "route.txt").write_text(str(answer) + "\n")
    return answer


def announce(source: RowsFile, method: Method, config: TrainConfig, run_dir: Path, write: Callable[[str], None]) -> None:
    """Say what the file holds, what route makes of it, and how this run will be evaluated."""
    write(source.describe())
    for note in source.notes:
        write(f"rows note: {note}")
    answer = route_file(source, config.model, run_dir)
    if answer is not None:
        verdict = f"route: {answer.method or 'nothing to train yet'} ({answer.question} {answer.answer})"
        if answer.method is not None and answer.method != method.name:
            verdict += f"; training {method.name} as asked"
        write(f"{verdict}; see {run_dir / 'route.txt'}")
    if method.run_spec().source != "rollouts":
        return
    write("lag: does not apply (no sampler); the log's staleness is measured per batch as drift")
    for line in sampling_lines(source, method.run_spec().temperature):
        write(line)
    if config.eval_taskset is None:
        write(NO_EVAL)
        write(source.hold_out(config.seed))


def sampling_lines(source: RowsFile, temperature: float) -> list[str]:
    """What the log says about the distributions the traces are scored under: the settings each trace was
    sampled with (its ``sampling``, or an OpenAI request's), any it does not state being the method's."""
    method = {**plain(), "temperature": float(temperature)}
    if set(source.samplings) == {()}:
        return [f"sampling: no trace states the settings it was sampled with, so all are scored at the method's "
                f"({_described(method)}); traces sampled otherwise need a 'sampling' field (docs/traces.md)"]
    parts = []
    for stated, (count, lines) in sorted(source.samplings.items(), key=lambda kv: -kv[1][0]):
        whose = "none stated: the method's" if not stated else "as stated" if len(stated) == len(method) else \
            f"{', '.join(k for k, _ in stated)} stated, the rest the method's"
        parts.append(f"{plural(count, 'trace')} at {_described({**method, **dict(stated)})} ({whose}; first at "
                     f"line {', '.join(map(str, lines))})")
    out = ["sampling: each trace is scored under the settings it was sampled with: " + "; ".join(parts)]
    if source.fmt == "openai" and any(stated and {**method, **dict(stated)} != plain() for stated in source.samplings):
        out.append("note: a server's log at settings other than temperature 1 with no top-p / top-k trains right "
                   "only if the server logged processed log-probabilities (vLLM: --logprobs-mode "
                   "processed_logprobs); vLLM's default raw_logprobs come before temperature, top-k and top-p, "
                   "so no ratio formed from them is right (a drift far from 0 at the first step shows it)")
    return out


def _described(settings: Mapping[str, Any]) -> str:
    top_p, top_k = settings["top_p"], settings["top_k"]
    return (f"temperature {settings['temperature']:g}, " + (f"top-p {top_p:g}" if top_p < 1 else "no top-p") +
            ", " + (f"top-k {top_k}" if top_k else "no top-k"))


# ----------------------------------------------------------------------------- held-out traces
STEP0_TRACES = 64
"""with --eval-taskset (no traces held out): the first this many training traces are measured at step 0, so the
preflight still sees whether the logs came from this model"""


def heldout_measure(engine: Trainer, method: Method, source: RowsFile, sampling_params: Scoring,
                    state: MethodState, indices: np.ndarray | None = None) -> dict[str, Any] | None:
    """The held-out traces (or ``indices``) under the current policy: the method's surrogate (the sum of c * log pi
    that its step would raise), the drift from the logged log-probabilities and the share the method admits."""
    indices = source.heldout() if indices is None else indices
    if not len(indices):
        return None
    return measure_rows(engine, method, source.read(indices.tolist()), sampling_params, state)


def measure_rows(engine: Trainer, method: Method, rows: list[dict[str, Any]], sampling_params: Scoring,
                 state: MethodState) -> dict[str, Any]:
    """``heldout_measure`` of traces at hand (``rows``, changed in place: give copies): the surrogate, the drift
    and the share the method admits under the current policy."""
    for row, logprobs in zip(rows, score(engine, rows, sampling_params=sampling_params)):
        row["logprobs"] = logprobs
    fill(engine, rows, method.run_spec().needs, sampling_params)
    for_method = [{k: v for k, v in r.items() if k not in BOOKKEEPING} for r in rows]
    update = method.update(for_method, state=state) if state is not None else method.update(for_method)
    surrogate = sum(float(np.dot(c, r["logprobs"])) for c, r in zip(update.coefficients, rows))
    stats = step_stats(update, rows)
    return {"traces": len(rows), "surrogate": surrogate, "drift": stats["drift"],
            "admitted_share": stats["admitted_share"]}


def save_heldout(run_dir: Path, key: str, measured: dict[str, Any] | None) -> None:
    path = run_dir / HELDOUT_FILE
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = measured
    path.write_text(json.dumps(data, indent=2) + "\n")


def heldout_summary(run_dir: Path) -> dict[str, Any]:
    """What the summary says about evaluation in a traces run without an eval taskset."""
    path = run_dir / HELDOUT_FILE
    data = json.loads(path.read_text()) if path.exists() else {}
    return {"no_heldout_evaluation": NO_EVAL, "heldout_traces": data}


def report_lines(summary: Mapping[str, Any]) -> list[str]:
    """The report's lines for held-out traces: surrogate and drift, never a pass rate."""
    if "no_heldout_evaluation" not in summary:
        return []
    lines = [f"  {summary['no_heldout_evaluation']}"]
    data = summary.get("heldout_traces") or {}
    before, after = data.get("before"), data.get("after")
    if before and after:
        lines.append(f"  held-out traces ({before['traces']}, never trained on): surrogate sum(c * log pi) "
                     f"{before['surrogate']:.4g} -> {after['surrogate']:.4g}; drift {before['drift']:.3g} -> "
                     f"{after['drift']:.3g}; admitted share {before['admitted_share']:.2f} -> "
                     f"{after['admitted_share']:.2f}")
    else:
        lines.append("  no traces were held out (see the log), so nothing was measured off the training batches")
    return lines


# ----------------------------------------------------------------------------- the run's two hooks
def start(source: RowsFile, method: Method, config: TrainConfig, run_dir: Path, engine: Trainer, sampling_params: Scoring,
          state: MethodState, write: Callable[[str], None]) -> None:
    """Before the first step (and again on resume: the held-out slice is a fixed function of the seed)."""
    announce(source, method, config, run_dir, write)
    if method.run_spec().source != "rollouts":
        return
    path = run_dir / HELDOUT_FILE
    if config.eval_taskset is not None:  # no traces held out: the first training traces tell the model apart
        if not (path.exists() and "step0" in json.loads(path.read_text())):
            first = np.flatnonzero(~source.heldout_T)[:STEP0_TRACES]
            save_heldout(run_dir, "step0", heldout_measure(engine, method, source, sampling_params, state, first))
        return
    if path.exists() and "before" in json.loads(path.read_text()):
        return
    measured = heldout_measure(engine, method, source, sampling_params, state)
    save_heldout(run_dir, "before", measured)
    if measured is not None:
        write(f"held-out traces before: surrogate {measured['surrogate']:.4g}, drift {measured['drift']:.3g}, "
              f"admitted share {measured['admitted_share']:.2f} over {measured['traces']} traces")


def finish(source: RowsFile, method: Method, config: TrainConfig, run_dir: Path, engine: Trainer, sampling_params: Scoring,
           state: MethodState) -> dict[str, Any]:
    """What the summary adds for a traces run without an eval taskset: the held-out traces after training."""
    if method.run_spec().source != "rollouts" or config.eval_taskset is not None:
        return {}
    save_heldout(run_dir, "after", heldout_measure(engine, method, source, sampling_params, state))
    return heldout_summary(run_dir)
