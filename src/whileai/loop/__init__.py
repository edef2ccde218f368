"""The training loop: sample -> grade -> method.update -> forward_backward -> optim_step, as one run.

    from whileai.loop import train
    run = train()                                  # the embedded default: a built-in model and task, CPU
    run = train(method="grpo", taskset="builtin:add", steps=100)
    run = train(method="sft", rows=scored.passes(), model="./my-model")
    run = train(method="grpo", url="http://127.0.0.1:8321")   # over a running `wai serve`

The rooms, each importing only the ones below it (docs/decisions.md, "layout"):

    types.py    LoopState, Loop, Hook, Batches, Source, LagQueue, prompts(): the shared types, at the bottom
    step.py     one step's update on one batch (train_step, policy_step)
    sources/    where rows come from: in-process rollouts, a server sampling ahead + weight sync, trace files,
                pushed rows, a recorder's feed (each with its own checks)
    plan/       config, the run plan and its defaults, the rules for empty settings, the checks
    hooks/      warm start, held-out, preflight, teacher, traces, metrics, checkpoints, summary
    core.py     run_loop: the loop itself
    run.py      train(): config -> plan -> trainer -> source -> hooks -> run_loop -> summary
    auto.py, controls.py, judge.py: --method auto, `wai compare`'s controls, the reward-model judge

The trainer it drives is below the loop, in ``whileai.trainers`` (the ``Trainer`` protocol: the in-process
engine, a `wai serve` run, the Tinker SDK). The loop reads a method only through ``run_spec()`` and
``update()``. See docs/train.md.
"""

from whileai.loop.hooks.context import Interrupted
from whileai.loop.judge import Judge, reward_model
from whileai.loop.plan.config import TrainConfig
from whileai.loop.plan.run_plan import RunPlan
from whileai.loop.run import Run, dry_run, train
from whileai.loop.step import StepResult, policy_step, train_step
from whileai.trainers import Trainer

__all__ = ["Interrupted", "Judge", "Run", "RunPlan", "StepResult", "TrainConfig", "Trainer", "dry_run",
           "policy_step", "reward_model", "train", "train_step"]
