"""The trainer on any Tinker-API server, through the official Tinker SDK (``pip install tinker``).

    trainer = over_tinker(url, key, model, lora_rank=8, seed=0, needs=needs)   # wai train --url U --api tinker

Tinker itself, SkyRL's Tinker-API server, or a ``wai serve`` (its Tinker front, docs/tinker.md). One SDK
``TrainingClient`` is the run. The SDK is wrapped here only: ``wai serve --tinker-url`` serves this trainer too
(``whileai.service.provider.TinkerProvider``). The datum, output, Adam and sampling mappings are
``whileai.trainers.tinker_map``'s. What a Tinker-API server cannot do is refused before anything is created
(``whileai.trainers.base.refusals`` over ``capabilities``): it scores only under the policy's own distribution
(no reference, no other temperature) and has no value head; its final weights come back through
``save_weights_external`` and the signed URLs of ``get_external_weights_urls``. A
checkpoint is the server's ``save_state`` (a ``tinker://`` path); ``--resume`` starts a new training client
from it with its optimizer state.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar, cast

import httpx

from whileai.errors import ConfigError, WhileaiError
from whileai.trainers import tinker_map
from whileai.trainers.base import (
    Adam,
    CustomLoss,
    Datum,
    LogprobsFor,
    Needs,
    Scoring,
    Tokenizer,
    load_tokenizer,
    refusals,
)
from whileai.trainers.remote import Remote, remote_checkpoint, state_name, write_pointer
from whileai.trainers.wai_client import ForwardResult, OptimResult, SampledSequence

if TYPE_CHECKING:
    from tinker import APIFuture, SamplingClient, ServiceClient, TrainingClient
    from tinker.types import LossFnType

T = TypeVar("T")

CONNECT_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 60.0  # for the capabilities answer, before anything is created
POLL_S = 10.0
"""while waiting on an operation, how often the server is checked to still answer (the SDK itself retries a dead
server for minutes): a run notices a dead server within about this plus CONNECT_TIMEOUT_S"""


class ServerGone(WhileaiError):
    """The Tinker-API server stopped answering while an operation waited (``status`` 0: nothing answered, as
    the service client's; the run's checkpoint hook turns it into ``ServerStopped`` with the resume line)."""

    status = 0

    def __init__(self, operation: str, url: str, cause: str) -> None:
        super().__init__(f"{operation} did not complete: the Tinker-API server at {url} stopped answering ({cause})")
        self.operation = operation


def answering(url: str) -> str | None:
    """Why nothing answers at ``url`` (a refused or timed-out connection), or None when something does."""
    try:
        httpx.get(url, timeout=CONNECT_TIMEOUT_S)
    except httpx.TransportError as err:
        return f"{type(err).__name__}: {err}"
    return None


def wait(future: APIFuture[T], operation: str, url: str) -> T:
    """An SDK future's result, checking every POLL_S that the server still answers: a dead server is
    ``ServerGone`` naming the operation, not minutes of the SDK's retries and its ``RetryableException``."""
    from tinker.lib.retryable_exception import RetryableException

    tinker = _sdk()
    while True:
        try:
            return future.result(timeout=POLL_S)
        except TimeoutError:
            gone = answering(url)
            if gone is not None:
                raise ServerGone(operation, url, gone) from None
        except (tinker.APIConnectionError, RetryableException) as err:
            raise ServerGone(operation, url, f"{type(err).__name__}: {err}") from None
KEEP_SAMPLERS = 8
"""the sampler versions a trainer keeps (the engine's ``keep_sampler_versions`` default)"""
OPERATIONS = ("forward", "forward_backward", "optim_step", "sample", "save_state", "load_state", "export_lora")
"""what the trainer can do on any Tinker-API server (no add_critic); ``export_lora`` is its
``save_weights_external`` (a server that refuses it fails the export, naming --no-export)"""


def api_key_for(token: str | None) -> str:
    found = token or os.environ.get("TINKER_API_KEY") or os.environ.get("WAI_TOKEN")
    if not found:
        raise ConfigError("--api tinker needs the server's API key: give --token T or set TINKER_API_KEY (a wai "
                          "serve's token works too; the SDK wants it to start with 'tml-')")
    return found


