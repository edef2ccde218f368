"""``wai.train``: a training run from a config, start to finish, resumable.

    config -> checks -> the run plan (whileai.loop.plan.run_plan) -> a trainer (whileai.trainers: in-process or --url) -> the loop
    (whileai.loop.core.run_loop, with the hooks of whileai.loop.hooks) -> the summary

The run reads the method only through ``run_spec()`` and ``update()``; it never branches on a method's
name. It writes RUN_DIR/{config.toml, metrics.jsonl, tensorboard/, checkpoint/, final/, summary.json,
curves.png}. Ctrl-C finishes the current step, writes a checkpoint and exits with 130.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whileai.errors import ConfigError
from whileai.loop.auto import route_method
from whileai.loop.core import run_loop
from whileai.loop.hooks.checkpoints import Checkpoints
from whileai.loop.hooks.context import Context, Interrupted, read_state, resume_command
from whileai.loop.hooks.held_out import HeldOut
from whileai.loop.hooks.metrics import Metrics, Progress, Record
from whileai.loop.hooks.preflight import PreflightHook
from whileai.loop.hooks.summary import finish
from whileai.loop.hooks.teacher import TeacherHook
from whileai.loop.hooks.traces import TraceHook
from whileai.loop.hooks.warm_start import LOG_FILE as WARM_START_LOG
from whileai.loop.hooks.warm_start import WarmStart
from whileai.loop.plan import config as config_io
from whileai.loop.plan import inputs
from whileai.loop.plan.checks import PYTHON_ROWS, _knobs_of, _load_taskset, check, needs_of, resolve_method
from whileai.loop.plan.config import PYTHON_TASKSET, TrainConfig
from whileai.loop.plan.run_plan import FILE, USER, RunPlan, make_plan, saved_plan, threads_rule, with_cap
from whileai.loop.sources import recorder, trace_run
from whileai.loop.sources.pushed import Pushed
from whileai.loop.sources.rollouts import Rollouts
from whileai.loop.sources.sampler import IN_PROCESS, server_rollouts
from whileai.loop.sources.traces import RowsFile, open_rows
from whileai.loop.types import LoopState, Source
from whileai.trainers import Trainer, open_trainer

if TYPE_CHECKING:
    from types import FrameType

    from whileai.envs.core import Taskset
    from whileai.methods.base import Method

RowsGiven = str | Sequence[Mapping[str, Any]] | None
"""``train(rows=)``: a JSONL path, or rows as dicts (SFT, DPO, RM train on them as pushed)"""

LOCK_FILE = "run.lock"
"""RUN_DIR/run.lock: the process training the run (pid and host), there while it runs; a resume of a run whose
lock names a live process is refused"""
LONG_CAP = 1024  # a generation cap at least this long, from the method's default, earns a note
__all__ = ["Interrupted", "Run", "check", "dry_run", "train"]


@contextmanager
def transformers_bars(show: bool) -> Iterator[None]:
    """transformers' own progress bars (loading weights, writing shards) follow ``show`` inside the block and
    are set back after it."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if was and not show:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was and not show:
            hf_logging.enable_progress_bar()


@dataclass
class Run:
    """A finished (or resumed-and-finished) run: its directory, summary and final weights."""

    dir: Path
    config: TrainConfig
    summary: dict[str, Any]
    weights: Path | None = None

    def metrics(self) -> list[dict[str, Any]]:
        """Every step's metrics, as written to metrics.jsonl."""
        path = self.dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def __str__(self) -> str:
        return self.summary.get("report", f"run at {self.dir}")


