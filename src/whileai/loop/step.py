"""The one training step, written only with the trainer's public operations (``whileai.trainers``).

    score rows (forward, no grad) -> method.update(whole batch) -> forward_backward -> optim_step
                                                         (+ the critic's own steps where the method has one)

The run spec's ``loss`` picks the engine loss: ``cross_entropy`` sends ``Update.coefficients`` as the
weights (every normalizer lives inside ``c``); any other named loss (ppo, cispo, gspo, ...) sends
``Update.advantages`` per token with the rows' ``behavior_logprobs`` and the run spec's ``loss_config``, and
the trainer computes the live ratio inside its graph. The trainer sums and accumulates over its
micro-batches, so peak memory is set by the micro-batch and splitting a batch never changes a gradient.
Every row is scored under the distribution it was sampled from (the run's temperature, or a logged trace's
own ``sampling``). Nothing here reads a method's attributes or name: only ``run_spec()`` and ``update()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
from numpy.typing import ArrayLike

from whileai.errors import BatchError, ConfigError
from whileai.knobs import SCORED_FIELDS
from whileai.loop.types import Adam, Scoring
from whileai.methods.run_spec import RunSpec

if TYPE_CHECKING:
    import torch

    from whileai.methods.base import Method, Update
    from whileai.trainers import Trainer

T = TypeVar("T")
MethodState = Mapping[str, Any] | None
"""a stateful method's state before an update (``Method.initial_state()``, then ``Update.state``)"""


class TeacherFill(Protocol):
    """What a step asks of a run's teacher: fill its fields on rows scored under one distribution."""

    def fill(self, rows: list[dict[str, Any]], sampling_params: Scoring) -> None: ...


# Fields a loop keeps on its rows for itself; the method sees everything else. ``sampling``: the settings a
# logged trace was sampled with (``whileai.loop.sources.trace_formats``), the distribution its tokens are scored under.
BOOKKEEPING = ("prompt_tokens", "prompt", "completion", "sampler_step", "weights_version", "sampling")
SCORED = SCORED_FIELDS  # the settings that shape the distribution a token is scored under (one declaration)
# A logged token that a trace's top-k / top-p no longer keeps under the current weights has probability 0 (log
# -inf). It is scored as this finite floor instead: its ratio underflows to exactly 0, so a ratio-weighted
# coefficient there is 0 and the token is left out of the backward; a method that still weights it gets the
# engine's error naming the token.
REMOVED_LOGPROB = -1e4


@dataclass
class StepResult:
    """What a step did: the method's Update, the new method state, and plain-number metrics."""

    update: Update
    state: dict[str, Any] | None
    metrics: dict[str, float] = field(default_factory=dict)


def datum(row: Mapping[str, Any], **completion_fields: Sequence[float]) -> dict[str, Any]:
    """A row's prompt + completion as a datum (position i predicts token i + 1)."""
    from whileai.engine.datums import make_datum

    return make_datum(row["prompt_tokens"], row["tokens"], **completion_fields)


def value_datum(row: Mapping[str, Any], values: Sequence[float], returns: Sequence[float]) -> dict[str, Any]:
    """A datum for the value loss: old values and regression targets on the completion's positions."""
    out = datum(row, values=values, returns=returns)
    del out["loss_fn_inputs"]["target_tokens"]  # a value loss reads no targets
    return out


