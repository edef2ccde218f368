"""The ``tinker`` provider: the service's runs execute on any Tinker-compatible server through the official SDK.

    wai serve --tinker-url https://... (TINKER_API_KEY in the environment)

Tinker Cloud, SkyRL's Tinker API server, or another ``wai serve`` (which answers the SDK, docs/tinker.md).
Each run is one SDK ``TrainingClient``; ``sample`` and ``logprobs`` use a ``SamplingClient`` of the version
they name (a snapshot saved by ``save_weights_for_sampler``). What the provider advertises: a ``wai serve``
behind it is asked (its ``/v1/training/capabilities``: every loss, clip thresholds as config keys or per-token
inputs); any other server gets ``TINKER_LOSSES``, the SDK's own loss names with the config keys Tinker's docs
give (clip thresholds as scalar ``loss_fn_config``), so ``require_advertised_loss`` refuses the rest before
any work is sent.
"""

from __future__ import annotations

import typing
from typing import Any

import httpx
import numpy as np

from whileai.errors import ConfigError
from whileai.service import schemas
from whileai.service.provider import Outcome, RunOps, RunUnavailable

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


class TinkerProvider:
    """Runs on the Tinker-compatible server at ``url`` (one SDK session for the whole service)."""

    name = "tinker"

    def __init__(self, url: str, api_key: str, models: list[str]) -> None:
        import tinker

        self.url, self.api_key, self.models = url.rstrip("/"), api_key, list(models)
        self.client = tinker.ServiceClient(base_url=self.url, api_key=api_key)

    def capabilities(self) -> dict[str, Any]:
        remote = _wai_capabilities(self.url, self.api_key)
        losses = remote["losses"] if remote is not None else tinker_losses()
        convention = ("as the wai serve behind it takes them" if remote is not None else
                      "loss_config keys clip_low_threshold / clip_high_threshold (absolute ratios)")
        return {"provider": self.name, "upstream": self.url, "models": self.models,
                "operations": [op for op in schemas.OPERATIONS if op not in ("export_lora", "add_critic")], "losses": losses,
                "clip_thresholds": convention}

    def open_run(self, run_id: str, spec: dict[str, Any], *, restarted: bool) -> TinkerRun:
        if restarted:
            raise RunUnavailable("the service restarted, and a tinker-provider run lives on the upstream server "
                                 "through this process's SDK session, which ended: start a new run")
        if spec["base_model"] not in self.models:
            raise ConfigError(f"base_model {spec['base_model']!r} is not served here; this server serves "
                              f"{self.models} (start `wai serve --model M` to add one)")
        if spec["kind"] != "policy" or spec.get("reference"):
            raise ConfigError("the tinker provider runs policy runs only: critic runs and reference=True need "
                              "the local provider")
        training = self.client.create_lora_training_client(base_model=spec["base_model"], rank=spec["lora_rank"],
                                                           seed=spec["seed"]).result()
        return TinkerRun(self.client, training)


def _wai_capabilities(url: str, api_key: str) -> dict[str, Any] | None:
    """A ``wai serve``'s own capabilities answer, or None for a server that is not one."""
    try:
        answer = httpx.get(f"{url}/v1/training/capabilities", headers={"Authorization": f"Bearer {api_key}"},
                           timeout=30)
    except httpx.TransportError:
        return None
    return answer.json() if answer.status_code == 200 and "losses" in answer.json() else None  # type: ignore[no-any-return]


