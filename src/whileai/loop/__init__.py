"""The training loop: sample -> grade -> method.update -> forward_backward -> optim_step, as one run.

    from whileai.loop import train
    run = train()                                  # the embedded default: a built-in model and task, CPU
    run = train(method="grpo", taskset="builtin:add", steps=100)
    run = train(method="sft", rows=scored.passes(), model="./my-model")
    run = train(method="grpo", url="http://127.0.0.1:8321")   # over a running `wai serve`

The loop itself is ``whileai.loop.core.run_loop``; the settings it runs with are one ``RunPlan``
(``whileai.loop.plan.run_plan``). See docs/train.md. The loop reads a method only through ``run_spec()`` and ``update()``.
"""

from whileai.loop.hooks.warm_start import Interrupted
from whileai.loop.judge import Judge, reward_model
from whileai.loop.plan.config import TrainConfig
from whileai.loop.plan.run_plan import RunPlan
from whileai.loop.run import Run, dry_run, train
from whileai.loop.step import StepResult, policy_step, train_step
from whileai.loop.trainers.backends import Trainer

__all__ = ["Interrupted", "Judge", "Run", "RunPlan", "StepResult", "TrainConfig", "Trainer", "dry_run",
           "policy_step", "reward_model", "train", "train_step"]
