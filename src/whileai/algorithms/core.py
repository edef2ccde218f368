"""The shapes every ``build_loss`` shares, and the caller-side math they are made of.

    build_loss(sample, cycle, request, ctx) -> ForwardRequest

``sample`` is one cycle's graded completions (``Sample``: a ``Group`` per prompt), ``cycle`` its index,
``request`` what was asked of the sampler (``SampleRequest``: rollouts per prompt, sampling settings, the
weights version), and ``ctx`` the ``LossContext``: the trainer (a ``TrainingEngine`` in-process or a
service ``RunClient``: the same operations), the provider's advertised capabilities, the tokenizer, the
taskset, the algorithm's options, and a frozen teacher / reference run where the algorithm has one.
The answer is a ``ForwardRequest``: datums, a loss name the provider advertises, and its ``loss_fn_config``.

Shape suffixes: ``_G`` one per completion of a group, ``_T`` one per completion token.
Spec: 004 "More algorithms", the shared loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from whileai.errors import ConfigError
from whileai.knobs import Knob


# ----------------------------------------------------------------------------- what a cycle sampled
@dataclass(frozen=True)
class Completion:
    """One sampled completion, graded."""

    tokens: list[int]
    """the completion's token ids (prompt excluded)"""
    logprobs: list[float]
    """the sampler's log-probability of each token"""
    stop_reason: str
    """"stop" (an end token) or "length" (the cap)"""
    reward: float
    """the taskset grader's reward"""
    text: str
    """the decoded completion, special tokens removed (what the grader read)"""
    truncated: bool
    """cut by the cap when the cap is not the answer's own length (a taskset's fixed-length answer is not)"""


@dataclass(frozen=True)
class Group:
    """A prompt and its completions (the group of the group-relative algorithms)."""

    task: Any
    """the ``whileai.envs.Task`` the prompt came from"""
    prompt_tokens: list[int]
    """the rendered prompt's token ids"""
    completions: list[Completion]

    @property
    def rewards_G(self) -> np.ndarray:
        return np.asarray([c.reward for c in self.completions], dtype=np.float64)


@dataclass(frozen=True)
class SampleRequest:
    """What the sampler was asked for in this cycle (a resample asks the same again)."""

    num_samples: int
    """rollouts per prompt"""
    sampling_params: dict[str, Any]
    """``SamplingParams`` fields (``max_tokens``, ``temperature``, ``seed``)"""
    version: int
    """the weights version ``save_weights_for_sampler`` returned for this cycle"""
    cap_is_answer_length: bool = False
    """True when the taskset sets the cap, so reaching it is a complete answer, not a truncation"""


@dataclass(frozen=True)
class Sample:
    """One cycle's graded completions, a group per prompt."""

    groups: list[Group]
    version: int
    """the weights version that wrote them"""

    @property
    def rewards(self) -> np.ndarray:
        return np.concatenate([g.rewards_G for g in self.groups]) if self.groups else np.zeros(0)


@dataclass(frozen=True)
class ForwardRequest:
    """What ``build_loss`` asks the trainer to run: ``forward_backward(data, loss_fn, loss_fn_config)``."""

    data: list[dict[str, Any]]
    """datums (``whileai.engine.make_datum`` dicts); empty when nothing in the cycle carries a signal"""
    loss_fn: str
    """a loss name the provider advertises"""
    loss_fn_config: dict[str, Any] = field(default_factory=dict)
    """scalar loss settings, only keys the provider advertises for ``loss_fn``"""
    metrics: dict[str, float] = field(default_factory=dict)
    """caller-side numbers worth logging (mean advantage, resamples, KL, ...)"""
    notes: list[str] = field(default_factory=list)
    """plain sentences: what was dropped or resampled and why"""


# ----------------------------------------------------------------------------- options
class Options:
    """Base of every algorithm's options: frozen dataclasses whose fields are ``Knob``s, checked on creation."""

    def __post_init__(self) -> None:
        problems = []
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            knob: Knob = f.metadata["knob"]
            if (rule := knob.check(getattr(self, f.name))) is not None:
                problems.append(f"{type(self).__qualname__}.{f.name}={getattr(self, f.name)!r} must be {rule} "
                                f"(default {knob.value!r})")
        if problems:
            raise ConfigError("; ".join(problems))

    @classmethod
    def knobs(cls) -> dict[str, Knob]:
        return {f.name: f.metadata["knob"] for f in dataclasses.fields(cls)}  # type: ignore[arg-type]


@dataclass(frozen=True)
class NoOptions(Options):
    """No settings: the algorithm's objective is fixed."""


