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

from typing import Any

from whileai.errors import ConfigError
from whileai.service import schemas
from whileai.service.provider import Outcome, RunOps, RunUnavailable
from whileai.service.tinker_map import outputs, sample_all, tinker_losses, to_datum, wai_capabilities


class TinkerProvider:
    """Runs on the Tinker-compatible server at ``url`` (one SDK session for the whole service)."""

    name = "tinker"

    def __init__(self, url: str, api_key: str, models: list[str]) -> None:
        import tinker

        self.url, self.api_key, self.models = url.rstrip("/"), api_key, list(models)
        self.client = tinker.ServiceClient(base_url=self.url, api_key=api_key)

    def capabilities(self) -> dict[str, Any]:
        remote = wai_capabilities(self.url, self.api_key)
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
        out = call([to_datum(d) for d in body.data], body.loss_function, body.loss_config).result()
        return self._done({"loss_fn_outputs": outputs(out), "metrics": dict(out.metrics)})

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
        scores = [k for k in ("prompt_logprobs", "topk_prompt_logprobs", "topk_sample_logprobs",
                              "target_prompt_logprobs", "prompt_alt_tokens_k") if getattr(body, k)]
        if scores:
            raise ConfigError(f"sample: {', '.join(scores)} cannot be passed on by the tinker provider (it samples "
                              "batches prompt by prompt); score with the logprobs operation, or use the local provider")
        single = bool(body.prompt_tokens) and isinstance(body.prompt_tokens[0], int)
        prompts: list[Any] = [body.prompt_tokens] if single else list(body.prompt_tokens)
        sampled = sample_all(self._sampler(body.version), prompts, body.num_samples, body.sampling_params)
        groups = [[{"tokens": list(s.tokens), "logprobs": list(s.logprobs), "stop_reason": s.stop_reason}
                   for s in group] for group in sampled]
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

