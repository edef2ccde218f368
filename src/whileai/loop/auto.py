"""``--method auto``: warm start, sample a probe (or read the rows file), ask ``route``, train with its answer.

The chosen method and its knobs replace 'auto' in RUN_DIR/config.toml, so a resume trains the same one; the
run plan is made again for the chosen method (the one setting that waits for it).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from whileai.errors import ConfigError
from whileai.loop.hooks.warm_start import warm_start
from whileai.loop.plan import config as config_io
from whileai.loop.plan.checks import _knobs_of, check, needs_of
from whileai.loop.plan.config import TrainConfig
from whileai.loop.plan.run_plan import FILE, USER, RunPlan, make_plan
from whileai.loop.sources.rollouts import rollouts
from whileai.loop.types import PASS, LoopState, prompts
from whileai.methods.flash_reinforce import FlashReinforce
from whileai.routing import route
from whileai.trainers import Trainer, refusals

if TYPE_CHECKING:
    from whileai.envs.core import Taskset
    from whileai.loop.sources.traces import RowsFile
    from whileai.methods.base import Method
    from whileai.rows.stats import Rows

PROBE_TASKS, PROBE_ROLLOUTS = 16, 8  # what --method auto routes on when no rows are given


def route_method(config: TrainConfig, plan: RunPlan, trainer: Trainer, taskset: Taskset | None, rows: RowsFile | None,
                 run_dir: Path, state: LoopState) -> tuple[TrainConfig, RunPlan, Method]:
    """The config, plan and method route chose; the warm start is done here (on the model the probe samples)."""
    origins = {k: s for k, s in plan.sources if s in (USER, FILE)}
    probe = make_plan(config, origins, FlashReinforce(), taskset)  # sampling settings for the probe only
    if probe.warm_start_steps:
        warm_start(trainer, taskset, probe)
    state.warm_start_done = True
    ask: Rows
    if rows is not None:  # the file's tasks, rewards and models (which model wrote them, or none)
        ask = rows.graded()
    else:  # probe rollouts come from the model being trained (a run without rows has a taskset: checked)
        assert taskset is not None
        tasks = taskset.split("train")[:PROBE_TASKS]
        sampled = rollouts(trainer, taskset, tasks, prompts(trainer.tokenizer, tasks), [PROBE_ROLLOUTS] * len(tasks),
                           probe.sampling(), config.seed, -1, cap_is_answer_length=probe.cap_is_answer_length)
        ask = [{"task_id": r["task_id"], "reward": r["reward"], "truncated": r["truncated"], "model": config.model}
               for r in sampled]
    answer = route(ask, model=config.model, threshold=PASS)
    (run_dir / "route.txt").write_text(str(answer) + "\n")
    if answer.config is None:
        raise ConfigError(f"--method auto: route found nothing to train with yet.\n{answer}")
    method = answer.config
    chosen = replace(config, method=method.name, knobs=_knobs_of(method))
    plan = make_plan(chosen, origins, method, taskset)
    problems = check(chosen, method, taskset, plan)
    if problems:
        raise ConfigError(f"--method auto chose {method.name!r} ({answer.answer}), which this config cannot run:"
                          + "".join(f"\n  - {p}" for p in problems))
    if rows is not None:  # an RL method needs a reward and behavior log-probabilities on every trace
        rows.require(method.run_spec().source == "rollouts")
    needs = needs_of(chosen, plan, method)
    if trainer.capabilities is not None:  # over --url: the chosen method's needs, as a named one's were checked
        problems = refusals(trainer.capabilities, chosen.model, needs)
        if problems:
            raise ConfigError(f"--method auto chose {method.name!r} ({answer.answer}), which {trainer.where} cannot "
                              "run: " + "; ".join(problems))
    if needs.reference and getattr(trainer, "reference", None) is None:
        raise ConfigError(f"--method auto chose {method.name!r}, which needs a reference policy; run it by name: "
                          f"--method {method.name}")
    (run_dir / "config.toml").write_text(config_io.to_toml(chosen, plan))
    print(f"--method auto: {method.name} ({answer.question} {answer.answer}); see {run_dir}/route.txt")
    if needs.critic is not None:
        rate, reward_range = needs.critic
        trainer.add_critic(rate, **({} if reward_range is None else {"reward_range": reward_range}))
    return chosen, plan, method