# ----------------------------------------------------------------------------- the run
def train(config: TrainConfig | None = None, *, method: Method | str | None = None, rows: RowsGiven = None,
          taskset: Taskset | str | None = "", resume: str | None = None, config_file: str | None = None,
          token: str | None = None, **overrides: object) -> Run:
    """Train a model; return the run. Keyword arguments override the config's fields (see ``TrainConfig``).

    ``method``: a name, 'auto', or a method object. ``rows``: a JSONL path or a list of row dicts (SFT, DPO,
    RM train on them as pushed; given rows, the default taskset is none). ``taskset``: a spec string, None, or a
    ``whileai.envs.Taskset`` object (e.g. ``load_taskset(spec, grader=my_function)``). ``resume``: a run
    directory to continue from its last checkpoint (``steps=`` may raise its step count). ``url`` (a config
    field) trains on the ``wai serve`` there; ``token``: its bearer token (default $WAI_TOKEN).
    """
    if resume is not None:
        extra = sorted(set(overrides) - {"steps", "progress", "threads"})
        if extra or config is not None or config_file is not None or method is not None or rows is not None \
                or isinstance(taskset, str) and taskset != "" or taskset is None:
            raise ConfigError(f"resume takes the run's saved config; only steps (to train longer), threads and progress may "
                              f"change, and taskset= hands back a Taskset object the run was given, not "
                              f"{extra or 'config/method/rows/a taskset spec'}")
        return _resume(resume, token, None if isinstance(taskset, str) else taskset, **overrides)
    config, origins, method_obj, rows_data, taskset_obj = _inputs(config, method, rows, taskset, config_file,
                                                                  overrides)
    return _start(config, origins, method_obj, rows_data, taskset_obj, token)


def _inputs(config: TrainConfig | None, method: Method | str | None, rows: RowsGiven, taskset: Taskset | str | None,
            config_file: str | None, overrides: dict[str, object]
            ) -> tuple[TrainConfig, dict[str, str], Method | None, Sequence[Mapping[str, Any]] | None, Taskset | None]:
    """The config (defaults, then the file, then the arguments) and where each set field came from."""
    if isinstance(method, str):
        overrides["method"] = method
    if isinstance(rows, str):
        overrides["rows"] = rows
    taskset_obj = None
    if taskset is None or isinstance(taskset, str):
        if taskset != "":
            overrides["taskset"] = taskset
    else:
        taskset_obj, overrides["taskset"] = taskset, PYTHON_TASKSET
    if (rows is not None or overrides.get("rows_from") is not None) and "taskset" not in overrides \
            and (config is None or config.taskset is None) and config_file is None:
        overrides["taskset"] = None  # rows pushed or recorded: no built-in task mixed in unless one is named
    base = config_io.as_dict(config) if config is not None else {}
    built = config_io.build(config_file, **{**base, **overrides})
    origins = {k.replace("-", "_"): FILE for k in (config_io.load_toml(config_file) if config_file else {})}
    origins.update({k: USER for k in {**base, **overrides}})
    method_obj = method if method is not None and not isinstance(method, str) else None
    if method_obj is not None:  # its knobs go to config.toml too, so that a resume rebuilds the same method
        built = replace(built, method=method_obj.name, knobs=_knobs_of(method_obj))
    rows_data = rows if rows is not None and not isinstance(rows, str) else None
    if rows_data is not None:
        built = replace(built, rows=PYTHON_ROWS)
    return built, origins, method_obj, rows_data, taskset_obj


def _prepare(config: TrainConfig, origins: Mapping[str, str], method_obj: Method | None,
             rows_data: Sequence[Mapping[str, Any]] | None,
             taskset_obj: Taskset | None) -> tuple[Method | None, Taskset | None, RunPlan]:
    """The method, the taskset and the plan, or every problem at once (nothing loads)."""
    method, problems = resolve_method(config, method_obj)
    problems += inputs.model_problems(config)  # a missing folder named as one (no rule reads a model that is not there)
    taskset, more = (taskset_obj, []) if taskset_obj is not None else _load_taskset(config)
    plan = make_plan(config, origins, method, taskset)
    method = with_cap(method, config, plan)
    problems += more + check(config, method, taskset, plan)
    problems += [f"rows[{i}] is not a dict of fields" for i, r in enumerate(rows_data or []) if not isinstance(r, Mapping)]
    if not problems:  # the inputs against the model and the plan: the grader, the prompts, the numbers
        more, notes = inputs.report(config, taskset, plan)
        problems += more
        plan = replace(plan, notes=tuple(notes))
    if problems:
        raise ConfigError(config_io._listing(problems))
    return method, taskset, plan


