"""The training loop: sample -> grade -> method.update -> kernel -> optimizer step, as one run.

    import whileai as wai
    run = wai.train()                                  # the embedded default: a built-in model and task, CPU
    run = wai.train(method="grpo", taskset="builtin:add", steps=100)
    run = wai.train(method="sft", rows=scored.passes(), model="./my-model")

See docs/train.md. The loop reads a method only through ``run_spec()`` and ``update()``.
"""

from whileai.loop.config import TrainConfig
from whileai.loop.judge import Judge, reward_model
from whileai.loop.run import Interrupted, Run, train
from whileai.loop.step import StepResult, policy_step

__all__ = ["Interrupted", "Judge", "Run", "reward_model", "StepResult", "TrainConfig", "policy_step", "train"]
