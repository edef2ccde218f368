"""The checks made before anything loads: every impossible combination of config, method, taskset and plan,
each with a fix; and what a method asks of the backend (``needs_of``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from whileai.envs import load_taskset
from whileai.errors import ConfigError, WhileaiError
from whileai.loop.hooks import teacher as teacher_io
from whileai.loop.plan import config as config_io
from whileai.loop.plan.config import TrainConfig
from whileai.loop.plan.run_plan import RunPlan, make_plan
from whileai.loop.sources import recorder, trace_run
from whileai.loop.sources.sampler import problems as server_sampler_problems
from whileai.methods import method as method_named
from whileai.trainers import Needs

if TYPE_CHECKING:
    from whileai.envs.core import Taskset
    from whileai.methods.base import Method
    from whileai.methods.run_spec import RunSpec

PYTHON_ROWS = "<rows passed in Python>"


def resolve_method(config: TrainConfig, method: Method | None = None) -> tuple[Method | None, list[str]]:
    """The method object (None for 'auto', chosen later) and any problem building it."""
    if method is not None and not isinstance(method, str):
        return method, []
    name = method or config.method
    if name == "auto":
        return None, []
    try:
        return method_named(name, **config.knobs), []
    except ConfigError as err:
        return None, [f"method = {name!r}: {err}"]


def check(config: TrainConfig, method: Method | None, taskset: Taskset | None = None,
          plan: RunPlan | None = None) -> list[str]:
    """Every impossible combination of the config and the method's run spec, each with a fix."""
    problems = config_io.check_ranges(config) + trace_run.rows_problems(config, method, config.rows == PYTHON_ROWS) \
        + recorder.problems(config, method)
    if method is None:
        return problems
    plan = plan or make_plan(config, {}, method, taskset)
    spec = method.run_spec()
    if spec.source == "rows" and config.rows is None:
        problems.append(f"method {method.name!r} trains on rows as pushed: give --rows FILE (JSONL with prompt and "
                        "completion, or prompt_tokens and tokens)")
    if spec.source == "rollouts" and config.taskset is None and config.rows is None and config.rows_from is None:
        problems.append(f"method {method.name!r} learns from rollouts: give --taskset (prompts and a grader), or "
                        "--rows FILE of logged traces")
    if spec.source == "rollouts" and spec.max_lag is not None and plan.lag > spec.max_lag:
        problems.append(f"lag = {plan.lag} is beyond the {spec.max_lag} steps method {method.name!r} is built to "
                        f"correct (its off_policy_steps); lower --lag or raise the knob (--set off_policy_steps=N)")
    if spec.source == "rollouts":
        problems += _rollout_problems(config, method, spec) + _reference_problems(config, method, spec, plan)
        prompts = config.rollouts_per_step // spec.rollouts_per_prompt
        if taskset is not None and config.rows is None and prompts > len(taskset.split("train")):
            problems.append(f"a step needs {prompts} distinct training prompts but taskset {config.taskset!r} has "
                            f"{len(taskset.split('train'))} in its train split: lower rollouts_per_step or add tasks")
    problems += teacher_io.check(spec, method.name, config.teacher, taskset, no_tasks=config.taskset is None)
    if spec.critic is not None and plan.steps <= spec.critic.warmup:
        problems.append(f"steps = {plan.steps} leaves no policy step after the critic's {spec.critic.warmup} "
                        f"warm-up steps: raise --steps above {spec.critic.warmup} or lower the warm-up "
                        "(--set critic_warmup=N)")
    return problems + server_sampler_problems(config, method, plan)


