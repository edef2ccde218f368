"""The kernel and the named losses, as plain per-token tensor functions.

Every loss has one signature, ``fn(x, inputs, config) -> per-token loss`` for one datum:

- ``x``: the learner's log-probabilities of the targets at the scored positions, float64, shape
  ``(P,)`` or ``(P, K)``, differentiable (for ``ppo_critic``: the critic's values, ``(P,)``);
- ``inputs``: the datum's ``loss_fn_inputs`` at the same positions, float64 tensors;
- ``config``: the validated ``loss_fn_config`` with defaults filled in.

The total is the plain sum of the per-token losses over positions, slots and datums: no mean
anywhere (reference/tinker.md 2.1). Notation: ``p`` learner, ``q`` sampler (``inputs["logprobs"]``),
``A`` advantages, ``r = exp(log p - log q)``, ``sg`` stop-gradient. ``weights``, when given to a
loss other than ``cross_entropy``, multiply its per-token loss (0 masks a position).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from whileai.errors import ConfigError
from whileai.knobs import Check, Knob, number, one_of, optional

LossFn = Callable[[Tensor, Mapping[str, Tensor], Mapping[str, Any]], Tensor]


def cross_entropy(logp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]) -> Tensor:
    """The kernel: ``-w * log p(y)``, any float weights, (N) or (N, K) targets."""
    return -(inputs["weights"] * logp)


def _ratio(logp: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
    return torch.exp(logp - inputs["logprobs"])


def _bounds(inputs: Mapping[str, Tensor], config: Mapping[str, Any]) -> tuple[Any, Any]:
    """Absolute ratio bounds; per-token ``loss_fn_inputs`` of the same name override the config."""
    low = inputs.get("clip_low_threshold", config["clip_low_threshold"])
    high = inputs.get("clip_high_threshold", config["clip_high_threshold"])
    return low, high


def _clip(value: Tensor, low: Any, high: Any) -> Tensor:
    low_t = torch.as_tensor(low, dtype=value.dtype, device=value.device)
    high_t = torch.as_tensor(high, dtype=value.dtype, device=value.device)
    return torch.minimum(torch.maximum(value, low_t), high_t)


def importance_sampling(logp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]) -> Tensor:
    """``-r * A``, r unclipped."""
    return -(_ratio(logp, inputs) * inputs["advantages"])


def ppo(logp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]) -> Tensor:
    """``-min(r * A, clip(r, lo, hi) * A)``."""
    ratio, adv = _ratio(logp, inputs), inputs["advantages"]
    clipped_ratio = _clip(ratio, *_bounds(inputs, config))
    return -torch.minimum(ratio * adv, clipped_ratio * adv)


def cispo(logp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]) -> Tensor:
    """``-sg(clip(r, lo, hi)) * log p * A``."""
    clipped_ratio = _clip(_ratio(logp, inputs), *_bounds(inputs, config)).detach()
    return -(clipped_ratio * logp * inputs["advantages"])


def dro(logp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]) -> Tensor:
    """``-(log p * A - beta/2 * (log p - log q)^2)``."""
    return -(logp * inputs["advantages"] - 0.5 * config["beta"] * (logp - inputs["logprobs"]) ** 2)


def gspo(logp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]) -> Tensor:
    """GSPO-token: ``log s = mean_t(log p - log q)`` over the datum's scored positions (its completion, or
    where ``weights`` are nonzero: SkyRL's and verl's loss mask, zero-advantage tokens included);
    ``log s_t = log p - sg(log p) + sg(log s)`` capped at 10; ``-min(s_t A, clip(s_t, lo, hi) A)``."""
    log_seq_ratio = (logp - inputs["logprobs"]).mean()
    log_token_ratio = torch.clamp(logp - logp.detach() + log_seq_ratio.detach(), max=10.0)
    ratio, adv = torch.exp(log_token_ratio), inputs["advantages"]
    return -torch.minimum(ratio * adv, _clip(ratio, *_bounds(inputs, config)) * adv)


def dppo_kept(logp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]) -> Tensor:
    """DPPO's binary trust-region mask (no gradient): false where the token left the region."""
    with torch.no_grad():
        logq, adv = inputs["logprobs"], inputs["advantages"]
        pi, mu = torch.exp(logp), torch.exp(logq)
        low, high = config["delta_low"], config["delta_high"]
        if config["dppo_type"] == "binary_tv":
            dropped = ((adv > 0) & (pi - mu > high)) | ((adv < 0) & (mu - pi > low))
        else:  # binary_kl: the binary (token vs. rest) KL(mu || pi)
            div = mu * (logq - logp) + (1 - mu) * torch.log((1 - mu + 1e-8) / (1 - pi + 1e-8))
            dropped = ((adv > 0) & (pi > mu) & (div > high)) | ((adv < 0) & (pi < mu) & (div > low))
        return ~dropped