def dry_run(config: TrainConfig | None = None, *, method: Method | str | None = None, rows: RowsGiven = None,
            taskset: Taskset | str | None = "", config_file: str | None = None, **overrides: object) -> RunPlan:
    """The run plan ``train`` would use, checked, with nothing loaded or written (``wai train --dry-run``)."""
    config_obj, origins, method_obj, rows_data, taskset_obj = _inputs(config, method, rows, taskset, config_file,
                                                                      overrides)
    return _prepare(config_obj, origins, method_obj, rows_data, taskset_obj)[2]


def _start(config: TrainConfig, origins: Mapping[str, str], method_obj: Method | None,
           rows_data: Sequence[Mapping[str, Any]] | None,
           taskset_obj: Taskset | None,
           token: str | None) -> Run:
    method, taskset, plan = _prepare(config, origins, method_obj, rows_data, taskset_obj)
    named = config.run_dir is not None  # else a time-stamped directory, and a new run makes another
    run_dir = Path(config.run_dir or f"runs/{config.method}-{time.strftime('%Y%m%d-%H%M%S')}")
    if (run_dir / "config.toml").exists():
        raise ConfigError(f"run_dir {str(run_dir)!r} already holds a run: resume it with --resume {run_dir}, or "
                          "pick another --run-dir")
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    config = replace(config, run_dir=str(run_dir))
    if rows_data is not None:  # saved with the run, so a resume finds them (and read from there, like a file)
        (run_dir / "rows.jsonl").write_text("".join(json.dumps(dict(r)) + "\n" for r in rows_data))
    (run_dir / "config.toml").write_text(config_io.to_toml(config, plan))
    try:
        rows = open_rows(config, run_dir, config.rows == PYTHON_ROWS, method) if config.rows is not None else None
        return _execute(config, plan, method, taskset, rows, run_dir, None, token)
    except BaseException:  # an error, a second Ctrl-C, or Ctrl-C before the handler was in place
        if holds_work(run_dir):
            print(kept_message(run_dir, given=named, python_taskset=config.taskset == PYTHON_TASKSET),
                  file=sys.stderr, flush=True)
        else:  # the run wrote nothing but its config: leave no half-made run behind
            _remove_run_files(run_dir, created)
        raise


WORK = ("checkpoint", "metrics.jsonl", WARM_START_LOG, "tensorboard", "heldout-before.jsonl", "summary.json",
        "final")
"""what a run writes once it has done work: a stopped or failed run holding any of these is never removed"""


def holds_work(run_dir: Path) -> bool:
    """The run directory holds a checkpoint, metrics, the warm start's log or TensorBoard numbers (the
    TensorBoard folder is made at the first scalar, ``Metrics.board``)."""
    return any((run_dir / name).exists() for name in WORK)


def kept_message(run_dir: Path, given: bool = True, python_taskset: bool = False) -> str:
    """What a run stopped by an error or a second Ctrl-C says about the directory it leaves (never removed);
    ``given``: the user named it (--run-dir), else the run made a time-stamped one and a new run makes another."""
    if (run_dir / "checkpoint" / "LATEST").exists():
        return f"wai train: run directory {run_dir} kept; resume it with: {resume_command(run_dir, python_taskset)}"
    held = ", ".join(name for name in WORK if (run_dir / name).exists())
    again = "with another --run-dir" if given else "(it gets a directory of its own)"
    return (f"wai train: run directory {run_dir} kept ({held}); it has no checkpoint to resume from, so start the "
            f"run again {again} (nothing was deleted)")


