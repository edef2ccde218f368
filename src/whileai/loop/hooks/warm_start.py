"""The warm start: supervised steps on reference episodes before RL (``warm_start``), and its hook
(``WarmStart``), which then re-takes the reference policy from the weights RL starts from.

The hooks around ``whileai.loop.core.run_loop`` run in this order (``whileai.loop.run``):

    WarmStart -> HeldOut -> [the source's feed] -> PreflightHook -> TeacherHook -> Record -> [the source's
    pushing] -> Checkpoints

Each is a ``whileai.loop.types.Hook`` over the run's ``Context`` (``whileai.loop.hooks.context``).
``before(loop)`` runs once before the first step (a resume skips what its checkpoint says is done);
``after_step(loop, record, result)`` after each. The checkpoint hook is last: it saves and, after a Ctrl-C,
stops the run with ``Interrupted``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from whileai.envs.episode import reference_episode
from whileai.errors import ConfigError
from whileai.loop.hooks.context import Context
from whileai.loop.plan import rules
from whileai.loop.plan.run_plan import RunPlan
from whileai.loop.sources.rollouts import step_tasks
from whileai.loop.types import Hook, Loop, prompts

REFERENCE_FILE = "reference.pt"  # in RUN_DIR/checkpoint: the reference policy taken after the warm start
WARM_START_DRAW = 10_000_000  # warm-start step k draws its tasks as step WARM_START_DRAW + k (apart from RL's)


def warm_start(trainer: Any, taskset: Any, plan: RunPlan) -> list[float]:
    """``plan.warm_start_steps`` supervised steps on reference episodes (fewer when the plan's rule stops it
    once its pass estimate is reached, ``rules.warm_start_reached``); each step's loss per answer token."""
    from whileai.engine.datums import make_datum

    losses: list[float] = []
    answer_tokens: list[float] = []
    tasks_all = taskset.split("train")
    for k in range(plan.warm_start_steps):
        tasks = step_tasks(tasks_all, min(plan.warm_start_batch, len(tasks_all)), plan.seed, WARM_START_DRAW + k)
        data = [(prompt, *reference_episode(taskset, task, trainer.tokenizer))
                for task, prompt in zip(tasks, prompts(trainer.tokenizer, tasks))]
        count = sum(sum(mask) for _, _, mask in data)
        datums = [make_datum(p, a, weights=[float(m) / count for m in mask]) for p, a, mask in data]
        out = trainer.forward_backward(datums, "cross_entropy")
        trainer.optim_step({"learning_rate": plan.warm_start_learning_rate})
        losses.append(float(out.metrics["loss:sum"]))
        answer_tokens.append(count / len(data))
        if plan.warm_start_until_pass and rules.warm_start_reached(losses, answer_tokens):
            break
    return losses


@dataclass
class WarmStart(Hook):
    """Supervised steps on reference episodes (the model's turns weighted 1/count, the environment's 0), once;
    then, under full fine-tuning, the reference policy is re-taken from the weights RL starts from."""

    ctx: Context

    def before(self, loop: Loop) -> None:
        steps = self.ctx.plan.warm_start_steps
        if steps and not loop.state.warm_start_done:
            losses = warm_start(loop.trainer, self.ctx.taskset, self.ctx.plan)
            until = (f" (the rule's pass estimate {rules.WARM_START_TARGET:g} reached; at most {steps})"
                     if self.ctx.plan.warm_start_until_pass and len(losses) < steps else "")
            self.ctx.log.write(f"warm start: {len(losses)} supervised steps on reference answers at learning rate "
                               f"{self.ctx.plan.warm_start_learning_rate:g} (loss {losses[0]:.3f} -> "
                               f"{losses[-1]:.3f}){until}")
            loop.state.warm_start_steps_done = len(losses)
            self.reference(loop.trainer)
            self.ctx.stop_if_asked(loop.state)
        elif steps and self.ctx.resuming:
            self.reference(loop.trainer)
        loop.state.warm_start_done = True

    def reference(self, trainer: Any) -> None:
        """Full fine-tuning: the reference policy (a KL term's, an 'initial' teacher's) is the policy RL starts
        from, saved once as checkpoint/reference.pt; a resume loads it. Under LoRA it is the adapter-free base."""
        reference = getattr(trainer, "reference", None)
        if reference is None or reference.shares_weights:
            return
        path = self.ctx.run_dir / "checkpoint" / REFERENCE_FILE
        if not self.ctx.resuming:
            reference.reset_to(trainer.model)
            path.parent.mkdir(exist_ok=True)
            reference.save(path)
        elif path.is_file():
            reference.load(path)
        else:
            raise ConfigError(f"--resume {self.ctx.run_dir}: the checkpoint has no {REFERENCE_FILE} (the reference "
                              "policy taken after the warm start), so the resumed run would measure its KL against "
                              "another policy; start the run again in a new --run-dir")
