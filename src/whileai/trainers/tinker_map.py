"""The engine's shapes <-> the Tinker SDK's types, for the one trainer that speaks the SDK and the provider serving it.

    wai train --url URL --api tinker   whileai.trainers.tinker: the Tinker SDK's trainer on a Tinker-API server
    wai serve --tinker-url URL     the same trainer, served (whileai.service.provider.TinkerProvider)

Datums (engine dicts -> ``tinker.types.Datum``), outputs (``TensorData`` -> lists), Adam settings, one prompt's
sampling settings and seed, the losses a Tinker server takes (its ``LossFnType`` names with the config keys
Tinker documents) and, for a ``wai serve`` behind the URL, its own capabilities answer (every engine loss).
The SDK is imported inside the functions: importing this module needs only httpx and numpy.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import numpy as np

from whileai.errors import ConfigError

FLOAT_INPUTS = ("weights", "logprobs", "advantages", "clip_low_threshold", "clip_high_threshold", "values",
                "returns", "ref_logprobs")
CLIP = {"default": None, "doc": "absolute ratio bound (not an epsilon); None: the server's default",
        "rule": "a finite number >= 0", "source": "Tinker docs, losses (tutorial 202)"}
# Config keys per loss as Tinker's documentation gives them (docs/tinker.md): the SDK names the losses.
TINKER_CONFIG: dict[str, dict[str, Any]] = {
    "ppo": {"clip_low_threshold": CLIP, "clip_high_threshold": CLIP},
    "cispo": {"clip_low_threshold": CLIP, "clip_high_threshold": CLIP},
    "dro": {"beta": {"default": None, "doc": "weight of the quadratic penalty; None: the server's default",
                     "rule": "a finite number > 0", "source": "Tinker docs, DRO"}},
}
OWN_DISTRIBUTION_ONLY = ("a Tinker-API server scores under the policy's own distribution only (temperature 1, no "
                         "top-k / top-p, no reference policy)")


def tinker_losses() -> dict[str, Any]:
    """The losses a Tinker server takes: the SDK's ``LossFnType`` names whose inputs our engine's table
    describes (0.38 also names ``stable_reinforce`` and ``custom``, which no algorithm here sends), with only the
    config keys Tinker documents (none documented: none advertised, so thresholds are refused, not guessed)."""
    from tinker.types import LossFnType

    from whileai.engine import capabilities

    ours = capabilities()
    return {name: {"formula": ours[name]["formula"], "inputs": ours[name]["inputs"],
                   "optional_inputs": [i for i in ours[name].get("optional_inputs", []) if "threshold" not in i],
                   "config": TINKER_CONFIG.get(name, {}), "source": "tinker.types.LossFnType"}
            for name in typing.get_args(LossFnType) if name in ours}


def wai_capabilities(url: str, api_key: str) -> dict[str, Any] | None:
    """A ``wai serve``'s own capabilities answer, or None for a server that is not one."""
    try:
        answer = httpx.get(f"{url}/v1/training/capabilities", headers={"Authorization": f"Bearer {api_key}"},
                           timeout=30)
    except httpx.TransportError:
        return None
    return answer.json() if answer.status_code == 200 and "losses" in answer.json() else None  # type: ignore[no-any-return]


def losses_at(url: str, api_key: str) -> dict[str, Any]:
    """What the Tinker-API server at ``url`` takes: a wai serve's every loss, else ``tinker_losses()``."""
    remote = wai_capabilities(url, api_key)
    return dict(remote["losses"]) if remote is not None else tinker_losses()


def to_datum(datum: Mapping[str, Any]) -> Any:
    """An engine datum dict as the SDK's ``Datum`` (float32 per-token values, int64 targets)."""
    from tinker import types

    inputs = {}
    for name, value in datum["loss_fn_inputs"].items():
        dtype = np.float32 if name in FLOAT_INPUTS else np.int64
        inputs[name] = types.TensorData.from_numpy(np.asarray(value, dtype=dtype))
    return types.Datum(model_input=types.ModelInput.from_ints([int(t) for t in datum["model_input"]]),
                       loss_fn_inputs=inputs)


def outputs(result: Any) -> list[dict[str, Any]]:
    """A ``ForwardBackwardOutput``'s per-datum outputs as lists (the engine's ``loss_fn_outputs``)."""
    return [{k: v.tolist() for k, v in o.items()} for o in result.loss_fn_outputs]


def adam(params: Any) -> Any:
    """Adam settings (a dict, the engine's ``AdamParams``, or None: the defaults) as ``tinker.types.AdamParams``."""
    from tinker import types

    if params is None:
        return types.AdamParams()
    if dataclasses.is_dataclass(params) and not isinstance(params, type):
        params = dataclasses.asdict(params)
    return types.AdamParams(**dict(params))


def plain_params(params: Any) -> dict[str, Any]:
    """Sampling settings (a dict or the engine's ``SamplingParams``) as a dict of fields."""
    if dataclasses.is_dataclass(params) and not isinstance(params, type):
        return dataclasses.asdict(params)
    return dict(params or {})


def prompt_seed(params: dict[str, Any], index: int) -> dict[str, Any]:
    """Prompt ``index``'s sampling settings. A Tinker request carries one prompt, so each prompt of a batch
    gets its own seed: the batch's for the first (the same draws as the local engine, whose streams are
    seeded from (seed, prompt, sample)), one derived from (seed, index) for the others. ``ignore_eos`` is
    Tinker's ``stop=[]`` (it has no way to say both: no EOS stop, but other stops); an empty stop list
    otherwise is no ``stop`` at all, so the server's EOS stop holds."""
    params = dict(params)
    if params.pop("ignore_eos", False):
        if params.get("stop"):
            raise ConfigError(f"sampling_params: ignore_eos=True with stop={params['stop']!r} cannot be sent to a "
                              "Tinker server (its stop=[] is the only way to drop the EOS stop); drop one of them")
        params["stop"] = []
    elif not params.get("stop"):  # no stops of ours: Tinker's default, its EOS stop (stop=[] would drop it)
        params.pop("stop", None)
    if params.get("seed") is None or index == 0:
        return params
    return {**params, "seed": int(np.random.SeedSequence([int(params["seed"]), index]).generate_state(1)[0])}


def sample_all(sampler: Any, prompts: list[Any], num_samples: int, params: dict[str, Any],
               wait: Callable[[Any, str], Any] = lambda future, op: future.result()) -> list[list[Any]]:
    """Every prompt's samples from one SDK ``SamplingClient``: one request per prompt (``prompt_seed``), all
    sent before any answer is awaited (``wait(future, operation)``); each sample as the SDK's
    ``SampledSequence``."""
    from tinker import types

    futures = [sampler.sample(types.ModelInput.from_ints([int(t) for t in p]), num_samples,
                              types.SamplingParams(**prompt_seed(params, i)))
               for i, p in enumerate(prompts)]
    return [list(wait(f, "sample").sequences) for f in futures]