def _rollout_problems(config: TrainConfig, method: Method, spec: RunSpec) -> list[str]:
    problems = []
    if spec.rollouts_per_prompt < spec.min_rollouts_per_prompt:
        problems.append(f"method {method.name!r} takes its baseline over a prompt's group, and "
                        f"{spec.rollouts_per_prompt} rollout per prompt makes every advantage 0: set "
                        f"--set rollouts_per_prompt={max(spec.min_rollouts_per_prompt, 2)} or more, or use a one-rollout "
                        "method (flash_reinforce, rae, sao, bpco)")
    if config.rollouts_per_step >= 1 and (config.rollouts_per_step < spec.rollouts_per_prompt
                                          or config.rollouts_per_step % spec.rollouts_per_prompt):
        problems.append(f"rollouts_per_step = {config.rollouts_per_step} is not a multiple of the method's "
                        f"{spec.rollouts_per_prompt} rollouts per prompt: use a multiple such as "
                        f"{max(1, config.rollouts_per_step // spec.rollouts_per_prompt) * spec.rollouts_per_prompt}")
    return problems


def _needs_reference(spec: RunSpec) -> bool:
    """The run keeps a reference policy: for ref_logprobs (beta > 0) or an 'initial' teacher."""
    return "ref_logprobs" in spec.needs or (spec.teacher is not None and spec.teacher.weights == "initial")


def _reference_problems(config: TrainConfig, method: Method, spec: RunSpec, plan: RunPlan) -> list[str]:
    """Full fine-tuning re-takes the reference after the warm start; under LoRA it is the adapter-free base."""
    if not (_needs_reference(spec) and config.lora_rank and plan.warm_start_steps):
        return []
    return [f"method {method.name!r} needs the reference policy, which under LoRA is the model with its adapters "
            f"switched off (the model as loaded), and a warm start of {plan.warm_start_steps} steps trains the "
            "adapters, so the KL or the teacher would pull the student back to the model before the warm start: set "
            "--warm-start-steps 0, or train every weight (--lora-rank 0: the reference is then the policy after the "
            "warm start)"]


def _load_taskset(config: TrainConfig) -> tuple[Taskset | None, list[str]]:
    """The taskset to sample from, or (a run from --rows) the one to evaluate on: eval_taskset, else taskset."""
    name = "eval_taskset" if config.eval_taskset is not None else "taskset"
    spec = getattr(config, name)
    if spec is None:
        return None, []
    try:
        return load_taskset(spec, **config.taskset_options), []
    except WhileaiError as err:
        return None, [f"{name} = {spec!r}: {err}"]


def needs_of(config: TrainConfig, plan: RunPlan, method: Method | None) -> Needs:
    """What the method's run spec and the config ask of the backend (``--method auto``: a probe's)."""
    if method is None:
        return Needs(export=config.export)
    spec = method.run_spec()
    critic: tuple[float, tuple[float, float] | None] | None = None
    rate = float(plan.critic_learning_rate or 0.0)
    if spec.critic is not None:
        critic = (rate, spec.critic.reward_range)
    elif spec.head == "score":  # a reward model: the value head is the scalar head
        critic = (rate, None)
    policy_teacher = spec.teacher.weights if spec.teacher is not None and spec.teacher.weights != "model" else None
    reference = _needs_reference(spec)
    return Needs(spec.loss, reference, critic, policy_teacher,
                 retake_reference=reference and not config.lora_rank and plan.warm_start_steps > 0,
                 export=config.export, own_distribution=plan.temperature == 1.0, loss_config=tuple(dict(spec.loss_config)))



def _knobs_of(method: Method) -> dict[str, Any]:
    """The knobs the user set on a method object that a TOML file can hold (what rebuilds it with
    wai.method(name, **knobs)); a knob left at its declared default stays the method's, so the run may still
    fill it (the plan's generation cap)."""
    out: dict[str, Any] = {}
    for name in method.knobs():
        if name not in method.set_fields():
            continue
        value = getattr(method, name)
        if value is None or isinstance(value, (bool, int, float, str)):
            if value is not None:
                out[name] = value
        elif isinstance(value, tuple) and all(isinstance(v, (int, float)) for v in value):
            out[name] = list(value)
    return out
