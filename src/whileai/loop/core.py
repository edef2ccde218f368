"""The loop `wai train` runs, in one function: sample -> grade -> method.update -> forward_backward ->
optim_step, with the sampler ``lag`` steps behind, then the hooks (evaluation, traces, metrics, progress,
checkpoints).

    run_loop(trainer, method, plan, batches, state, hooks, teacher)

``trainer`` is anything with the ``whileai.trainers.Trainer`` operations (the in-process engine, the
service's ``RunClient``, the Tinker SDK's); ``plan`` is the run's resolved ``RunPlan``; ``batches`` hands out the
batch of each step (a source of ``whileai.loop.sources``: in-process ``Rollouts``, ``Pushed`` rows from a file, a
server sampling ahead, a recorder's feed). The loop reads the method only through ``run_spec()`` and ``update()``
and never branches on its name. Each hook is a ``whileai.loop.types.Hook`` and is called at every point.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from whileai.loop.plan.run_plan import RunPlan
from whileai.loop.step import single_pass_budget, train_step
from whileai.loop.types import Batches, Hook, LagQueue, Loop, LoopState, Scoring

if TYPE_CHECKING:
    from whileai.loop.hooks.teacher import RunTeacher
    from whileai.methods.base import Method
    from whileai.trainers import Trainer


def run_loop(trainer: Trainer, method: Method, plan: RunPlan, batches: Batches, state: LoopState,
             hooks: Sequence[Hook], teacher: RunTeacher | None = None) -> None:
    """Train from ``state.step`` to ``plan.steps``. Every hook's ``before`` runs first and ``after_step`` after
    each step, in order (the last, the checkpoint, may stop the run)."""
    loop = Loop(trainer, method, plan, state, teacher)
    for hook in hooks:  # warm start, held-out before, the teacher (it may set loop.teacher), traces
        hook.before(loop)
    spec = method.run_spec()
    warmup = spec.critic.warmup if spec.critic is not None else 0  # critic-only steps before the policy moves
    queue = LagQueue(plan.lag, state.queue)
    scoring = plan.sampling()
    single_pass = single_pass_budget(spec, plan.micro_batch_tokens)  # the step's path, chosen once for the run
    started = time.perf_counter()
    while state.step < plan.steps:
        try:
            _step(loop, batches, hooks, queue, scoring, warmup, single_pass, started)
        except Exception as error:
            for hook in hooks:  # the server sampler's stops a run whose server died with a checkpoint
                hook.failed(loop, error)
            raise


def _step(loop: Loop, batches: Batches, hooks: Sequence[Hook], queue: LagQueue, scoring: Scoring, warmup: int,
          single_pass: int, started: float) -> None:
    """One step of ``run_loop``: the batch, the update and optimizer step, the record, the hooks."""
    trainer, method, plan, state, teacher = loop.trainer, loop.method, loop.plan, loop.state, loop.teacher
    t = state.step
    began = time.perf_counter()
    adam = {"learning_rate": plan.learning_rate_at(t)}
    loop.batch = batches.next(t, queue)  # sample with the weights of step t - lag, and grade
    for hook in hooks:  # the preflight reads the first batch before its update (and may stop the run)
        hook.before_update(loop)
    trained = time.perf_counter()
    result = train_step(trainer, method, loop.batch, adam=adam, state=state.method_state,
                        sampling_params=scoring, rescore=batches.rescore(loop.batch, t),
                        train_policy=t >= warmup, single_pass_tokens=single_pass, teacher=teacher)
    if teacher is not None:  # an EMA teacher follows the weights after every optimizer step
        teacher.after_step(trainer)
    state.method_state, state.step, state.queue = result.state, t + 1, queue.state()
    record = {"step": t + 1, **result.metrics, "lag": plan.lag, "policy_trained": t >= warmup,
              "sampled_at_step": int(loop.batch[0].get("sampler_step", t)) if loop.batch else t,
              "learning_rate": adam["learning_rate"], "time/sample_s": trained - began,
              "time/train_s": time.perf_counter() - trained, "time/step_s": time.perf_counter() - began,
              "time/elapsed_s": time.perf_counter() - started, **staleness(loop.batch, t)}
    for hook in hooks:
        hook.after_step(loop, record, result)


def staleness(batch: Sequence[dict[str, Any]], step: int) -> dict[str, float]:
    """The version gaps of a step's rows: trained at ``step``, sampled with the weights of ``sampler_step``."""
    gaps = [step - int(r["sampler_step"]) for r in batch if "sampler_step" in r]
    if not gaps:
        return {}
    return {"staleness/mean": sum(gaps) / len(gaps), "staleness/max": float(max(gaps))}
