"""A Tinker ``TrainingClient``'s routes on ``wai serve``: models, training steps, saves and loads, futures.

    POST /api/v1/create_model               create_lora_training_client (a service run)
    POST /api/v1/get_info                   get_info / get_tokenizer
    POST /api/v1/forward_backward           forward_backward / forward (protobuf)
    POST /api/v1/optim_step                 optim_step (AdamW)
    POST /api/v1/save_weights               save_state(name, ttl_seconds, overwrite)
    POST /api/v1/load_weights               load_state(_with_optimizer), create_training_client_from_state(...)
    POST /api/v1/save_weights_for_sampler   save_weights_for_sampler, save_weights_and_get_sampling_client
    POST /api/v1/retrieve_future            every future's result (tinker_api.TinkerFront.retrieve)

Each request is checked (body, names, limits) and queued as an operation of its run through
``TinkerFront.queued`` (tinker_api.py), which gives it the run's next sequence number only once it is accepted.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from whileai.errors import ConfigError
from whileai.service import schemas
from whileai.service.tinker_api import PATH_RULE, WEIGHTS_PATH, TinkerError, json_answer


def mount_training(app: FastAPI, front: Any) -> None:
    from tinker import types as T

    from whileai.service import tinker_wire

    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> Response:
        body, _, owner = await front.parsed(request, T.CreateModelRequest, "/api/v1/create_model")
        front.session(body.session_id, owner, "/api/v1/create_model")
        lora = body.lora_config or T.LoraConfig(rank=0)
        if not (lora.train_mlp and lora.train_attn and lora.train_unembed):
            raise TinkerError(400, "/api/v1/create_model: train_mlp / train_attn / train_unembed = False is not "
                                   "supported; wai serve adapts every linear layer (leave them True)")
        if body.optimizer_config.type != "adamw":
            raise TinkerError(400, f"/api/v1/create_model: optimizer {body.optimizer_config.type!r} is not "
                                   "supported; wai serve trains with AdamW")
        request_id = f"create.{body.session_id}.{body.model_seq_id}"
        if request_id not in front.ready:  # a retry gets the run made the first time
            run_id = await front.open_run(body.session_id, owner, body.base_model, lora.rank, lora.seed or 0)
            front.ready[request_id] = {"model_id": run_id, "type": "create_model"}
            front.keep_metadata(run_id, body.user_metadata)
        return json_answer({"request_id": request_id, "model_id": front.ready[request_id]["model_id"]})

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> Response:
        body, _, owner = await front.parsed(request, T.GetInfoRequest, "/api/v1/get_info")
        spec = front.run(body.model_id, owner, "/api/v1/get_info")["spec"]
        data = {"arch": "qwen2" if spec["base_model"].startswith("builtin:") else None,
                "model_name": spec["base_model"], "tokenizer_id": front.tokenizer_id(spec["base_model"])}
        return json_answer({"model_data": data, "model_id": body.model_id, "is_lora": spec["lora_rank"] > 0,
                      "lora_rank": spec["lora_rank"] or None, "model_name": spec["base_model"], "type": "get_info"})

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> Response:
        owner = front.owner(request)
        raw = await front.body(request, "/api/v1/forward_backward")
        try:
            msg, fields = tinker_wire.forward_backward_body(raw)
        except ConfigError as err:
            raise TinkerError(400, str(err)) from None
        run = front.run(msg.model_id, owner, "/api/v1/forward_backward")
        op = "forward" if msg.forward_only else "forward_backward"
        return front.queued(run, msg, op, fields, raw,
                            {"kind": "forward_backward", "route": f"/api/v1/forward_backward ({op})"})

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> Response:
        body, raw, run = await front.on_model(request, T.OptimStepRequest, "/api/v1/optim_step")
        try:
            adam = tinker_wire.adam_params(body)
        except ConfigError as err:
            raise TinkerError(400, str(err)) from None
        return front.queued(run, body, "optim_step", {"adam_params": adam}, raw,
                            {"kind": "optim_step", "route": "/api/v1/optim_step"})

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> Response:
        route = "/api/v1/save_weights"
        body, raw, run = await front.on_model(request, T.SaveWeightsRequest, route)
        name = body.path or f"state-{body.seq_id}"
        front.check_saving(route, body.ttl_seconds)
        first = (run["id"], "train", body.seq_id) not in front.seqs  # not the SDK's retry of a save that ran
        if first and not body.overwrite and name in {s["name"] for s in front.service.store.states(run["id"])}:
            raise TinkerError(400, f"{route}: run {body.model_id} already has a state {name!r}; pick another name "
                                   "or pass overwrite=True")
        front.keep_checkpoint_metadata(run["id"], f"weights/{name}", body.user_metadata)
        return front.queued(run, body, "save_state", {"name": name}, raw,
                            {"kind": "save_weights", "route": route, "name": name, "ttl": body.ttl_seconds})

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> Response:
        body, raw, owner = await front.parsed(request, T.LoadWeightsRequest, "/api/v1/load_weights")
        if body.weights_access_token is not None:
            raise TinkerError(400, "/api/v1/load_weights: weights_access_token (reading another account's weights) "
                                   "is not available on wai serve: a client loads the states of its own api_key")
        if body.optimizer_config is not None and body.optimizer_config.type != "adamw":
            raise TinkerError(400, f"/api/v1/load_weights: optimizer {body.optimizer_config.type!r} is not "
                                   "supported; wai serve trains with AdamW")
        front.checkpoints.sweep()  # a state whose TTL passed is gone before anyone loads it
        if body.model_id is None:
            return await front.from_state(body, owner, raw)
        run = front.run(body.model_id, owner, "/api/v1/load_weights")
        found = WEIGHTS_PATH.match(body.path)
        if found is None or found["kind"] != "weights" or front.aliases.get(found["run"], found["run"]) != run["id"]:
            raise TinkerError(400, f"/api/v1/load_weights: path {body.path!r}: a training client loads a state it "
                                   "saved itself (tinker://<its model_id>/weights/<name>); for another run's state "
                                   "use ServiceClient.create_training_client_from_state(path)")
        return front.queued(run, body, "load_state", {"name": found["name"], "optimizer": body.optimizer}, raw,
                            {"kind": "load_weights", "route": "/api/v1/load_weights", "name": found["name"]})

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> Response:
        route = "/api/v1/save_weights_for_sampler"
        body, raw, run = await front.on_model(request, T.SaveWeightsForSamplerRequest, route)
        front.check_saving(route, body.ttl_seconds)
        if body.kind != "snapshot":
            raise TinkerError(400, f"{route}: kind={body.kind!r} (a sampler that follows the weights as they train) "
                                   "is not available on wai serve: its samplers are snapshots (kind='snapshot')")
        if body.path is not None and not re.match(schemas.STATE_NAME, body.path):
            raise TinkerError(400, f"{route}: name {body.path!r}: {PATH_RULE}")
        if body.path is not None:
            front.keep_checkpoint_metadata(run["id"], f"sampler_weights/{body.path}", body.user_metadata)
        sampler = f"{run['session_id']}:sample:{body.sampling_session_seq_id}"
        shape = {"kind": "sampler", "route": route, "name": body.path, "sampler": sampler, "ttl": body.ttl_seconds}
        return front.queued(run, body, "save_weights_for_sampler", {}, raw, shape)

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        body, _, owner = await front.parsed(request, T.FutureRetrieveRequest, "/api/v1/retrieve_future")
        return await front.retrieve(body.request_id, owner)