def _sdk() -> ModuleType:
    try:
        import tinker
    except ImportError:
        raise ConfigError("--api tinker needs the Tinker SDK, which is not installed: pip install whileai[tinker]") \
            from None
    return tinker


def capabilities(url: str, api_key: str) -> dict[str, Any]:
    """What the server at ``url`` offers, in the shape ``refusals`` reads (asked without opening a session)."""
    tinker = _sdk()
    try:  # the SDK retries a refused connection for minutes: a wrong address is named at once instead
        httpx.get(url, timeout=CONNECT_TIMEOUT_S)
    except httpx.TransportError as err:
        raise ConfigError(f"--url {url}: nothing answers there ({err!r}); is the server running at that "
                          "address?") from None
    try:
        rest = tinker.RestClient(base_url=url, api_key=api_key)
        answer = rest.get_server_capabilities().result(timeout=ANSWER_TIMEOUT_S)
    except Exception as err:  # the SDK's own errors (connection, auth) carry the server's message
        raise ConfigError(f"--url {url} --api tinker: the server did not answer the Tinker API's "
                          f"get_server_capabilities ({type(err).__name__}: {err}); is it a Tinker-API server, and is "
                          "the key right? For a wai serve's own API drop --api tinker") from None
    return {"provider": "tinker", "models": [m.model_name for m in answer.supported_models if m.model_name],
            "operations": list(OPERATIONS), "losses": tinker_map.losses_at(url.rstrip("/"), api_key)}


