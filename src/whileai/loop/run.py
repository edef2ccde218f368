"""``wai.train``: a training run from a config, start to finish, resumable.

    sample (weights of step t - lag) -> grade -> score -> method.update -> kernel -> optimizer step

The run reads the method only through ``run_spec()`` and ``update()``; it never branches on a method's
name. It writes RUN_DIR/{config.toml, metrics.jsonl, tensorboard/, checkpoint/, final/, summary.json,
curves.png}. Ctrl-C finishes the current step, writes a checkpoint and exits with 130.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from whileai.errors import ConfigError, WhileaiError
from whileai.loop import config as config_io
from whileai.loop import teacher as teacher_io
from whileai.loop import trace_run
from whileai.loop.config import TrainConfig
from whileai.loop.evaluate import PASS, before_after, held_out
from whileai.loop.record import Metrics, Progress, plot, write_json
from whileai.loop.rollouts import LagQueue, Sampling, sample_batch, step_tasks
from whileai.loop.step import policy_step, score_head_step
from whileai.loop.traces import RowsFile, contamination, open_rows

DEFAULT_MAX_TOKENS = 256  # when neither the taskset nor the method caps a generation
LONG_CAP = 1024  # a generation cap at least this long, from the method's default, earns a note
PROBE_TASKS, PROBE_ROLLOUTS = 16, 8  # what --method auto routes on when no rows are given
REFERENCE_FILE = "reference.pt"  # in RUN_DIR/checkpoint: the reference policy taken after the warm start


class Interrupted(WhileaiError):
    """The run was stopped by Ctrl-C after writing a checkpoint."""

    def __init__(self, run_dir: Path, step: int) -> None:
        super().__init__(f"interrupted after step {step}; checkpoint written. Resume with: wai train --resume {run_dir}")
        self.run_dir, self.step = run_dir, step


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


@dataclass
class _State:
    """What a checkpoint holds besides the engine: step, the method's state, the rows in flight, evals."""

    step: int = 0
    method_state: dict[str, Any] | None = None
    queue: list[list[dict[str, Any]]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    warm_start_done: bool = False
    engine_step: int = 0


# ----------------------------------------------------------------------------- checks before loading
def resolve_method(config: TrainConfig, method: Any = None) -> tuple[Any, list[str]]:
    """The method object (None for 'auto', chosen later) and any problem building it."""
    import whileai as wai

    if method is not None and not isinstance(method, str):
        return method, []
    name = method or config.method
    if name == "auto":
        return None, []
    try:
        return wai.method(name, **config.knobs), []
    except ConfigError as err:
        return None, [f"method = {name!r}: {err}"]


def check(config: TrainConfig, method: Any, taskset: Any = None) -> list[str]:
    """Every impossible combination of the config and the method's run spec, each with a fix."""
    problems = config_io.check_ranges(config) + trace_run.rows_problems(config, method, config.rows == PYTHON_ROWS)
    if method is None:
        return problems
    spec = method.run_spec()
    if spec.source == "rows" and config.rows is None:
        problems.append(f"method {method.name!r} trains on rows as pushed: give --rows FILE (JSONL with prompt and "
                        "completion, or prompt_tokens and tokens)")
    if spec.source == "rollouts" and config.taskset is None and config.rows is None:
        problems.append(f"method {method.name!r} learns from rollouts: give --taskset (prompts and a grader), or "
                        "--rows FILE of logged traces")
    if spec.source == "rollouts" and spec.max_lag is not None and (config.lag or 0) > spec.max_lag:
        problems.append(f"lag = {config.lag} is beyond the {spec.max_lag} steps method {method.name!r} is built to "
                        f"correct (its off_policy_steps); lower --lag or raise the knob (--set off_policy_steps=N)")
    if spec.source == "rollouts":
        problems += _rollout_problems(config, method, spec) + _reference_problems(config, method, spec, taskset)
        prompts = config.rollouts_per_step // spec.rollouts_per_prompt
        if taskset is not None and config.rows is None and prompts > len(taskset.split("train")):
            problems.append(f"a step needs {prompts} distinct training prompts but taskset {config.taskset!r} has "
                            f"{len(taskset.split('train'))} in its train split: lower rollouts_per_step or add tasks")
    problems += teacher_io.check(spec, method.name, config.teacher, taskset, no_tasks=config.taskset is None)
    steps = config_io.resolve(config, taskset).steps
    if spec.critic is not None and steps <= spec.critic.warmup:
        problems.append(f"steps = {steps} leaves no policy step after the critic's {spec.critic.warmup} "
                        f"warm-up steps: raise --steps above {spec.critic.warmup} or lower the warm-up "
                        "(--set critic_warmup=N)")
    return problems


def _rollout_problems(config: TrainConfig, method: Any, spec: Any) -> list[str]:
    problems = []
    if spec.rollouts_per_prompt < spec.min_rollouts_per_prompt:
        problems.append(f"method {method.name!r} takes its baseline over a prompt's group, and "
                        f"{spec.rollouts_per_prompt} rollout per prompt makes every advantage 0: set "
                        f"--set generations={max(spec.min_rollouts_per_prompt, 2)} or more, or use a one-rollout "
                        "method (flash_reinforce, rae, sao, bpco)")
    if config.rollouts_per_step >= 1 and (config.rollouts_per_step < spec.rollouts_per_prompt
                                          or config.rollouts_per_step % spec.rollouts_per_prompt):
        problems.append(f"rollouts_per_step = {config.rollouts_per_step} is not a multiple of the method's "
                        f"{spec.rollouts_per_prompt} rollouts per prompt: use a multiple such as "
                        f"{max(1, config.rollouts_per_step // spec.rollouts_per_prompt) * spec.rollouts_per_prompt}")
    return problems


def _needs_reference(spec: Any) -> bool:
    """The run keeps a reference policy: for ref_logprobs (beta > 0) or an 'initial' teacher."""
    return "ref_logprobs" in spec.needs or (spec.teacher is not None and spec.teacher.weights == "initial")


def _reference_problems(config: TrainConfig, method: Any, spec: Any, taskset: Any) -> list[str]:
    """Full fine-tuning re-takes the reference after the warm start; under LoRA it is the adapter-free base."""
    warm_start = config_io.resolve(config, taskset).warm_start_steps
    if not (_needs_reference(spec) and config.lora_rank and warm_start):
        return []
    return [f"method {method.name!r} needs the reference policy, which under LoRA is the model with its adapters "
            f"switched off (the model as loaded), and a warm start of {warm_start} steps trains the adapters, so "
            "the KL or the teacher would pull the student back to the model before the warm start: set "
            "--warm-start-steps 0, or train every weight (--lora-rank 0: the reference is then the policy after the "
            "warm start)"]


def _load_taskset(config: TrainConfig) -> tuple[Any, list[str]]:
    """The taskset to sample from, or (a run from --rows) the one to evaluate on: eval_taskset, else taskset."""
    name = "eval_taskset" if config.eval_taskset is not None else "taskset"
    spec = getattr(config, name)
    if spec is None:
        return None, []
    from whileai.envs import load_taskset

    try:
        return load_taskset(spec, **config.taskset_options), []
    except WhileaiError as err:
        return None, [f"{name} = {spec!r}: {err}"]


# ----------------------------------------------------------------------------- the run
PYTHON_ROWS = "<rows passed in Python>"
PYTHON_TASKSET = "<taskset passed in Python>"


def train(config: TrainConfig | None = None, *, method: Any = None, rows: Any = None, taskset: Any = "",
          resume: str | None = None, config_file: str | None = None, **overrides: Any) -> Run:
    """Train a model; return the run. Keyword arguments override the config's fields (see ``TrainConfig``).

    ``method``: a name, 'auto', or a method object. ``rows``: a JSONL path or a list of row dicts (SFT, DPO,
    RM train on them as pushed; given rows, the default taskset is none). ``taskset``: a spec string, None, or a
    ``whileai.envs.Taskset`` object (e.g. ``load_taskset(spec, grader=my_function)``). ``resume``: a run
    directory to continue from its last checkpoint (``steps=`` may raise its step count).
    """
    if resume is not None:
        extra = sorted(set(overrides) - {"steps", "progress"})
        if extra or config is not None or config_file is not None or method is not None or rows is not None \
                or taskset != "":
            raise ConfigError(f"resume takes the run's saved config; only steps (to train longer) and progress may "
                              f"change, not {extra or 'config/method/rows/taskset'}")
        return _resume(resume, **overrides)
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
    if rows is not None and "taskset" not in overrides and (config is None or config.taskset is None) \
            and config_file is None:
        overrides["taskset"] = None  # rows pushed: no built-in task mixed in unless one is named
    base = config_io.as_dict(config) if config is not None else {}
    config = config_io.build(config_file, **{**base, **overrides})
    method_obj = method if method is not None and not isinstance(method, str) else None
    if method_obj is not None:  # its knobs go to config.toml too, so that a resume rebuilds the same method
        config = replace(config, method=method_obj.name, knobs=_knobs_of(method_obj))
    rows_data = rows if rows is not None and not isinstance(rows, str) else None
    if rows_data is not None:
        config = replace(config, rows=PYTHON_ROWS)
    return _start(config, method_obj, rows_data, taskset_obj)


def _start(config: TrainConfig, method_obj: Any, rows_data: Any, taskset_obj: Any = None) -> Run:
    method, problems = resolve_method(config, method_obj)
    config = config_io.with_lag(config, method)
    taskset, more = (taskset_obj, []) if taskset_obj is not None else _load_taskset(config)
    problems += more + check(config, method, taskset)
    problems += [f"rows[{i}] is not a dict of fields" for i, r in enumerate(rows_data or []) if not isinstance(r, Mapping)]
    if problems:
        raise ConfigError(config_io._listing(problems))
    run_dir = Path(config.run_dir or _default_dir(config))
    if (run_dir / "config.toml").exists():
        raise ConfigError(f"run_dir {str(run_dir)!r} already holds a run: resume it with --resume {run_dir}, or "
                          "pick another --run-dir")
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    config = replace(config, run_dir=str(run_dir))
    if rows_data is not None:  # saved with the run, so a resume finds them (and read from there, like a file)
        (run_dir / "rows.jsonl").write_text("".join(json.dumps(dict(r)) + "\n" for r in rows_data))
    (run_dir / "config.toml").write_text(config_io.to_toml(config))
    try:
        rows = open_rows(config, run_dir, config.rows == PYTHON_ROWS, method) if config.rows is not None else None
        return _Trainer(config, method, taskset, rows, run_dir, None).run()
    except BaseException:  # an error, or Ctrl-C before the handler was in place
        if not (run_dir / "checkpoint" / "LATEST").exists():  # nothing to resume: leave no half-made run behind
            _remove_run_files(run_dir, created)
        raise


RUN_FILES = ("config.toml", "rows.jsonl", "route.txt", "metrics.jsonl", "summary.json", "evals.json", "curves.png",
             "heldout.jsonl", "heldout-before.jsonl", trace_run.HELDOUT_FILE, "tensorboard", "checkpoint", "final")


def _remove_run_files(run_dir: Path, created: bool) -> None:
    """Remove what a run wrote; the directory itself only if the run made it (a user's folder keeps its files)."""
    import shutil

    if created:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()


def _resume(run_dir_text: str, **changes: Any) -> Run:
    run_dir = Path(run_dir_text)
    if not (run_dir / "config.toml").is_file():
        raise ConfigError(f"--resume {run_dir_text!r}: no config.toml there; give the directory of a run that "
                          "`wai train` wrote")
    if not (run_dir / "checkpoint" / "LATEST").is_file():
        raise ConfigError(f"--resume {run_dir_text!r}: the run has no checkpoint yet (it stopped before its first "
                          "save), so there is nothing to resume; start it again in a new --run-dir")
    # TOML has no null: a run saved without a taskset (rows only) must not get the default one back
    unset = {} if "taskset" in config_io.load_toml(str(run_dir / "config.toml")) else {"taskset": None}
    config = config_io.build(str(run_dir / "config.toml"), **changes, **unset)
    if PYTHON_TASKSET in (config.taskset,):
        raise ConfigError(f"--resume {run_dir_text!r}: the run's taskset was a Python object, which a config file "
                          "cannot hold; resume it from Python with the same taskset (not supported yet)")
    state = _read_state(run_dir)
    if "steps" in changes and int(changes["steps"]) <= state.step:
        raise ConfigError(f"--resume {run_dir_text!r}: the run is at step {state.step}; --steps {config.steps} must "
                          f"be more than that to train longer")
    method, problems = resolve_method(config)
    config = config_io.with_lag(config, method)
    taskset, more = _load_taskset(config)
    problems += more + check(config, method, taskset)
    if problems:
        raise ConfigError(config_io._listing(problems))
    rows = open_rows(config, run_dir, config.rows == PYTHON_ROWS, method) if config.rows is not None else None
    if changes:
        (run_dir / "config.toml").write_text(config_io.to_toml(config))
    return _Trainer(config, method, taskset, rows, run_dir, state).run()


def _default_dir(config: TrainConfig) -> str:
    return f"runs/{config.method}-{time.strftime('%Y%m%d-%H%M%S')}"


def _read_state(run_dir: Path) -> _State:
    from whileai.engine.state import snapshot_dir

    folder = snapshot_dir(run_dir / "checkpoint")
    step = json.loads((folder / "meta.json").read_text())["step"]
    path = run_dir / "checkpoint" / f"loop-{step:08d}.json"
    if not path.is_file():
        raise ConfigError(f"the checkpoint in {run_dir / 'checkpoint'} has no loop state {path.name}: it was cut off "
                          "while being written; there is nothing consistent to resume from")
    return _State(**json.loads(path.read_text()))


@contextmanager
def _stop_on_sigint() -> Iterator[dict[str, bool]]:
    """The first Ctrl-C asks the loop to stop after the current step; a second one stops at once."""
    flag = {"stop": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: Any) -> None:
        if flag["stop"]:
            raise KeyboardInterrupt
        flag["stop"] = True
        print("\nCtrl-C: finishing this step, then writing a checkpoint (Ctrl-C again to quit without one)",
              flush=True)

    signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


class _Trainer:
    """The state of one run while it trains. Methods are the phases; ``run`` reads top to bottom."""

    def __init__(self, config: TrainConfig, method: Any, taskset: Any, rows: RowsFile | None,
                 run_dir: Path, resumed: _State | None) -> None:
        self.config, self.method, self.taskset, self.rows = config, method, taskset, rows
        self.batch_lines: list[int] = []  # the file lines of the batch in hand (a run from --rows)
        self.run_dir = run_dir
        self.state = resumed or _State()
        self.resuming = resumed is not None
        self.engine: Any = None
        self.teacher: Any = None  # the run spec's teacher (OPD, OPSD), built after the warm start
        self.resolved = self._resolve()

    # ------------------------------------------------------------------ setup
    @property
    def lag(self) -> int:
        """The resolved sampler lag (``config.with_lag`` has filled a None in)."""
        return int(self.config.lag or 0)

    def _engine(self) -> Any:
        from whileai.engine import TrainingEngine

        spec = self.method.run_spec() if self.method is not None else None
        needs_reference = spec is not None and _needs_reference(spec)
        engine = TrainingEngine(self.config.model, lora_rank=self.config.lora_rank, device=self.config.device,
                                seed=self.config.seed, reference=needs_reference or None,
                                micro_batch_tokens=self.config.micro_batch_tokens, keep_sampler_versions=1)
        if spec is not None and spec.critic is not None:
            engine.add_critic(self._critic_rate(), reward_range=spec.critic.reward_range)
        if spec is not None and spec.head == "score":  # a reward model: the value head is the scalar head
            engine.add_critic(self.config.critic_learning_rate or self.config.learning_rate or 1e-3)
        return engine

    def _critic_rate(self) -> float:
        """The critic's learning rate: --critic-learning-rate, else the method's own (its run spec's critic)."""
        return self.config.critic_learning_rate or self.method.run_spec().critic.learning_rate

    def _resolve(self) -> config_io.Resolved:
        """Every setting the config left None, by its rule (loop.config.resolve); the method's declared rate
        counts once the method is known (--method auto: after route)."""
        declared = self.method.run_spec().learning_rate if self.method is not None else None
        return config_io.resolve(self.config, self.taskset, declared)

    def _sampling(self) -> Sampling:
        spec = self.method.run_spec()
        task_cap = self.taskset.max_tokens if self.taskset is not None else None
        cap = self.config.max_tokens or task_cap or spec.max_tokens or DEFAULT_MAX_TOKENS
        return Sampling(spec.temperature, int(cap), cap_is_answer_length=(self.config.max_tokens is None
                                                                          and task_cap is not None))

    def _prompts(self, engine: Any, tasks: Sequence[Any]) -> list[list[int]]:
        from whileai.envs import render_prompt

        return [render_prompt(engine.tokenizer, t) for t in tasks]

    def _build_teacher(self) -> None:
        """The run spec's teacher, once the weights RL starts from are in place (an EMA starts from them); a
        resume restores an EMA teacher's average from the checkpoint."""
        spec = self.method.run_spec().teacher
        if spec is None or self.teacher is not None:
            return
        self.teacher = teacher_io.build(spec, self.config, self.engine, self.taskset)
        saved = self.run_dir / "checkpoint" / f"teacher-{self.engine.step:08d}.pt"
        if self.resuming and self.state.step > 0:
            self.teacher.load(saved)

    # ------------------------------------------------------------------ the run
    def run(self) -> Run:
        with transformers_bars(self.config.progress):  # --no-progress: no weight-loading / shard-writing bars
            return self._run()

    def _run(self) -> Run:
        started = time.perf_counter()
        # --method auto: a probe of rollouts, then route; otherwise the engine for the method
        engine = self._engine() if self.method is not None else self._route()
        if self.resuming:
            engine.load_state(str(self.run_dir / "checkpoint"))
        else:
            self.state.method_state = self.method.initial_state()  # the loop owns it and checkpoints it
        self.engine = engine
        self.metrics = Metrics(self.run_dir, self.state.step if self.resuming else None)
        self.resolved = self._resolve()
        self.adam = {"learning_rate": self.resolved.learning_rate}
        log = Progress(self.resolved.steps, self.state.step, self.config.progress, self.method.name)
        try:
            with _stop_on_sigint() as stop:
                self._before(log, stop)
                self._build_teacher()
                self._loop(log, stop)
        finally:
            log.close()
            self.metrics.close()
        return self._finish(time.perf_counter() - started)

    def _before(self, log: Progress, stop: Mapping[str, bool]) -> None:
        """The supervised warm start and the held-out evaluation before training, each once (a resume skips
        what the checkpoint says is done); Ctrl-C after either writes a checkpoint and stops there."""
        if not self.resuming:
            sampling = self._sampling() if self.taskset is not None else None
            log.write(f"{self.method!r}\nrun spec: {self.method.run_spec().describe()}"
                      + (f"\nsampling: temperature {sampling.temperature:g}, max_tokens {sampling.max_tokens}, lag "
                         f"{self.lag}" if sampling is not None else "") + f"\nrun dir: {self.run_dir}")
            if self.config.teacher is not None:
                log.write(f"teacher: {self.config.teacher} (loaded once, frozen)")
            if self.method.run_spec().critic is not None:
                log.write(f"critic learning rate {self._critic_rate():g} (" + ("--critic-learning-rate"
                          if self.config.critic_learning_rate else "the method's") + ")")
            held = len(self.taskset.split("test")) if self._can_eval() else 0
            if self.rows is not None and self._can_eval() and (warning := contamination(
                    self.rows, self.taskset.split("test")[: self.config.eval_tasks])) is not None:
                log.write(warning)  # (tokens branch: the lead re-wires this after the spine rewrite)
            if self._can_eval() and self.config.eval_tasks > held:
                log.write(f"note: eval_tasks {self.config.eval_tasks}, but the taskset's test split holds {held} "
                          f"tasks: every evaluation scores all {held}")
            knob_cap = self.config.knobs.get("max_tokens")
            if sampling is not None and knob_cap is not None and int(knob_cap) != sampling.max_tokens:
                source = "--max-tokens" if self.config.max_tokens else "the taskset's cap"
                log.write(f"note: the method's max_tokens {knob_cap} (--set) is not the sampling cap: {source}, "
                          f"{sampling.max_tokens}, is (--max-tokens sets it); the knob still reaches an update that "
                          "reads it (Dr. GRPO's length normaliser)")
            if sampling is not None and sampling.max_tokens >= LONG_CAP and self.config.max_tokens is None:
                log.write(f"note: generations may run to {sampling.max_tokens} tokens (the method's max_tokens; the "
                          "taskset sets none): set --max-tokens, or max_tokens in the taskset, for short answers")
        if self.resolved.warm_start_steps and not self.state.warm_start_done:
            loss = self._warm_start()
            log.write(f"warm start: {len(loss)} supervised steps on reference answers at learning rate "
                      f"{self.resolved.warm_start_learning_rate:g} (loss {loss[0]:.3f} -> {loss[-1]:.3f})")
            self._reference_after_warm_start()
            self._stop_if_asked(stop)
        elif self.resolved.warm_start_steps and self.resuming:
            self._reference_after_warm_start()
        self.state.warm_start_done = True
        if self._can_eval() and not self.state.evals:
            self.state.evals.append({"step": 0, **self._evaluate()})
            log.write(f"held-out pass@1 before: {_eval_line(self.state.evals[-1])}")
            self._stop_if_asked(stop)
        if self.rows is not None:  # what the file holds, route's verdict, the held-out traces
            trace_run.start(self.rows, self.method, self.config, self.run_dir, self.engine,
                            self._sampling().scoring(), self.state.method_state, log.write)

    def _stop_if_asked(self, stop: Mapping[str, bool]) -> None:
        if stop["stop"]:
            self.state.warm_start_done = True
            self._checkpoint()
            raise Interrupted(self.run_dir, self.state.step)

    def _loop(self, log: Progress, stop: Mapping[str, bool]) -> None:
        queue = LagQueue(self.lag, self.state.queue)
        spec = self.method.run_spec()
        warmup = spec.critic.warmup if spec.critic is not None else 0
        critic_steps = spec.critic.steps if spec.critic is not None else 0
        while self.state.step < self.resolved.steps:
            t = self.state.step
            began = time.perf_counter()
            self.adam = {"learning_rate": config_io.learning_rate_at(self.config.lr_schedule, self.resolved.learning_rate,
                                                                     t, self.resolved.steps)}
            batch, sample_s = self._next_batch(queue, t)
            trained = time.perf_counter()
            # the first `warmup` steps train only the critic: the policy moves once its values mean something
            if spec.head == "score":
                result = score_head_step(self.engine, self.method, batch, adam=self.adam)
            else:
                result = policy_step(self.engine, self.method, batch, adam=self.adam, state=self.state.method_state,
                                     sampling_params=self._sampling().scoring(), rescore=self._rescore(batch, t),
                                     critic_steps=critic_steps, train_policy=t >= warmup,
                                     single_pass_tokens=self.config.micro_batch_tokens, teacher=self.teacher)
                if self.teacher is not None:  # an EMA teacher follows the weights after every optimizer step
                    self.teacher.after_step(self.engine)
            self.state.method_state = result.state
            self.state.step = t + 1
            self.state.queue = queue.state()
            record = {"step": t + 1, **result.metrics, "lag": self.lag, "policy_trained": t >= warmup,
                      "sampled_at_step": int(batch[0].get("sampler_step", t)) if batch else t,
                      "learning_rate": self.adam["learning_rate"], "time/sample_s": sample_s,
                      "time/train_s": time.perf_counter() - trained, "time/step_s": time.perf_counter() - began}
            if self.config.eval_every and (t + 1) % self.config.eval_every == 0 and t + 1 < self.resolved.steps \
                    and self._can_eval():
                self.state.evals.append({"step": t + 1, **self._evaluate()})
                record["eval/pass_at_1"] = self.state.evals[-1]["pass_at_1"]
            if self.rows is not None:  # which lines of the file the method dropped, and its notes saying why
                record.update(trace_run.step_record(result.update, self.batch_lines))
            self.metrics.write(record)
            log.update(record)
            for note in result.update.notes[:2] if (t + 1) % 10 == 0 else ():
                log.write(f"step {t + 1} note: {note}")
            if self.rows is not None and (t + 1) % 10 == 0 and trace_run.dropped_note(record):
                log.write(str(trace_run.dropped_note(record)))
            if (t + 1) % self.config.save_every == 0 or t + 1 == self.resolved.steps or stop["stop"]:
                self._checkpoint()
            if stop["stop"] and t + 1 < self.resolved.steps:
                raise Interrupted(self.run_dir, t + 1)

    def _rescore(self, batch: Sequence[Mapping[str, Any]], step: int) -> bool:
        """Skip the scoring forward when the sampler's log-probabilities are the policy's: sampled by the
        current weights (lag 0, in this step) at the temperature the trainer scores with."""
        return self.rows is not None or any(r.get("sampler_step") != step for r in batch)

    # ------------------------------------------------------------------ batches
    def _next_batch(self, queue: LagQueue, step: int) -> tuple[list[dict[str, Any]], float]:
        if self.rows is not None:
            return self._pushed_rows(step), 0.0
        began = time.perf_counter()
        while len(queue.batches) < self.lag:  # fill the pipeline with the starting weights
            queue.push(self._sample(len(queue.batches), step))
        batch = queue.push(self._sample(step + self.lag, step))
        if batch is None:  # cannot happen: the queue holds lag batches, so a push returns the oldest
            raise WhileaiError(f"the lag queue returned no batch at step {step}")
        return batch, time.perf_counter() - began

    def _sample(self, draw: int, sampler_step: int) -> list[dict[str, Any]]:
        """The ``draw``-th batch of the run, sampled now with the current weights."""
        spec = self.method.run_spec()
        n = self.config.rollouts_per_step // spec.rollouts_per_prompt
        tasks = step_tasks(self.taskset.split("train"), n, self.config.seed, draw)
        return sample_batch(self.engine, self.taskset, tasks, self._prompts(self.engine, tasks), spec,
                            self._sampling(), self.config.seed * 1_000_003 + draw * 101, sampler_step)

    def _pushed_rows(self, step: int) -> list[dict[str, Any]]:
        """Rows read from the file, whole groups together where the method takes them, in a seeded order."""
        assert self.rows is not None  # only called for a run from --rows
        rows, self.batch_lines = self.rows.batch(step, self.config.rollouts_per_step, self.config.seed,
                                                 trace_run.grouped(self.method))
        return rows

    # ------------------------------------------------------------------ phases
    def _warm_start(self) -> list[float]:
        """Supervised steps on reference episodes: the model's turns weighted 1/count, the environment's 0."""
        from whileai.engine.datums import make_datum
        from whileai.envs.episode import reference_episode

        losses = []
        tasks_all = self.taskset.split("train")
        for k in range(self.resolved.warm_start_steps):
            tasks = step_tasks(tasks_all, min(self.config.warm_start_batch, len(tasks_all)), self.config.seed,
                               10_000_000 + k)
            data = [(prompt, *reference_episode(self.taskset, task, self.engine.tokenizer))
                    for task, prompt in zip(tasks, self._prompts(self.engine, tasks))]
            count = sum(sum(mask) for _, _, mask in data)
            datums = [make_datum(p, a, weights=[float(m) / count for m in mask]) for p, a, mask in data]
            out = self.engine.forward_backward(datums, "cross_entropy")
            self.engine.optim_step({"learning_rate": self.resolved.warm_start_learning_rate})
            losses.append(float(out.metrics["loss:sum"]))
        return losses

    def _reference_after_warm_start(self) -> None:
        """Full fine-tuning: the reference policy (a KL term's, an 'initial' teacher's) is the policy RL starts
        from, so it is re-taken after the warm start and saved once as checkpoint/reference.pt; a resume loads it
        from there. Under LoRA the reference is the adapter-free base and stays (check() refuses a warm start for
        a method that needs it)."""
        reference = self.engine.reference
        if reference is None or reference.shares_weights:
            return
        path = self.run_dir / "checkpoint" / REFERENCE_FILE
        if not self.resuming:
            reference.reset_to(self.engine.model)
            path.parent.mkdir(exist_ok=True)
            reference.save(path)
        elif path.is_file():
            reference.load(path)
        else:
            raise ConfigError(f"--resume {self.run_dir}: the checkpoint has no {REFERENCE_FILE} (the reference policy "
                              "taken after the warm start), so the resumed run would measure its KL against another "
                              "policy; start the run again in a new --run-dir")

    def _can_eval(self) -> bool:
        return self.taskset is not None and self.config.eval_tasks > 0

    def _evaluate(self) -> dict[str, Any]:
        tasks = self.taskset.split("test")[: self.config.eval_tasks]
        return held_out(self.engine, self.taskset, tasks, self._prompts(self.engine, tasks),
                        self.config.eval_samples, self._sampling(), self.config.seed)

    def _route(self) -> Any:
        """--method auto: warm start, sample a probe, ask route, and train with its method from here on.

        The chosen method and its knobs replace 'auto' in RUN_DIR/config.toml, so a resume trains the same one."""
        import whileai as wai
        from whileai.loop.rollouts import rollouts

        self.method = wai.FlashReinforce()  # sampling settings for the probe only
        engine = self.engine = self._engine()
        if self.resolved.warm_start_steps:
            self._warm_start()
        self.state.warm_start_done = True
        ask: Any
        if self.rows is not None:  # the file's tasks, rewards and models (which model wrote them, or none)
            ask = self.rows.graded()
        else:  # probe rollouts come from the model being trained
            tasks = self.taskset.split("train")[:PROBE_TASKS]
            probe = rollouts(engine, self.taskset, tasks, self._prompts(engine, tasks),
                             [PROBE_ROLLOUTS] * len(tasks), self._sampling(), self.config.seed, -1)
            ask = [{"task_id": r["task_id"], "reward": r["reward"], "truncated": r["truncated"],
                    "model": self.config.model} for r in probe]
        answer = wai.route(ask, model=self.config.model, threshold=PASS)
        (self.run_dir / "route.txt").write_text(str(answer) + "\n")
        if answer.config is None:
            raise ConfigError(f"--method auto: route found nothing to train with yet.\n{answer}")
        self.method = answer.config
        problems = check(config_io.with_lag(replace(self.config, method=self.method.name), self.method), self.method,
                         self.taskset)
        if problems:
            raise ConfigError(f"--method auto chose {self.method.name!r} ({answer.answer}), which this config cannot "
                              "run:" + "".join(f"\n  - {p}" for p in problems))
        if self.rows is not None:  # an RL method needs a reward and behavior log-probabilities on every trace
            self.rows.require(self.method.run_spec().source == "rollouts")
        self.config = config_io.with_lag(replace(self.config, method=self.method.name, knobs=_knobs_of(self.method)),
                                         self.method)
        (self.run_dir / "config.toml").write_text(config_io.to_toml(self.config))
        print(f"--method auto: {self.method.name} ({answer.question} {answer.answer}); see {self.run_dir}/route.txt")
        spec = self.method.run_spec()
        if spec.critic is not None:
            engine.add_critic(self._critic_rate(), reward_range=spec.critic.reward_range)
        if "ref_logprobs" in spec.needs and engine.reference is None:
            raise ConfigError(f"--method auto chose {self.method.name!r}, which needs a reference policy; run it "
                              f"by name: --method {self.method.name}")
        return engine

    def _checkpoint(self) -> None:
        """Loop state first (named by the engine step it belongs to), then the engine's atomic snapshot."""
        folder = self.run_dir / "checkpoint"
        folder.mkdir(exist_ok=True)
        self.state.engine_step = self.engine.step
        write_json(folder / f"loop-{self.engine.step:08d}.json", self.state.__dict__)
        if self.teacher is not None:
            self.teacher.save(folder / f"teacher-{self.engine.step:08d}.pt")
        self.engine.save_state(str(folder))
        for old in folder.glob("loop-*.json"):
            if old.name != f"loop-{self.engine.step:08d}.json":
                old.unlink()
        for old in folder.glob("teacher-*.pt"):
            if old.name != f"teacher-{self.engine.step:08d}.pt":
                old.unlink()

    def _finish(self, seconds: float) -> Run:
        summary: dict[str, Any] = {"method": repr(self.method), "run_spec": self.method.run_spec().describe(),
                                   "steps": self.state.step, "seconds": round(seconds, 2),
                                   "run_dir": str(self.run_dir)}
        # the values the config left to the run's rules (None in config.toml), as this run resolved them
        summary["resolved"] = dataclasses.asdict(self.resolved)
        if self.method.run_spec().critic is not None:
            summary["resolved"]["critic_learning_rate"] = self._critic_rate()
        if self.taskset is not None:
            summary["resolved"].update(max_tokens=self._sampling().max_tokens,
                                       temperature=self._sampling().temperature)
        records = self.metrics.read()
        if records:
            first, last = records[: max(1, len(records) // 5)], records[-max(1, len(records) // 5):]
            rows_method = self.method.run_spec().source == "rows"
            keys = ("method/mean_loss", "loss") if rows_method else ("reward", "loss", "admitted_share", "drift")
            if self.rows is not None and not rows_method:  # a log's rewards (and c's sum) say nothing of the model
                keys = ("admitted_share", "drift")
            for key in keys:
                if key in records[0] and not (key == "loss" and "method/mean_loss" in records[0] and rows_method):
                    summary[f"{key}_first_fifth"] = _mean(first, key)
                    summary[f"{key}_last_fifth"] = _mean(last, key)
        if self._can_eval():
            self.state.evals.append({"step": self.state.step, **self._evaluate()})
            before, after = self.state.evals[0], self.state.evals[-1]
            summary["eval_before"] = {k: v for k, v in before.items() if k != "rows"}
            summary["eval_after"] = {k: v for k, v in after.items() if k != "rows"}
            summary["compare"] = before_after(before, after)
        if self.rows is not None:  # a traces run without an eval taskset: its held-out traces, never a pass rate
            summary.update(trace_run.finish(self.rows, self.method, self.config, self.run_dir, self.engine,
                                            self._sampling().scoring(), self.state.method_state))
        weights = None
        if self.config.export:
            weights = Path(self.engine.export(str(self.run_dir / "final"), merged=not self.config.lora_rank,
                                              overwrite=True))
            summary["weights"] = str(weights)
        evals = [{k: v for k, v in e.items() if k != "rows"} for e in self.state.evals]
        summary["plot"] = str(plot(records, evals, self.run_dir / "curves.png", f"{self.method.name} on "
                                   f"{self.config.taskset or self.config.rows}"))
        summary["report"] = _report(summary)
        write_json(self.run_dir / "summary.json", summary)
        write_json(self.run_dir / "evals.json", evals)
        if self.state.evals:  # the last held-out evaluation as graded rows: `wai compare` pairs two runs on it
            last = self.state.evals[-1]["rows"]
            (self.run_dir / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in last))
            first = self.state.evals[0]["rows"]  # and the first: before against after, pooled over seeds too
            (self.run_dir / "heldout-before.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first))
        return Run(self.run_dir, self.config, summary, weights)


def _knobs_of(method: Any) -> dict[str, Any]:
    """A method's knob values that a TOML file can hold (what rebuilds it with wai.method(name, **knobs))."""
    out: dict[str, Any] = {}
    for name in method.knobs():
        value = getattr(method, name)
        if value is None or isinstance(value, (bool, int, float, str)):
            if value is not None:
                out[name] = value
        elif isinstance(value, tuple) and all(isinstance(v, (int, float)) for v in value):
            out[name] = list(value)
    return out


def _mean(records: Sequence[Mapping[str, Any]], key: str) -> float:
    values = [float(r[key]) for r in records if key in r and math.isfinite(float(r[key]))]
    return sum(values) / len(values) if values else float("nan")


def _eval_line(result: Mapping[str, Any]) -> str:
    low, high = result["ci95"]
    return f"{result['pass_at_1']:.3f} [{low:.3f}, {high:.3f}] over {result['tasks']} tasks x {result['samples']}"


def _report(summary: Mapping[str, Any]) -> str:
    lines = [f"{summary['method']}", f"  {summary['steps']} steps in {summary['seconds']:.0f} s; run dir "
             f"{summary['run_dir']}"]
    if "reward_first_fifth" in summary:
        lines.append(f"  training reward {summary['reward_first_fifth']:.3f} (first fifth) -> "
                     f"{summary['reward_last_fifth']:.3f} (last fifth)")
    if "method/mean_loss_first_fifth" in summary:  # the method's own loss (DPO's -log sigmoid, RM's), not c's sum
        lines.append(f"  {summary['method'].split('(')[0]} loss {summary['method/mean_loss_first_fifth']:.4g} "
                     f"(first fifth) -> {summary['method/mean_loss_last_fifth']:.4g} (last fifth)")
    elif "loss_first_fifth" in summary and "reward_first_fifth" not in summary:
        lines.append(f"  loss {summary['loss_first_fifth']:.4g} (first fifth) -> {summary['loss_last_fifth']:.4g} "
                     "(last fifth)")
    if "admitted_share_last_fifth" in summary:
        lines.append(f"  admitted share (last fifth) {summary['admitted_share_last_fifth']:.2f}, drift "
                     f"{summary.get('drift_last_fifth', 0.0):.3g}")
    if "compare" in summary:
        lines.append(f"  before: {_eval_line(summary['eval_before'])}")
        lines.append(f"  after:  {_eval_line(summary['eval_after'])}")
        lines.append(f"  {summary['compare']['text']}")
    lines += trace_run.report_lines(summary)
    if "weights" in summary:
        lines.append(f"  weights: {summary['weights']}")
    lines.append(f"  curves: {summary['plot']}")
    return "\n".join(lines)