def completions(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """Each row's completion length: the last positions whose log-probabilities a scoring forward asks for (the
    prompt's positions are not projected through the output layer)."""
    return [len(r["tokens"]) for r in rows]


def completion_part(values: ArrayLike, n: int) -> list[float]:
    """The last ``n`` positions of a per-position output: the completion's tokens."""
    return np.asarray(values, dtype=np.float64)[-n:].tolist()


def by_distribution(rows: Sequence[Mapping[str, Any]], sampling_params: Scoring) -> list[tuple[Scoring, list[int]]]:
    """The rows grouped by the distribution their tokens are scored under, as ``(sampling_params, indices)``
    in order of first appearance. A row's own ``sampling`` (the temperature / top_p / top_k a logged trace
    was sampled with; a null one is not stated) replaces the run's ``sampling_params`` for that row."""
    if not any(r.get("sampling") for r in rows):
        return [(sampling_params, list(range(len(rows))))]
    groups: dict[tuple[float, float, int], tuple[Scoring, list[int]]] = {}
    for i, row in enumerate(rows):
        own = {k: v for k, v in (row.get("sampling") or {}).items() if k in SCORED and v is not None}
        params = _with_own(sampling_params, own) if own else sampling_params
        groups.setdefault(_distribution_key(params), (params, []))[1].append(i)
    return list(groups.values())


def per_distribution(rows: Sequence[Mapping[str, Any]], sampling_params: Scoring,
                     call: Callable[[list[Mapping[str, Any]], Scoring], Sequence[T]]) -> list[T]:
    """``call(group_rows, group_sampling_params)`` once per group of ``by_distribution`` (one list of
    per-row results each), the results put back in row order."""
    out: dict[int, T] = {}
    for params, indices in by_distribution(rows, sampling_params):
        for i, value in zip(indices, call([rows[i] for i in indices], params)):
            out[i] = value
    return [out[i] for i in range(len(rows))]


def _with_own(sampling_params: Scoring, own: Mapping[str, Any]) -> Scoring:
    """The run's settings with a trace's own in their place: the engine's ``SamplingParams`` stays one (the loop's
    one sampling-parameters type); the dict form (a caller's, the wire's) stays a dict."""
    from whileai.engine.sampling import SamplingParams

    if isinstance(sampling_params, SamplingParams):
        return dataclasses.replace(sampling_params, **own)
    return {**_settings(sampling_params), **own}


def _settings(sampling_params: Scoring) -> dict[str, Any]:
    """Sampling settings as a dict of ``SamplingParams`` fields (None: the model's own distribution, {})."""
    if sampling_params is None:
        return {}
    if isinstance(sampling_params, Mapping):
        return dict(sampling_params)
    return {k: getattr(sampling_params, k) for k in ("max_tokens", *SCORED)}


def _distribution_key(sampling_params: Scoring) -> tuple[float, float, int]:
    """What tells two distributions apart: (temperature, top_p, top_k), unstated ones at their defaults."""
    from whileai.engine.sampling import SAMPLING_KNOBS

    given = {k: v for k, v in _settings(sampling_params).items() if v is not None}
    top_k = int(given.get("top_k", SAMPLING_KNOBS["top_k"].value))
    return (float(given.get("temperature", SAMPLING_KNOBS["temperature"].value)),
            float(given.get("top_p", SAMPLING_KNOBS["top_p"].value)), 0 if top_k == -1 else top_k)


def plain() -> dict[str, Any]:
    """The model's own distribution (the engine's sampling defaults: temperature 1, no top-p, no top-k)."""
    from whileai.engine.sampling import SAMPLING_KNOBS

    return {k: SAMPLING_KNOBS[k].value for k in SCORED}


def sent(sampling_params: Scoring) -> Scoring:
    """What the trainer is given to score under: None for the model's own distribution (a backend that scores
    only that one, Tinker's, takes every such call), else the settings."""
    return None if _distribution_key(sampling_params) == _distribution_key(None) else sampling_params


def _truncates(sampling_params: Scoring) -> bool:
    """Whether the distribution has top-k or top-p (then a logged token can have probability 0)."""
    _, top_p, top_k = _distribution_key(sampling_params)
    return top_p < 1.0 or top_k > 0


def score(trainer: Trainer, rows: Sequence[Mapping[str, Any]], *, sampling_params: Scoring = None,
          reference: bool = False) -> list[list[float]]:
    """Each row's completion log-probabilities under the current (or reference) policy: one call per
    distribution the rows are scored under (``by_distribution``; one call when no row has ``sampling``)."""
    def one(group: list[Mapping[str, Any]], params: Scoring) -> list[list[float]]:
        # weights 0: the forward returns every position's log-probability, -inf (truncated away) included
        out = trainer.forward([datum(r, weights=[0.0] * len(r["tokens"])) for r in group], "cross_entropy",
                              sampling_params=sent(params), reference=reference, logprobs_for=completions(group))
        return [np.maximum(completion_part(o["logprobs"], len(r["tokens"])), REMOVED_LOGPROB).tolist()
                for o, r in zip(out.loss_fn_outputs, group)]

    return per_distribution(rows, sampling_params, one)


def critic_values(trainer: Trainer, rows: Sequence[Mapping[str, Any]]) -> list[list[float]]:
    """The value head's prediction at every completion token (a value loss's forward returns them; the prompt's
    positions are not computed)."""
    data = [value_datum(r, [0.0] * len(r["tokens"]), [0.0] * len(r["tokens"])) for r in rows]
    out = trainer.forward(data, "ppo_critic", {"value_clip": None}, logprobs_for=completions(rows))
    return [completion_part(o["values"], len(r["tokens"])) for o, r in zip(out.loss_fn_outputs, rows)]


def topk_datum(row: Mapping[str, Any], slots: ArrayLike, **completion_fields: ArrayLike) -> dict[str, Any]:
    """A datum whose completion positions target K tokens each (``slots``, (T, K)); the prompt positions
    target their next token K times, with weight 0 (``completion_fields`` are (T, K) too)."""
    slots_TK = np.asarray(slots, dtype=np.int64)
    full = list(row["prompt_tokens"]) + list(row["tokens"])
    prompt_targets = np.repeat(np.asarray(full[1:len(row["prompt_tokens"])], dtype=np.int64)[:, None],
                               slots_TK.shape[1], axis=1)
    inputs: dict[str, Any] = {"target_tokens": np.concatenate([prompt_targets, slots_TK]).tolist()}
    fields = {"weights": np.ones(slots_TK.shape), **completion_fields}
    for name, values in fields.items():
        inputs[name] = np.concatenate([np.zeros(prompt_targets.shape), np.asarray(values, dtype=np.float64)]).tolist()
    return {"model_input": full[:-1], "loss_fn_inputs": inputs}


def student_topk(trainer: Trainer, rows: Sequence[Mapping[str, Any]], sampling_params: Scoring) -> list[list[list[float]]]:
    """The policy's log-probabilities of each row's ``teacher_topk_tokens`` (T, K), one call per distribution."""
    def one(group: list[Mapping[str, Any]], params: Scoring) -> list[list[list[float]]]:
        out = trainer.forward([topk_datum(r, r["teacher_topk_tokens"]) for r in group], "cross_entropy",
                              sampling_params=sent(params), logprobs_for=completions(group))
        return [np.asarray(o["logprobs"], dtype=np.float64)[-len(r["tokens"]):].tolist()
                for o, r in zip(out.loss_fn_outputs, group)]

    return per_distribution(rows, sampling_params, one)


def fill(trainer: Trainer, rows: list[dict[str, Any]], needs: Sequence[str], sampling_params: Scoring) -> None:
    """Fill the per-token fields the method's run spec asks for, where a row lacks them (a teacher's fields
    come from the run's teacher, before this: ``policy_step(..., teacher=)``)."""
    missing = [n for n in needs if any(FILLED_AS.get(n, n) not in r for r in rows)]
    for name in missing:
        if name == "values":
            filled: Sequence[object] = critic_values(trainer, rows)
        elif name == "ref_logprobs":
            filled = score(trainer, rows, sampling_params=sampling_params, reference=True)
        elif name == "teacher_topk" and all("teacher_topk_tokens" in r for r in rows):
            filled = student_topk(trainer, rows, sampling_params)
        else:
            raise ConfigError(f"the method needs {name!r} on every row and this loop has no source for it: give "
                              f"rows that carry {name!r} (a teacher's scores), or a teacher (wai train --teacher), "
                              "or pick a method that does not need it")
        for row, values in zip(rows, filled):
            row.setdefault(FILLED_AS.get(name, name), values)


# A need whose last filled field has another name: the student's side of the teacher's top-k slots.
FILLED_AS = {"teacher_topk": "topk_logprobs"}


def single_pass_budget(spec: RunSpec, tokens: int) -> int:
    """The token budget of a run's single-pass steps, chosen once per run from the method's run spec (0: every
    step scores first, then trains). Only the kernel on the sampled tokens takes the single pass: a named loss
    computes its ratio in the engine, and a teacher's top-k form trains other slots than it scored."""
    return tokens if spec.loss == "cross_entropy" and "teacher_topk" not in spec.needs else 0


def policy_step(trainer: Trainer, method: Method, rows: Sequence[Mapping[str, Any]], *, adam: Adam, state: MethodState = None,
                sampling_params: Scoring = None, rescore: bool = True, train_policy: bool = True,
                critic_steps: int = 0, single_pass_tokens: int = 0, teacher: TeacherFill | None = None) -> StepResult:
    """One step: (teacher,) score, update, weighted cross-entropy, critic steps, optimizer step.

    ``rescore=False`` skips the scoring forward when its answer is known: on-policy rows whose sampler
    log-probabilities (``behavior_logprobs``) are the policy's at the same temperature and truncation.
    ``train_policy=False`` (a critic warm-up) computes the update and trains only the critic.
    ``single_pass_tokens``: the run's ``single_pass_budget``; a batch that fits in it, under one distribution
    that truncates nothing, is scored and trained in one forward (``forward_backward_custom``); otherwise
    scored, then ``forward_backward`` in micro-batches.
    ``teacher``: fills the teacher's fields on the rows first (``whileai.loop.hooks.teacher.RunTeacher``).
    Rows with their own ``sampling`` (logged traces) are scored and trained under it, one trainer call per
    distribution (``by_distribution``).
    """
    work = [dict(r) for r in rows]
    spec = method.run_spec()
    budget = single_pass_budget(spec, single_pass_tokens)
    groups = by_distribution(work, sampling_params)
    if teacher is not None:  # first: the teacher reads no student score
        for params, indices in groups:
            teacher.fill([work[i] for i in indices], params)
    # the single pass trains every sampled token of the one distribution it scored (none is -inf there)
    if budget and rescore and train_policy and len(groups) == 1 and not _truncates(groups[0][0]) \
            and fits(work, budget):
        update, metrics = _single_pass(trainer, method, work, state, groups[0][0], spec.needs)
    else:
        _policy_logprobs(trainer, work, rescore, sampling_params)
        update = _update(trainer, method, work, state, spec.needs, sampling_params)
        metrics = _policy_backward(trainer, spec, update, work, groups) if train_policy else {}
    return _finish(trainer, update, work, adam, critic_steps, metrics)


def _policy_logprobs(trainer: Trainer, work: list[dict[str, Any]], rescore: bool, sampling_params: Scoring) -> None:
    """Each row's ``logprobs``: scored by the trainer, or (``rescore=False``) the sampler's own numbers."""
    if rescore:
        for row, logprobs in zip(work, score(trainer, work, sampling_params=sampling_params)):
            row["logprobs"] = logprobs
        return
    for i, row in enumerate(work):
        if "behavior_logprobs" not in row:
            raise BatchError(f"row {i}: rescore=False needs the sampler's 'behavior_logprobs' to stand in for "
                             "the policy's; score the rows instead")
        row["logprobs"] = list(row["behavior_logprobs"])


def _update(trainer: Trainer, method: Method, work: list[dict[str, Any]], state: MethodState, needs: Sequence[str],
            sampling_params: Scoring) -> Update:
    """The one update call: the fields the run spec needs filled, the loop's bookkeeping left out, the state
    passed where the method carries one."""
    fill(trainer, work, needs, sampling_params)
    for_method = [{k: v for k, v in r.items() if k not in BOOKKEEPING} for r in work]
    return method.update(for_method, state=state) if state is not None else method.update(for_method)


def _policy_backward(trainer: Trainer, spec: RunSpec, update: Update, work: list[dict[str, Any]],
                     groups: list[tuple[Scoring, list[int]]]) -> dict[str, float]:
    """The policy's gradient, one call per distribution (each log pi differentiated is the one scored): the
    coefficients as the kernel's weights, or the advantages through the run spec's named loss."""
    metrics: dict[str, float] = {}  # no loss key when nothing was trained (every coefficient 0)
    for params, indices in groups:
        if spec.loss == "cross_entropy":
            data = [kernel_datum(work[i], update.coefficients[i]) for i in indices if np.any(update.coefficients[i])]
        else:
            data = [loss_datum(work[i], update.advantages[i], i) for i in indices if update.admitted[i]]
        if data:
            out = trainer.forward_backward(data, spec.loss, dict(spec.loss_config) or None,
                                           sampling_params=sent(params), logprobs_for="scored")
            metrics["loss"] = metrics.get("loss", 0.0) + float(out.metrics.get("loss:sum", 0.0))
    return metrics


def loss_datum(row: Mapping[str, Any], advantages: ArrayLike, index: int) -> dict[str, Any]:
    """A named loss's datum: per-token advantages, the sampler's log-probabilities, the action mask as weights."""
    if "behavior_logprobs" not in row:
        raise BatchError(f"row {index}: the method runs a named engine loss, which needs the sampler's "
                         "'behavior_logprobs' on every row (the ratio's denominator); give rows that carry them")
    fields: dict[str, Any] = {"advantages": np.asarray(advantages, dtype=np.float64).tolist(),
                              "logprobs": list(map(float, row["behavior_logprobs"]))}
    if "action_mask" in row:
        fields["weights"] = np.asarray(row["action_mask"], dtype=np.float64).tolist()
    return datum(row, **fields)


def train_step(trainer: Trainer, method: Method, rows: Sequence[Mapping[str, Any]], *, adam: Adam, state: MethodState = None,
               sampling_params: Scoring = None, rescore: bool = True, train_policy: bool = True,
               single_pass_tokens: int = 0, teacher: TeacherFill | None = None) -> StepResult:
    """The step every entry point runs: a scalar head's (``run_spec().head == 'score'``) or the policy's, with
    the critic's steps from the run spec. ``sampling_params``: the distribution the rows were sampled from."""
    spec = method.run_spec()
    if spec.head == "score":
        return score_head_step(trainer, method, rows, adam=adam)
    return policy_step(trainer, method, rows, adam=adam, state=state, sampling_params=sampling_params,
                       rescore=rescore, critic_steps=spec.critic.steps if spec.critic is not None else 0,
                       train_policy=train_policy, single_pass_tokens=single_pass_tokens, teacher=teacher)


def kernel_datum(row: Mapping[str, Any], coefficients: ArrayLike) -> dict[str, Any]:
    """The kernel's datum: weights c on the sampled tokens, or (T, K) weights on the teacher's top-k slots."""
    c = np.asarray(coefficients, dtype=np.float64)
    if c.ndim == 2:
        return topk_datum(row, row["teacher_topk_tokens"], weights=c)
    return datum(row, weights=c.tolist())


def fits(rows: Sequence[Mapping[str, Any]], single_pass_tokens: int) -> bool:
    """Whether the batch, padded to its longest row, fits in one forward of ``single_pass_tokens``."""
    longest = max(len(r["prompt_tokens"]) + len(r["tokens"]) for r in rows)
    return longest * len(rows) <= single_pass_tokens


def _single_pass(trainer: Trainer, method: Method, work: list[dict[str, Any]], state: MethodState,
                 sampling_params: Scoring,
                 needs: Sequence[str]) -> tuple[Update, dict[str, float]]:
    """Score and train in one forward: the log-probabilities (detached) go to the update, whose coefficients
    weight the same tensors for the backward. Equal to score-then-forward_backward, one forward cheaper."""
    import torch

    holder: dict[str, Update] = {}

    def loss_fn(data: Sequence[Mapping[str, object]], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        for row, lp in zip(work, logprobs):
            row["logprobs"] = lp.detach().cpu().tolist()
        update = holder["update"] = _update(trainer, method, work, state, needs, sampling_params)
        loss = sum((torch.as_tensor(np.asarray(c, dtype=np.float64), device=lp.device) * lp).sum() * -1.0
                   for c, lp in zip(update.coefficients, logprobs))
        return loss, {}

    out = trainer.forward_backward_custom([datum(r) for r in work], loss_fn, sampling_params=sent(sampling_params),
                                          logprobs_for="scored")
    return holder["update"], {"loss": float(out.metrics["loss:sum"])}


def _finish(trainer: Trainer, update: Update, work: list[dict[str, Any]], adam: Adam, critic_steps: int,
            metrics: dict[str, float]) -> StepResult:
    """The critic's steps and the optimizer step, after the policy's gradient is in."""
    targets = update.value_targets
    if targets is not None and critic_steps > 0:
        metrics["critic_loss"] = _critic_backward(trainer, work, targets)
    optim = trainer.optim_step(adam)
    metrics["grad_norm"] = float(optim.grad_norm)
    for _ in range(max(critic_steps - 1, 0) if targets is not None else 0):
        _critic_backward(trainer, work, targets or [])
        trainer.optim_step(adam)  # only the critic has gradients: the policy's weights do not move
    metrics.update(step_stats(update, work))
    return StepResult(update, update.state, metrics)


def score_head_step(trainer: Trainer, method: Method, rows: Sequence[Mapping[str, Any]], *, adam: Adam) -> StepResult:
    """One step of a method that trains a scalar head (``run_spec().head == "score"``, a reward model).

    The head (the trainer's value head) reads each row's last position; its output there is the row's
    ``score``. The method's coefficient c sits on that position and the loss is ``-sum c * score``, whose
    gradient in the score is -c: a value loss 1/2 (V - R)^2 with R = V + c at that position (weight 1) and
    weight 0 elsewhere has exactly that gradient, so the head trains through the trainer's value loss.
    """
    work = [dict(r) for r in rows]
    values = critic_values(trainer, work)
    for row, v in zip(work, values):
        row["score"] = float(v[-1])
        row.setdefault("logprobs", [0.0] * len(row["tokens"]))  # unread by a score head; the batch contract wants them
    update = _update(trainer, method, work, None, (), None)
    data = []
    for row, v, c in zip(work, values, update.coefficients):
        c = np.asarray(c, dtype=np.float64)
        out = value_datum(row, v, (np.asarray(v) + c).tolist())
        out["loss_fn_inputs"]["weights"] = [0.0] * (len(row["prompt_tokens"]) - 1) + (c != 0).astype(float).tolist()
        data.append(out)
    loss = trainer.forward_backward(data, "ppo_critic", {"value_clip": None})
    optim = trainer.optim_step(adam)
    metrics = {"loss": float(loss.metrics.get("loss:sum", 0.0)), "grad_norm": float(optim.grad_norm)}
    metrics.update(step_stats(update, work))
    return StepResult(update, None, metrics)


def _critic_backward(trainer: Trainer, rows: Sequence[Mapping[str, Any]], targets: Sequence[ArrayLike]) -> float:
    """Accumulate the value head's gradient: 1/2 (V - target)^2 summed over the action tokens (the methods
    reference: the critic trains toward R at every action token; a tool's tokens are not fitted)."""
    data = []
    for row, target in zip(rows, targets):
        out = value_datum(row, row["values"], np.asarray(target, dtype=np.float64).tolist())
        if "action_mask" in row:
            mask = np.asarray(row["action_mask"], dtype=np.float64)
            out["loss_fn_inputs"]["weights"] = [0.0] * (len(row["prompt_tokens"]) - 1) + mask.tolist()
        data.append(out)
    result = trainer.forward_backward(data, "ppo_critic", {"value_clip": None})
    tokens = max(float(result.metrics.get("num_tokens:sum", 1.0)), 1.0)
    return float(result.metrics.get("loss:sum", 0.0)) / tokens


def step_stats(update: Update, rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Rows trained on (more than rollouts_per_step when a method samples more rounds), reward, pass rate,
    admitted share, ratio and drift of one step, as flat numbers."""
    rewards = np.asarray([float(r["reward"]) for r in rows])
    stats = {"rollouts": float(len(rows)), "reward": float(rewards.mean()),
             "pass_rate": float(np.mean(rewards >= 1.0)),
             "admitted_share": float(np.mean(update.admitted)) if len(update.admitted) else 0.0}
    for key, value in update.stats.items():
        if isinstance(value, (int, float)) and np.isfinite(value):
            stats[f"method/{key}"] = float(value)
    stats["mean_ratio"] = float(update.stats.get("mean_ratio", 1.0))
    stats.update(_reply_lengths(rows, rewards))
    # the method's own drift measure when it has one (FlashReinforce's Bernoulli KL), else the k3 estimate
    stats["drift"] = float(update.drift if update.drift is not None else _drift(rows))
    if (gap := _ratio_gap(rows)) is not None:
        stats["ratio_gap_max"] = gap
    return stats


def _ratio_gap(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The largest |pi / mu - 1| over the sampled tokens of the step: the trainer's probability of a token against
    the sampler's (0 when a row is on-policy and its sampler is the trainer's own numbers). None without both."""
    worst = None
    for row in rows:
        if "behavior_logprobs" not in row or "logprobs" not in row:
            continue
        log_ratio = np.asarray(row["logprobs"], dtype=np.float64) - np.asarray(row["behavior_logprobs"], dtype=np.float64)
        log_ratio = log_ratio[np.asarray(row.get("action_mask", [True] * log_ratio.size), dtype=bool)]
        if log_ratio.size:
            worst = max(worst or 0.0, float(np.max(np.abs(np.expm1(log_ratio)))))
    return worst


def _reply_lengths(rows: Sequence[Mapping[str, Any]], rewards: np.ndarray) -> dict[str, float]:
    """Mean action tokens per trajectory, over every row and over the rows that did not pass (a length weight's
    bias shows in the second: 1/T_i spreads a failed reply's penalty thinner the longer it runs)."""
    if not rows or any("tokens" not in r for r in rows):
        return {}
    tokens = np.asarray([int(np.sum(r["action_mask"])) if "action_mask" in r else len(r["tokens"]) for r in rows],
                        dtype=np.float64)
    out = {"reply_tokens": float(tokens.mean())}
    failed = rewards < 1.0
    if failed.any():
        out["failed_reply_tokens"] = float(tokens[failed].mean())
    return out


def _drift(rows: Sequence[Mapping[str, Any]]) -> float:
    """Mean per-token KL estimate between sampler and policy on the sampled tokens (k3), 0 when on-policy.
    Action tokens only: the environment's tokens were not sampled (their behavior log-probability is 0.0)."""
    total, count = 0.0, 0
    for row in rows:
        if "behavior_logprobs" not in row:
            continue
        log_ratio = np.asarray(row["logprobs"]) - np.asarray(row["behavior_logprobs"])
        log_ratio = log_ratio[np.asarray(row.get("action_mask", [True] * log_ratio.size), dtype=bool)]
        total += float(np.sum(np.expm1(log_ratio) - log_ratio))
        count += log_ratio.size
    return total / count if count else 0.0