class TinkerTrainer:
    """One SDK ``TrainingClient`` with the engine's operation names and return shapes. ``step`` counts the
    optimizer steps taken here (the SDK keeps no step); a resumed trainer starts at its checkpoint's. Sampling
    and scoring use a ``SamplingClient`` of the weights of a version (``save_weights_for_sampler``, or the
    current step's, saved when first sampled there). Its checkpoint is a state saved on the server (a
    ``tinker://`` path) and a pointer to it in the folder (``whileai.trainers.remote``)."""

    def __init__(self, training: TrainingClient, base_model: str, *, step: int = 0, loaded_from: str | None = None,
                 url: str = "", capabilities: Mapping[str, Any] | None = None, service: ServiceClient | None = None,
                 closers: Sequence[Callable[[], None]] = ()) -> None:
        self.training, self.base_model, self.url, self.service = training, base_model, url, service
        self.where = f"Tinker API at {url}"
        self.capabilities = capabilities
        self.step = step
        self.loaded_from = loaded_from
        """the state a trainer made from one (--resume) holds, with its optimizer, until anything else happens"""
        self.closers = list(closers)
        self._samplers: dict[int, SamplingClient] = {}   # version -> a client of that version's weights
        self._tokenizer: Tokenizer | None = None

    @property
    def id(self) -> str:
        return str(self.training.model_id)

    @property
    def tokenizer(self) -> Tokenizer:
        """A built-in's byte tokenizer; any other model's, as the server names it (``get_tokenizer``)."""
        if self._tokenizer is None:
            builtin = self.base_model.startswith("builtin:")
            self._tokenizer = load_tokenizer(self.base_model) if builtin else self.training.get_tokenizer()
        return self._tokenizer

    def forward(self, data: Sequence[Datum], loss_fn: str = "cross_entropy",
                loss_fn_config: Mapping[str, Any] | None = None, *, sampling_params: Scoring = None,
                reference: bool = False, logprobs_for: LogprobsFor = "every") -> ForwardResult:
        """Tinker returns every position's log-probability: ``logprobs_for`` asks for a subset of them."""
        _own_distribution(sampling_params, reference)
        out = self._wait(self.training.forward([tinker_map.to_datum(d) for d in data], _loss(loss_fn), loss_fn_config),
                         "forward")
        return ForwardResult(tinker_map.outputs(out), dict(out.metrics), self.step)

    def forward_backward(self, data: Sequence[Datum], loss_fn: str, loss_fn_config: Mapping[str, Any] | None = None,
                         *, sampling_params: Scoring = None, logprobs_for: LogprobsFor = "every") -> ForwardResult:
        _own_distribution(sampling_params, False)
        self.loaded_from = None  # a gradient now pends: a load of the same state must drop it
        out = self._wait(self.training.forward_backward([tinker_map.to_datum(d) for d in data], _loss(loss_fn),
                                                        loss_fn_config), "forward_backward")
        return ForwardResult(tinker_map.outputs(out), dict(out.metrics), self.step)

    def forward_backward_custom(self, data: Sequence[Datum], loss_fn: CustomLoss, *, sampling_params: Scoring = None,
                                logprobs_for: LogprobsFor = "every") -> ForwardResult:
        """As the SDK does it: ``forward`` for the log-probabilities, ``loss_fn(data, logprobs)`` here, then
        ``cross_entropy`` with weights = -dloss/dlogprob (``whileai.trainers.custom``, the service client's too)."""
        from whileai.trainers.custom import custom_weights

        scored = self.forward(data, "cross_entropy", sampling_params=sampling_params)
        weighted, loss, metrics = custom_weights(data, scored.loss_fn_outputs, loss_fn)
        out = self.forward_backward(weighted, "cross_entropy", sampling_params=sampling_params)
        return ForwardResult(out.loss_fn_outputs, {**metrics, "loss:sum": loss}, out.version)

    def optim_step(self, adam_params: Adam = None) -> OptimResult:
        out = self._wait(self.training.optim_step(tinker_map.adam(adam_params)), "optim_step")
        before, self.step, self.loaded_from = self.step, self.step + 1, None
        metrics = {k: float(v) for k, v in dict(out.metrics or {}).items()}
        return OptimResult(metrics.get("grad_norm", float("nan")), metrics, before)

    def sample(self, prompt_tokens: Sequence[Any], num_samples: int, sampling_params: Scoring, *,
               version: int | None = None) -> list[Any]:
        """One prompt -> its sequences; a list of prompts -> one list per prompt (one SDK request each)."""
        single = bool(prompt_tokens) and isinstance(prompt_tokens[0], int)
        prompts: list[Any] = [prompt_tokens] if single else list(prompt_tokens)
        params = _tinker_params(tinker_map.plain_params(sampling_params))
        groups = [[SampledSequence(list(s.tokens), list(s.logprobs or []), s.stop_reason) for s in group]
                  for group in tinker_map.sample_all(self._sampling_client(version), prompts, num_samples, params,
                                                     self._wait)]
        return groups[0] if single else groups

    def save_weights_for_sampler(self) -> int:
        self._samplers[self.step] = self._wait(self.training.save_weights_and_get_sampling_client(),
                                               "save_weights_and_get_sampling_client")
        for old in sorted(self._samplers)[:-KEEP_SAMPLERS]:
            del self._samplers[old]
        return self.step

    def compute_logprobs(self, tokens: Sequence[int], top_k: int = 0, *, reference: bool = False,
                         sampling_params: Scoring = None) -> dict[str, Any]:
        """The tokens' log-probabilities (and each position's ``top_k``) under the current weights."""
        from tinker import types

        _own_distribution(sampling_params, reference)
        out = self._wait(self._sampling_client(None).sample(
            types.ModelInput.from_ints(list(tokens)), 1, types.SamplingParams(max_tokens=1),
            include_prompt_logprobs=True, topk_prompt_logprobs=top_k), "sample")
        topk = [None if row is None else [list(pair) for pair in row] for row in out.topk_prompt_logprobs or []]
        return {"logprobs": out.prompt_logprobs, "topk": topk if top_k else None, "version": self.step}

    def add_critic(self, learning_rate: float, *, reward_range: Sequence[float] | None = None) -> object:
        raise ConfigError("add_critic: a Tinker-API server has no value head (the Tinker API has no add_critic); "
                          "train a critic method in-process or on a wai serve without --tinker-url")

    def _sampling_client(self, version: int | None) -> SamplingClient:
        version = self.step if version is None else version
        if version not in self._samplers:
            if version != self.step:
                raise ConfigError(f"no sampler weights of version {version}; saved versions: "
                                  f"{sorted(self._samplers)}. Call save_weights_for_sampler() at that step")
            self.save_weights_for_sampler()
        return self._samplers[version]

    def save(self, folder: Path) -> str:
        """Weights and optimizer saved on the server (named by the step); a pointer to them in ``folder``."""
        step, name = self.step, state_name(self.step)
        path = str(self._wait(self.training.save_state(name), "save_state").path)
        write_pointer(folder, Remote(api="tinker", url=self.url, run=self.id, name=name, path=path, step=step))
        return path

    def load(self, folder: Path, *, optimizer: bool = True) -> None:
        """Restore the state the pointer in ``folder`` names (a trainer made from it has loaded it already)."""
        saved = remote_checkpoint(folder)
        if saved["path"] != self.loaded_from or not optimizer:
            self._load(saved, optimizer)
        self.step, self.loaded_from = int(saved["step"]), None
        # sampler weights of this step or later were another trajectory's: the next sample saves them anew
        self._samplers = {v: c for v, c in self._samplers.items() if v < self.step}

    def _load(self, saved: Remote, optimizer: bool) -> None:
        if saved["run"] == self.id:
            load = self.training.load_state_with_optimizer if optimizer else self.training.load_state
            self._wait(load(saved["path"]), "load_state")
            return
        if self.service is None:
            raise ConfigError(f"load: the state {saved['path']} is run {saved['run']}'s, and this trainer (run "
                              f"{self.id}) can load only its own")
        # another run's state (a copy, ``from_state``): the SDK makes a new training client from it
        make = (self.service.create_training_client_from_state_with_optimizer if optimizer else
                self.service.create_training_client_from_state)
        self.training, self._samplers = make(saved["path"]).result(), {}

    def export(self, path: str, merged: bool = False) -> str:
        """The weights as files at ``path``: the server's ``save_weights_external`` (a PEFT adapter for a LoRA run,
        the whole model otherwise: ``merged`` is the run's kind, as the engine's), fetched file by file from the
        signed URLs of ``get_external_weights_urls`` into a folder beside ``path`` and moved there whole."""
        if self.service is None:
            raise ConfigError("export: this trainer has no service client to ask for the weights' URLs")
        tinker = _sdk()
        name = f"export-{self.step:08d}"
        try:
            saved = self._wait(self.training.save_weights_external(name), "save_weights_external")
            rest = self.service.create_rest_client()
            urls = self._wait(rest.get_external_weights_urls(saved.path), "get_external_weights_urls").urls
        except tinker.APIStatusError as err:
            raise ConfigError(f"export: the server at {self.url} refused save_weights_external ({err}); the weights "
                              "stay on the server's side: run with --no-export, or save them there (save_state)") \
                from None
        target = Path(path)
        partial = target.with_name(f".{target.name}.partial")
        if partial.exists():
            shutil.rmtree(partial)
        for relative, url in urls.items():
            out = partial / relative
            if out.resolve().parent != partial.resolve() and partial.resolve() not in out.resolve().parents:
                raise WhileaiError(f"export: the server named a file outside the folder ({relative!r})")
            out.parent.mkdir(parents=True, exist_ok=True)
            with httpx.stream("GET", url, timeout=ANSWER_TIMEOUT_S, follow_redirects=True) as reply:
                reply.raise_for_status()
                with out.open("wb") as handle:
                    for chunk in reply.iter_bytes():
                        handle.write(chunk)
        if target.exists():
            shutil.rmtree(target)
        os.replace(partial, target)
        return str(target)

    def close(self) -> None:
        self._samplers.clear()
        for close in reversed(self.closers):
            close()

    def _wait(self, future: APIFuture[T], operation: str) -> T:
        return wait(future, operation, self.url)