def dppo(logp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]) -> Tensor:
    """``-r * A * m`` with ``m`` the binary mask of ``dppo_kept``."""
    kept = dppo_kept(logp, inputs, config).to(logp.dtype)
    return -(_ratio(logp, inputs) * inputs["advantages"] * kept)


def sapo(logp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]) -> Tensor:
    """``-f(r; tau) * A``, ``f = sigmoid(tau (r - 1)) * 4 / tau``, tau = tau_pos if A > 0 else tau_neg,
    log r clamped to [-20, 20]."""
    adv = inputs["advantages"]
    ratio = torch.exp(torch.clamp(logp - inputs["logprobs"], -20.0, 20.0))
    tau = torch.where(adv > 0, torch.as_tensor(float(config["tau_pos"]), dtype=logp.dtype, device=logp.device),
                      torch.as_tensor(float(config["tau_neg"]), dtype=logp.dtype, device=logp.device))
    return -(torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv)


def ppo_critic(values: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]) -> Tensor:
    """``1/2 max((V_clip - R)^2, (V - R)^2)``, ``V_clip = V_old + clip(V - V_old, -c, c)``; no clip
    when ``value_clip`` is None. ``V`` is the critic's prediction, ``V_old = inputs["values"]``."""
    old, returns = inputs["values"], inputs["returns"]
    clip = config["value_clip"]
    clipped = values if clip is None else old + torch.clamp(values - old, -clip, clip)
    return 0.5 * torch.maximum((clipped - returns) ** 2, (values - returns) ** 2)


# ----------------------------------------------------------------------------- registry
def choice(*options: str) -> Check:
    """One of ``options``; the check carries them as ``.choices`` for the capabilities answer."""
    check = one_of(*options)
    check.choices = options  # type: ignore[attr-defined]  # read by capabilities()
    return check


def _choices(check: Check) -> dict[str, list[str]]:
    options = getattr(check, "choices", None)
    return {} if options is None else {"choices": list(options)}


def describe(check: Check) -> str:
    """The rule a check enforces, in words (what it answers for a value that is nothing at all)."""
    return check(_NOTHING) or check.__doc__ or "any value"


_NOTHING = object()


CLIP_LOW = "absolute lower bound on the ratio (not an epsilon)"
CLIP_HIGH = "absolute upper bound on the ratio (not an epsilon)"


@dataclass(frozen=True)
class LossSpec:
    """A named loss: its function, the ``loss_fn_inputs`` it needs, its config keys, its source."""

    name: str
    fn: LossFn
    formula: str
    inputs: tuple[str, ...]
    keys: dict[str, Knob]
    source: str
    optional_inputs: tuple[str, ...] = ("weights",)
    scores: str = "advantages"  # which positions are scored when no weights are given; see scored()
    on_values: bool = False  # takes the critic's values instead of log-probabilities

    @property
    def defaults(self) -> dict[str, Any]:
        return {name: key.value for name, key in self.keys.items()}


_PER_TOKEN_CLIP = ("weights", "clip_low_threshold", "clip_high_threshold")


def _clip_keys(low: float, high: float, source: str) -> dict[str, Knob]:
    return {"clip_low_threshold": Knob(low, CLIP_LOW, number(0.0), source),
            "clip_high_threshold": Knob(high, CLIP_HIGH, number(0.0), source)}


TINKER_TUTORIAL = "Tinker tutorial 202"
SKYRL = "SkyRL"