def option(knob: Knob) -> Any:
    """A dataclass field declared by its ``Knob`` (default, doc, rule, source): the one place it is set."""
    return field(default=knob.value, metadata={"knob": knob})


# ----------------------------------------------------------------------------- the context
@dataclass
class Teacher:
    """A frozen second run that answers log-probabilities of the student's tokens (never trained)."""

    run: Any
    """a trainer (``TrainingEngine`` or service ``RunClient``) nobody calls ``optim_step`` on"""

    def logprobs(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> list[list[float]]:
        """``log pi_teacher`` of each completion token after its prompt, in one ``forward`` call."""
        from whileai.engine.datums import make_datum

        out = self.run.forward([make_datum(p, c) for p, c in zip(prompts, completions)], "cross_entropy")
        return [np.asarray(o["logprobs"], dtype=np.float64)[-len(c):].tolist()
                for o, c in zip(out.loss_fn_outputs, completions)]


@dataclass
class LossContext:
    """Everything a ``build_loss`` may use besides the sample."""

    client: Any
    """the student's trainer: ``TrainingEngine`` or service ``RunClient`` (same operations)"""
    capabilities: Mapping[str, Any]
    """the provider's answer: ``{"provider": ..., "losses": {name: {inputs, optional_inputs, config}}}``"""
    tokenizer: Any
    taskset: Any
    """the ``whileai.envs.Taskset`` (its grader scores resamples)"""
    options: Any
    """the algorithm's ``Options``"""
    teacher: Teacher | None = None
    """the frozen teacher / reference run, for algorithms that have one"""

    @property
    def provider(self) -> str:
        return str(self.capabilities.get("provider", "unknown"))

    @property
    def losses(self) -> Mapping[str, Any]:
        return loss_table(self.capabilities)

    def sample_more(self, group: Group, n: int, request: SampleRequest, round_number: int) -> list[Completion]:
        """``n`` more graded completions of ``group``'s prompt from the same weights version: a real,
        ordered ``sample`` operation on the client (DAPO's resampling)."""
        params = {**request.sampling_params, "seed": int(request.sampling_params.get("seed") or 0) + 7919 * round_number}
        sequences = self.client.sample(group.prompt_tokens, n, params, version=request.version)
        return [grade(self, group.task, s, request) for s in sequences]

    def render(self, text: str) -> list[int]:
        """Token ids of a prompt written caller-side (a teacher's prompt), rendered as the taskset's are."""
        from whileai.envs import Task, render_prompt

        return render_prompt(self.tokenizer, Task("teacher", text))


def grade(ctx: LossContext, task: Any, sequence: Any, request: SampleRequest) -> Completion:
    """A sampled sequence as a graded ``Completion``."""
    text = ctx.tokenizer.decode(list(sequence.tokens), skip_special_tokens=True)
    truncated = sequence.stop_reason == "length" and not request.cap_is_answer_length
    return Completion(list(sequence.tokens), [float(x) for x in sequence.logprobs], str(sequence.stop_reason),
                      ctx.taskset.grade(task, text), text, bool(truncated))


# ----------------------------------------------------------------------------- capabilities
def loss_table(capabilities: Mapping[str, Any]) -> Mapping[str, Any]:
    """The per-loss table of a capabilities answer (its ``losses``)."""
    table = capabilities.get("losses")
    if not isinstance(table, Mapping):
        raise ConfigError("the provider's capabilities answer has no 'losses' table, so nothing can be checked "
                          "before work is sent; use a provider that advertises its losses")
    return table


def require_advertised_loss(ctx: LossContext, loss_fn: str, config_keys: Sequence[str] = ()) -> Mapping[str, Any]:
    """The provider's entry for ``loss_fn``, or a ``ConfigError`` before any work when it does not advertise
    the loss or one of ``config_keys`` (fail closed: never fall back to another loss). The check is the
    service client's (``whileai.service.require_advertised_loss``), read against the context's capabilities."""
    from whileai.service.client import require_advertised_loss as check

    loss_table(ctx.capabilities)
    return check(ctx.capabilities, loss_fn, dict.fromkeys(config_keys))


def clip_fields(ctx: LossContext, loss_fn: str, low: float | None, high: float | None,
                names: tuple[str, str] = ("clip_low_threshold", "clip_high_threshold"),
                ) -> tuple[dict[str, float], dict[str, float]]:
    """Where the clip thresholds go, as the provider advertises: ``(per_token, loss_fn_config)``.

    Scalar ``loss_fn_config`` keys when the loss's entry lists them under ``config`` (SkyRL / Modal, and
    ours); per-token ``loss_fn_inputs`` when it lists them under ``optional_inputs`` (Tinker Cloud); both
    unset (None) sends nothing, so the provider's own defaults apply. Anything else fails closed.
    """
    entry = require_advertised_loss(ctx, loss_fn)
    given = {n: v for n, v in zip(names, (low, high)) if v is not None}
    if not given:
        return {}, {}
    if all(n in entry.get("config", {}) for n in given):
        return {}, {n: float(v) for n, v in given.items()}
    if all(n in entry.get("optional_inputs", ()) for n in given):
        return {n: float(v) for n, v in given.items()}, {}
    raise ConfigError(f"provider {ctx.provider!r} takes {sorted(given)} for loss {loss_fn!r} neither as a config "
                      "key nor as a per-token input; leave the thresholds unset to run on the provider's defaults")


# ----------------------------------------------------------------------------- caller-side math
def group_mean_advantages(rewards: Any, normalize_std: bool = False, eps: float = 1e-6) -> np.ndarray:
    """``R - mean(R)`` over the group, divided by the group's std (+ eps) when ``normalize_std``."""
    rewards_G = np.asarray(rewards, dtype=np.float64)
    centred = rewards_G - rewards_G.mean()
    return centred / (rewards_G.std() + eps) if normalize_std else centred


def leave_one_out_baseline(rewards: Any) -> np.ndarray:
    """RLOO: ``R_i - mean_{j != i} R_j`` (0 for a group of one)."""
    rewards_G = np.asarray(rewards, dtype=np.float64)
    n = rewards_G.size
    if n < 2:
        return np.zeros(n)
    return rewards_G - (rewards_G.sum() - rewards_G) / (n - 1)


def rl_datum(prompt_tokens: Sequence[int], completion: Completion, advantages_T: Any,
             per_token: Mapping[str, float] | None = None) -> dict[str, Any]:
    """A ratio-loss datum: the sampler's ``logprobs`` and per-token ``advantages`` (a scalar is broadcast),
    plus per-token clip thresholds where the provider takes them that way. No ``weights``: a position is
    trained where its advantage is nonzero (prompt positions carry 0), as Tinker's RL losses read it."""
    from whileai.engine.datums import make_datum

    n = len(completion.tokens)
    advantages_T = np.broadcast_to(np.asarray(advantages_T, dtype=np.float64), (n,))
    extra = {name: [value] * n for name, value in (per_token or {}).items()}
    datum = make_datum(prompt_tokens, completion.tokens, logprobs=completion.logprobs,
                       advantages=advantages_T.tolist(), **extra)
    del datum["loss_fn_inputs"]["weights"]
    return datum


def group_datums(sample: Sample, advantages: Sequence[Any],
                 per_token: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """One datum per completion that carries a signal; ``advantages[g][i]`` is completion ``i`` of group
    ``g``'s advantage (a scalar or one per token). All-zero advantages send nothing (they train nothing)."""
    data = []
    for group, group_adv in zip(sample.groups, advantages):
        for completion, adv in zip(group.completions, group_adv):
            if np.any(np.asarray(adv) != 0):
                data.append(rl_datum(group.prompt_tokens, completion, adv, per_token))
    return data


def advantage_metrics(advantages: Sequence[Any]) -> dict[str, float]:
    """Mean |A| and the share of completions with a nonzero advantage (what a build_loss reports)."""
    flat = [np.asarray(a, dtype=np.float64) for group in advantages for a in group]
    if not flat:
        return {"mean_abs_advantage": 0.0, "signal_share": 0.0}
    return {"mean_abs_advantage": float(np.mean([np.abs(a).mean() for a in flat])),
            "signal_share": float(np.mean([np.any(a != 0) for a in flat]))}


def grouped_request(sample: Sample, advantages: list[Any], loss_fn: str, ctx: LossContext,
                    clip: tuple[float | None, float | None] = (None, None),
                    config: Mapping[str, Any] | None = None) -> ForwardRequest:
    """The common tail of the ratio-loss algorithms: check the loss is advertised, place the clip
    thresholds as the provider takes them, build the datums."""
    per_token, loss_config = clip_fields(ctx, loss_fn, *clip)
    loss_config.update({k: v for k, v in (config or {}).items() if v is not None})
    require_advertised_loss(ctx, loss_fn, list(loss_config))
    return ForwardRequest(group_datums(sample, advantages, per_token), loss_fn, loss_config,
                          advantage_metrics(advantages))