RUN_FILES = ("config.toml", "rows.jsonl", "route.txt", LOCK_FILE, "metrics.jsonl", "summary.json", "evals.json", "curves.png",
             "heldout.jsonl", "heldout-before.jsonl", trace_run.HELDOUT_FILE, "tensorboard", "checkpoint", "final",
             "sync")


def _remove_run_files(run_dir: Path, created: bool) -> None:
    """Remove what a run wrote; the directory itself only if the run made it (a user's folder keeps its files)."""
    if created:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()


def _resume(run_dir_text: str, token: str | None, taskset_obj: Taskset | None = None, **changes: Any) -> Run:
    """Continue from the last checkpoint with the saved plan (nothing is resolved again); ``--steps N`` trains
    to step N with the N-step run's learning-rate schedule."""
    run_dir = Path(run_dir_text)
    if not (run_dir / "config.toml").is_file():
        raise ConfigError(f"--resume {run_dir_text!r}: no config.toml there; give the directory of a run that "
                          "`wai train` wrote")
    holder = live_holder(run_dir / LOCK_FILE)
    if holder is not None:
        raise ConfigError(f"--resume {run_dir_text!r}: the run is still training ({holder}, {LOCK_FILE}); stop it "
                          "first (Ctrl-C there writes a checkpoint), then resume it")
    if not (run_dir / "checkpoint" / "LATEST").is_file():
        raise ConfigError(f"--resume {run_dir_text!r}: the run has no checkpoint yet (it stopped before its first "
                          "save), so there is nothing to resume; start it again in a new --run-dir")
    saved = config_io.load_toml(str(run_dir / "config.toml"))
    # TOML has no null: a run saved without a taskset (rows only) must not get the default one back
    config = config_io.build(str(run_dir / "config.toml"), **changes, **({} if "taskset" in saved else {"taskset": None}))
    if (config.taskset == PYTHON_TASKSET) != (taskset_obj is not None):
        raise ConfigError(f"--resume {run_dir_text!r}: the run's taskset was a Python object, which a config file "
                          f"cannot hold; resume it from Python with the same one: "
                          f"{resume_command(run_dir, python_taskset=True)}" if taskset_obj is None else
                          f"resume {run_dir_text!r}: taskset= hands back a Taskset object the run was given, and this "
                          f"run's taskset is {config.taskset!r} (from its config.toml): leave taskset= out")
    state = read_state(run_dir)
    if "steps" in changes and int(changes["steps"]) <= state.step:
        raise ConfigError(f"--resume {run_dir_text!r}: the run is at step {state.step}; --steps {config.steps} must "
                          f"be more than that to train longer")
    method, problems = resolve_method(config)
    taskset, more = (taskset_obj, []) if taskset_obj is not None else _load_taskset(config)
    plan = saved_plan(run_dir / "config.toml") or make_plan(config, {}, method, taskset)
    if "steps" in changes:
        plan = plan.with_steps(int(changes["steps"]))
    plan = plan.with_threads(*((int(changes["threads"]), USER) if "threads" in changes else threads_rule()))
    method = with_cap(method, config, plan)
    problems += more + check(config, method, taskset, plan)
    if problems:
        raise ConfigError(config_io._listing(problems))
    rows = open_rows(config, run_dir, config.rows == PYTHON_ROWS, method) if config.rows is not None else None
    if changes:
        (run_dir / "config.toml").write_text(config_io.to_toml(config, plan))
    return _execute(config, plan, method, taskset, rows, run_dir, state, token)


@contextmanager
def _stop_on_sigint() -> Iterator[dict[str, bool]]:
    """The first Ctrl-C (or SIGTERM, what ``kill``, ``timeout`` and job schedulers send) asks the loop to stop
    after the current step and write a checkpoint; a second one stops at once."""
    flag = {"stop": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: FrameType | None) -> None:
        if flag["stop"]:
            raise KeyboardInterrupt
        flag["stop"] = True
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        print(f"\n{name}: finishing this step, then writing a checkpoint ({name} again to quit without one)",
              flush=True)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield flag
    finally:
        for sig, was in previous.items():
            signal.signal(sig, was)