LOSSES: dict[str, LossSpec] = {spec.name: spec for spec in (
    LossSpec("cross_entropy", cross_entropy, "-w * log p", ("target_tokens", "weights"), {},
             "Tinker losses.mdx: the supervised kernel; any float weights, (N) or (N, K) targets",
             optional_inputs=(), scores="weights"),
    LossSpec("importance_sampling", importance_sampling, "-r * A",
             ("target_tokens", "logprobs", "advantages"), {},
             "Tinker losses.mdx: REINFORCE with an unclipped importance ratio"),
    LossSpec("ppo", ppo, "-min(r A, clip(r, lo, hi) A)", ("target_tokens", "logprobs", "advantages"),
             _clip_keys(0.8, 1.2, f"{TINKER_TUTORIAL} (PPO, Schulman et al. 2017)"),
             "Schulman et al. 2017; Tinker tutorial 202 defaults 0.8 / 1.2",
             optional_inputs=_PER_TOKEN_CLIP),
    LossSpec("cispo", cispo, "-sg(clip(r, lo, hi)) * log p * A", ("target_tokens", "logprobs", "advantages"),
             _clip_keys(0.0, 4.0, f"{TINKER_TUTORIAL}, one-sided (CISPO, MiniMax-M1, arXiv 2506.13585)"),
             "MiniMax-M1 (arXiv 2506.13585); Tinker tutorial 202 one-sided 0.0 / 4.0",
             optional_inputs=_PER_TOKEN_CLIP),
    LossSpec("dro", dro, "-(log p * A - beta/2 (log p - log q)^2)", ("target_tokens", "logprobs", "advantages"),
             {"beta": Knob(0.05, "weight of the quadratic penalty on log p - log q", number(0.0),
                           "Tinker docs (dro) example; the server default is undocumented")},
             "Tinker docs (dro); beta 0.05 from the docs example, the server default is undocumented",
             scores="advantages_or_logprobs"),
    LossSpec("gspo", gspo, "-min(s_t A, clip(s_t, lo, hi) A), s_t sequence ratio (token form)",
             ("target_tokens", "logprobs", "advantages"),
             _clip_keys(0.8, 1.2, f"{SKYRL} eps 0.2 (the GSPO paper used 3e-4 / 4e-4)"),
             "Zheng et al. 2025 (arXiv 2507.18071) GSPO-token, as SkyRL implements it; bounds as SkyRL's "
             "eps 0.2 (the paper used 3e-4 / 4e-4)", optional_inputs=_PER_TOKEN_CLIP,
             # the sequence ratio is a mean over the whole completion (SkyRL / verl: the loss mask), so a
             # token whose advantage is 0 still counts in it, even one a greedy sampler gave logprob 0.0;
             # without weights the completion is the datum's tail from its first position with a nonzero
             # advantage or sampler logprob (prompt positions carry 0 in both)
             scores="completion"),
    LossSpec("dppo", dppo, "-r * A * m, m = 0 where the token left the TV or KL trust region",
             ("target_tokens", "logprobs", "advantages"),
             {"delta_low": Knob(0.2, "divergence bound for negative advantages", number(0.0), SKYRL),
              "delta_high": Knob(0.2, "divergence bound for positive advantages", number(0.0), SKYRL),
              "dppo_type": Knob("binary_tv", "divergence of the mask", choice("binary_tv", "binary_kl"),
                                f"{SKYRL} (set server-side there; a config key here)")},
             "arXiv 2602.04879 binary variants, as SkyRL implements them; SkyRL defaults"),
    LossSpec("sapo", sapo, "-sigmoid(tau (r - 1)) * 4/tau * A", ("target_tokens", "logprobs", "advantages"),
             {"tau_pos": Knob(1.0, "temperature of the soft gate for A > 0", number(0.0, open_low=True), SKYRL),
              "tau_neg": Knob(1.05, "temperature of the soft gate for A <= 0", number(0.0, open_low=True), SKYRL)},
             "arXiv 2511.20347, as SkyRL implements it; SkyRL defaults"),
    LossSpec("ppo_critic", ppo_critic, "1/2 max((V_clip - R)^2, (V - R)^2)", ("values", "returns"),
             {"value_clip": Knob(0.2, "largest move of V away from the old values; None = no clip",
                                 optional(number(0.0, open_low=True), "no clip"), f"{SKYRL} (PPO value clip)")},
             "PPO value loss as SkyRL implements it, but summed (no mean), like every loss here",
             scores="all", on_values=True),
)}