def _loss(name: str) -> LossFnType:
    """A loss name as the SDK types it (the server refuses a name it does not take; ``refusals`` names it first)."""
    return cast("LossFnType", name)


def _own_distribution(sampling_params: Scoring, reference: bool) -> None:
    if sampling_params is not None or reference:
        raise ConfigError(f"{tinker_map.OWN_DISTRIBUTION_ONLY}: this call asked for "
                          + ("the reference policy" if reference else f"sampling_params {sampling_params!r}"))


def _tinker_params(params: dict[str, Any]) -> dict[str, Any]:
    """The engine's sampling settings as Tinker's: no stops is None (the EOS stop only; Tinker's ``stop=[]``
    would drop it too), single stop tokens a list of ids, stop strings a list of strings."""
    stops = list(params.pop("stop", None) or ())
    if not stops:
        return params
    if all(isinstance(s, str) for s in stops):
        return {**params, "stop": stops}
    ids = [s[0] if isinstance(s, (list, tuple)) and len(s) == 1 else s for s in stops]
    if not all(isinstance(i, int) for i in ids):
        raise ConfigError(f"sampling: stop {stops!r} mixes strings with token ids or holds a sequence of several "
                          "ids, which the Tinker API cannot take (its stop is strings or single token ids): train "
                          "this taskset in-process or on a wai serve's own API (drop --api tinker)")
    return {**params, "stop": ids}