def trainer_for(config: TrainConfig, plan: RunPlan, method: Method | None, token: str | None,
                resume: Path | None = None) -> Trainer:
    """The trainer the config names (in-process, a wai serve's API, a Tinker-API server); ``resume``: the
    checkpoint folder a server trainer starts from (the state it names on the server)."""
    return open_trainer(config.model, url=config.url, api=config.api, token=token, lora_rank=config.lora_rank,
                        device=config.device, seed=config.seed, micro_batch_tokens=config.micro_batch_tokens,
                        needs=needs_of(config, plan, method), resume=resume,
                        activation_checkpointing=plan.activation_checkpointing)


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold RUN_DIR/run.lock while the run trains: a second ``--resume`` of a live run is refused (two processes
    writing one checkpoint would corrupt it). A lock left by a process that died (kill -9) is taken over."""
    path = run_dir / LOCK_FILE
    mine = f"{os.getpid()} {socket.gethostname()}\n"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            holder = live_holder(path)
            if holder is not None:
                raise ConfigError(f"run directory {run_dir} is in use: the run is still training ({holder}, "
                                  f"{LOCK_FILE}); stop it first (Ctrl-C there writes a checkpoint), then "
                                  f"--resume it") from None
            path.unlink(missing_ok=True)  # its process is gone: a stale lock
            continue
        with os.fdopen(fd, "w") as f:
            f.write(mine)
        break
    try:
        yield
    finally:
        if path.is_file() and path.read_text() == mine:
            path.unlink()


def live_holder(path: Path) -> str | None:
    """'pid N on HOST' when the lock names a process that is alive on this host (or on another host, which this
    process cannot check); None for a stale or unreadable lock."""
    try:
        pid_text, host = path.read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    if host != socket.gethostname():
        return f"pid {pid} on {host}"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return f"pid {pid}"


def _execute(config: TrainConfig, plan: RunPlan, method: Method | None, taskset: Taskset | None, rows: RowsFile | None, run_dir: Path,
             resumed: LoopState | None, token: str | None) -> Run:
    with run_lock(run_dir), torch_threads(plan.threads):
        return _locked(config, plan, method, taskset, rows, run_dir, resumed, token)


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's CPU threads at ``count`` inside the block (the plan's ``threads``), set back after it."""
    import torch

    was = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(was)


def _locked(config: TrainConfig, plan: RunPlan, method: Method | None, taskset: Taskset | None, rows: RowsFile | None, run_dir: Path,
            resumed: LoopState | None, token: str | None) -> Run:
    started = time.perf_counter()
    state = resumed or LoopState()
    with transformers_bars(config.progress):  # --no-progress: no weight-loading / shard-writing bars
        trainer = trainer_for(config, plan, method, token, run_dir / "checkpoint" if resumed is not None else None)
        closers: list[Callable[[], None]] = []
        try:
            if method is None:  # --method auto: a probe of rollouts, then route; the plan follows the method
                config, plan, method = route_method(config, plan, trainer, taskset, rows, run_dir, state)
                method = with_cap(method, config, plan)
            if resumed is not None:
                trainer.load(run_dir / "checkpoint")
            else:
                state.method_state = method.initial_state()  # the loop owns it and checkpoints it
            first_step = state.step
            metrics = Metrics(run_dir, state.step if resumed is not None else None)
            log = Progress(plan.steps, state.step, config.progress, method.name)
            try:
                with _stop_on_sigint() as stop:
                    ctx = Context(run_dir, config, plan, method, taskset, rows, trainer, log, metrics, stop,
                                  resumed is not None)
                    if resumed is None:
                        announce(ctx)
                    else:
                        warm = state.warm_start_steps_done
                        where = (f"in its warm start, after step {warm} of {plan.warm_start_steps}" if
                                 not state.warm_start_done and 0 < warm < plan.warm_start_steps else
                                 f"at step {state.step} of {plan.steps}")
                        log.write(f"resuming {run_dir} {where} with its saved plan")
                        log.write(plan.table())
                    source = source_for(ctx, state)
                    closers.extend(source.closers)
                    hooks = [WarmStart(ctx), HeldOut(ctx), *source.feed, PreflightHook(ctx), TeacherHook(ctx),
                             Record(ctx), *source.pushing, Checkpoints(ctx)]
                    run_loop(trainer, method, plan, source.batches, state, hooks)
                log.close()
                summary, weights = finish(ctx, state, time.perf_counter() - started,
                                          first_step if resumed is not None else 0)
            finally:
                log.close()
                metrics.close()
        finally:
            for close in reversed(closers):
                close()
            trainer.close()
    return Run(run_dir, config, summary, weights)