def loss_spec(name: str) -> LossSpec:
    if name not in LOSSES:
        raise ConfigError(f"unknown loss {name!r}: the valid losses are {', '.join(LOSSES)}")
    return LOSSES[name]


def resolve_config(name: str, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The loss's defaults overridden by ``config``; every unknown key and bad value reported at once."""
    spec = loss_spec(name)
    if config is not None and not isinstance(config, Mapping):
        raise ConfigError(f"loss_fn_config for loss {name!r} must be a dict of {list(spec.keys) or 'no keys'} "
                          f"or None, got {type(config).__name__}")
    config = dict(config or {})
    problems = []
    for key in config:
        if key not in spec.keys:
            valid = ", ".join(spec.keys) or "none (this loss takes no config)"
            problems.append(f"loss_fn_config key {key!r} is not accepted by loss {name!r}; valid keys: {valid}")
    for key, value in config.items():
        if key in spec.keys and (rule := spec.keys[key].check(value)) is not None:
            problems.append(f"loss_fn_config[{key!r}]={value!r} for loss {name!r} must be {rule}")
    merged = {**spec.defaults, **config}
    for low, high in (("clip_low_threshold", "clip_high_threshold"),):
        if low in merged and not problems and merged[low] > merged[high]:
            problems.append(f"loss {name!r}: {low}={merged[low]} is above {high}={merged[high]}; "
                            "the bounds are absolute ratios, e.g. 0.8 and 1.2")
    if problems:
        raise ConfigError("; ".join(problems))
    return merged


def scored(spec: LossSpec, inputs: Mapping[str, np.ndarray], length: int) -> np.ndarray:
    """Bool ``(N,)``: the positions this loss reads. The others contribute exactly 0 and are skipped.

    With ``weights``: where a weight is nonzero. Otherwise by the loss: nonzero advantages (a zero
    advantage gives a zero loss for every ratio-times-advantage loss; prompt positions carry A = 0);
    for ``dro`` (its quadratic term) also a nonzero sampler logprob; for ``gspo`` (its sequence mean) the
    whole completion, the tail from the first such position (a zero-advantage token a greedy sampler gave
    logprob 0.0 included); ``ppo_critic`` every position.
    """
    def any_k(a: np.ndarray) -> np.ndarray:
        return (a != 0).reshape(length, -1).any(axis=1)

    if "weights" in inputs:
        return any_k(inputs["weights"])
    if spec.scores == "all":
        return np.ones(length, dtype=bool)
    mask = any_k(inputs["advantages"])
    if spec.scores in ("advantages_or_logprobs", "completion"):
        mask |= any_k(inputs["logprobs"])
    if spec.scores == "completion" and mask.any():  # every position after the prompt, zeros included
        mask[int(np.argmax(mask)):] = True
    return mask


def per_token_loss(spec: LossSpec, x: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]) -> Tensor:
    """``spec.fn`` plus the optional ``weights`` multiplier of the non-kernel losses."""
    loss = spec.fn(x, inputs, config)
    if "weights" in inputs and "weights" in spec.optional_inputs:  # the kernel has them in its formula
        loss = loss * inputs["weights"]
    return loss


def capabilities() -> dict[str, dict[str, Any]]:
    """What the service lists: per loss, its formula, inputs and config keys with defaults."""
    return {name: {"formula": spec.formula, "inputs": list(spec.inputs),
                   "optional_inputs": list(spec.optional_inputs),
                   "config": {k: {"default": key.value, "doc": key.doc, "rule": describe(key.check),
                                  "source": key.source,
                                  **_choices(key.check)}
                              for k, key in spec.keys.items()},
                   "source": spec.source}
            for name, spec in LOSSES.items()}