class TinkerRun(RunOps):
    """One SDK ``TrainingClient``; ``execute`` dispatches to ``op_<name>`` as ``LocalRun`` does."""

    def __init__(self, service: Any, training: Any) -> None:
        self.service, self.training = service, training
        self.step = 0
        self.samplers: dict[int, Any] = {}   # version -> SamplingClient (a snapshot)
        self.states: dict[str, tuple[str, int]] = {}  # state name -> tinker:// path, step

    def execute(self, op: str, body: schemas.Op) -> Outcome:
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            raise ConfigError(f"{op} is not supported by the tinker provider (the Tinker API has no such "
                              "operation); use the local provider")
        return handler(body)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.samplers.clear()

    def _step(self) -> int:
        return self.step

    def _sampler(self, version: int | None) -> Any:
        version = self.step if version is None else version
        if version not in self.samplers:
            if version != self.step:
                raise ConfigError(f"no sampler weights of version {version}; saved versions: "
                                  f"{sorted(self.samplers)}. Call save_weights_for_sampler() at that step")
            self.samplers[version] = self.training.save_weights_and_get_sampling_client().result()
        return self.samplers[version]

    # ------------------------------------------------------------------ operations
    def op_forward_backward(self, body: schemas.ForwardBackward, forward: bool = False) -> Outcome:
        if body.sampling_params is not None or getattr(body, "reference", False):
            raise ConfigError("the tinker provider scores under the policy's own distribution only: "
                              "sampling_params and reference=True need the local provider")
        call = self.training.forward if forward else self.training.forward_backward
        out = call([_datum(d) for d in body.data], body.loss_function, body.loss_config).result()
        outputs = [{k: v.tolist() for k, v in o.items()} for o in out.loss_fn_outputs]
        return self._done({"loss_fn_outputs": outputs, "metrics": dict(out.metrics)})

    def op_forward(self, body: schemas.Forward) -> Outcome:
        return self.op_forward_backward(body, forward=True)

    def op_optim_step(self, body: schemas.OptimStep) -> Outcome:
        from tinker import types

        before = self.step
        out = self.training.optim_step(types.AdamParams(**(body.adam_params or {}))).result()
        self.step += 1
        metrics = dict(out.metrics or {})
        return self._done({"grad_norm": metrics.get("grad_norm"), "metrics": metrics}, before)

    def op_save_weights_for_sampler(self, body: schemas.Op) -> Outcome:
        self.samplers[self.step] = self.training.save_weights_and_get_sampling_client().result()
        return self._done({"version": self.step})

    def op_sample(self, body: schemas.Sample) -> Outcome:
        from tinker import types

        single = bool(body.prompt_tokens) and isinstance(body.prompt_tokens[0], int)
        prompts: list[Any] = [body.prompt_tokens] if single else list(body.prompt_tokens)
        sampler = self._sampler(body.version)
        futures = [sampler.sample(types.ModelInput.from_ints(list(p)), body.num_samples,
                                  types.SamplingParams(**_prompt_seed(body.sampling_params, i)))
                   for i, p in enumerate(prompts)]
        groups = [[{"tokens": list(s.tokens), "logprobs": list(s.logprobs), "stop_reason": s.stop_reason}
                   for s in f.result().sequences] for f in futures]
        return self._done({"sequences": groups, "single": single}, body.version)

    def op_logprobs(self, body: schemas.Logprobs) -> Outcome:
        from tinker import types

        if body.reference or body.sampling_params is not None:
            raise ConfigError("the tinker provider scores under the policy's own distribution only: "
                              "reference=True and sampling_params need the local provider")
        out = self._sampler(None).sample(types.ModelInput.from_ints(list(body.tokens)), 1,
                                         types.SamplingParams(max_tokens=1), include_prompt_logprobs=True,
                                         topk_prompt_logprobs=body.top_k).result()
        topk = [None if row is None else [list(pair) for pair in row] for row in out.topk_prompt_logprobs or []]
        return self._done({"logprobs": out.prompt_logprobs, "topk": topk if body.top_k else None,
                           "version": self.step})

    def op_save_state(self, body: schemas.State) -> Outcome:
        path = self.training.save_state(body.name).result().path
        self.states[body.name] = (path, self.step)
        outcome = self._done({"name": body.name, "path": path})
        outcome.saved_state = {"name": body.name, "path": path, "step": self.step}
        return outcome

    def op_load_state(self, body: schemas.State) -> Outcome:
        if body.name not in self.states:
            raise ConfigError(f"load_state: this run saved no state named {body.name!r}; its saved states: "
                              f"{sorted(self.states) or 'none'}")
        load = self.training.load_state_with_optimizer if body.optimizer else self.training.load_state
        path, self.step = self.states[body.name]
        load(path).result()
        return self._done({"name": body.name})


def _prompt_seed(params: dict[str, Any], index: int) -> dict[str, Any]:
    """Prompt ``index``'s sampling settings. A Tinker request carries one prompt, so each prompt of a batch
    gets its own seed: the batch's for the first (the same draws as the local engine, whose streams are
    seeded from (seed, prompt, sample)), one derived from (seed, index) for the others. ``ignore_eos`` is
    Tinker's ``stop=[]`` (it has no way to say both: no EOS stop, but other stops)."""
    params = dict(params)
    if params.pop("ignore_eos", False):
        if params.get("stop"):
            raise ConfigError(f"sampling_params: ignore_eos=True with stop={params['stop']!r} cannot be sent to a "
                              "Tinker server (its stop=[] is the only way to drop the EOS stop); drop one of them")
        params["stop"] = []
    if params.get("seed") is None or index == 0:
        return params
    return {**params, "seed": int(np.random.SeedSequence([int(params["seed"]), index]).generate_state(1)[0])}


def _datum(datum: dict[str, Any]) -> Any:
    """An engine datum dict as the SDK's ``Datum`` (float32 per-token values, int64 targets)."""
    from tinker import types

    inputs = {}
    for name, value in datum["loss_fn_inputs"].items():
        dtype = np.float32 if name in FLOAT_INPUTS else np.int64
        inputs[name] = types.TensorData.from_numpy(np.asarray(value, dtype=dtype))
    return types.Datum(model_input=types.ModelInput.from_ints([int(t) for t in datum["model_input"]]),
                       loss_fn_inputs=inputs)