def source_for(ctx: Context, state: LoopState) -> Source:
    """Where the run's rows come from, chosen once: a recorder's traces as they are scored (``--rows-from``), a
    rows file, an inference server sampling ahead (``--sampler-url``), or rollouts in process."""
    plan, method = ctx.plan, ctx.method
    if ctx.config.rows_from is not None:
        return recorder.source(ctx, state, ctx.log.write)
    if ctx.rows is not None:
        pushed = Pushed(ctx.rows, trace_run.grouped(method), plan)
        return Source(pushed, feed=[TraceHook(ctx, pushed)])
    assert ctx.taskset is not None  # a run on rollouts has a taskset (plan.checks)
    if plan.sampler != IN_PROCESS:
        return server_rollouts(ctx, ctx.trainer, ctx.taskset, method, plan)
    return Source(Rollouts(ctx.trainer, ctx.taskset, method, plan))


def announce(ctx: Context) -> None:
    """What the run is about to do: the method, its run spec, the plan, and the notes a reader should see."""
    config, plan, spec, write = ctx.config, ctx.plan, ctx.method.run_spec(), ctx.log.write
    sampling = ctx.taskset is not None
    write(f"{ctx.method!r}\nrun spec: {spec.describe()}"
          + (f"\nsampling: temperature {plan.temperature:g}, max_tokens {plan.max_tokens}, lag {plan.lag}"
             if sampling else "") + f"\nrun dir: {ctx.run_dir}")
    write(plan.table())
    if config.url is not None:
        write(f"trainer: {ctx.trainer.where}")
    if config.teacher is not None:
        write(f"teacher: {config.teacher} (loaded once, frozen)")
    if spec.critic is not None:
        write(f"critic learning rate {plan.critic_learning_rate:g} (" + ("--critic-learning-rate"
              if config.critic_learning_rate else "the method's") + ")")
    held = len(ctx.taskset.split("test")) if ctx.can_eval() and ctx.taskset is not None else 0
    if ctx.can_eval() and plan.eval_tasks > held:
        write(f"note: eval_tasks {plan.eval_tasks}, but the taskset's test split holds {held} tasks: every "
              f"evaluation scores all {held}")
    knob_cap = config.knobs.get("max_tokens")
    if sampling and knob_cap is not None and int(knob_cap) != plan.max_tokens:
        source = "--max-tokens" if config.max_tokens else "the taskset's cap"
        write(f"note: the method's max_tokens {knob_cap} (--set) is not the sampling cap: {source}, "
              f"{plan.max_tokens}, is (--max-tokens sets it); the knob still reaches an update that reads it "
              "(Dr. GRPO's length normaliser)")
    said = any(note.startswith("max_tokens = ") for note in plan.notes)  # the plan's note on the cap and context
    if sampling and plan.max_tokens >= LONG_CAP and config.max_tokens is None and not said:
        write(f"note: replies may run to {plan.max_tokens} tokens (the method's max_tokens; the taskset sets "
              "none): set --max-tokens, or max_tokens in the taskset, for short answers")