def sdk_session(url: str, api_key: str) -> ServiceClient:
    """One SDK session on the Tinker-API server at ``url`` (``wai serve --tinker-url`` holds one for its runs)."""
    client: ServiceClient = _sdk().ServiceClient(base_url=url, api_key=api_key)
    return client


def new_run(service: ServiceClient, model: str, *, lora_rank: int, seed: int, url: str,
            capabilities: Mapping[str, Any] | None = None, closers: Sequence[Callable[[], None]] = ()) -> TinkerTrainer:
    """A trainer on a new LoRA training client of ``model`` in the session ``service``."""
    training = service.create_lora_training_client(base_model=model, rank=lora_rank, seed=seed).result()
    return TinkerTrainer(training, model, url=url, capabilities=capabilities, service=service, closers=closers)


def over_tinker(url: str, token: str | None, model: str, *, lora_rank: int, seed: int, needs: Needs,
                resume: Path | None = None) -> TinkerTrainer:
    """A training client on the Tinker-API server at ``url``, refused with every unmet need before one is made.
    ``resume``: a checkpoint folder whose pointer names a state saved there, to start from."""
    key = api_key_for(token)
    url = url.rstrip("/")
    saved = remote_checkpoint(resume) if resume is not None else None
    offered = capabilities(url, key)
    problems = refusals(offered, model, needs)
    if problems:
        raise ConfigError(f"the Tinker-API server at {url} cannot run this: " + "; ".join(problems))
    service = sdk_session(url, key)
    closers = [lambda: _close(service, url)]
    try:
        if saved is None:
            return new_run(service, model, lora_rank=lora_rank, seed=seed, url=url, capabilities=offered,
                           closers=closers)
        training = _from_state(service, url, saved)
        return TinkerTrainer(training, model, step=int(saved["step"]), loaded_from=saved["path"], url=url,
                             capabilities=offered, service=service, closers=closers)
    except BaseException:
        service.close("errored").result()
        raise


def _close(service: ServiceClient, url: str) -> None:
    """End the session; a server that is gone has no session to end (the run's error says what failed)."""
    try:
        wait(service.close("success"), "close", url)
    except ServerGone:
        pass


def _from_state(service: ServiceClient, url: str, saved: Remote) -> TrainingClient:
    try:
        return service.create_training_client_from_state_with_optimizer(saved["path"]).result()
    except Exception as err:
        raise ConfigError(f"--resume: the checkpoint at step {saved['step']} is the state {saved['path']} on the "
                          f"Tinker-API server at {url}, which could not load it ({type(err).__name__}: {err}). If "
                          "the server lost it (restarted without its data), the run cannot continue from there: "
                          "start it again in a new --run-dir") from None
