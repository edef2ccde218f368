"""Overrides (dotted prime-rl keys checked against the schema) and the last pass over a config.

The last pass keeps the batch a multiple of the group, names a renderer where the model id needs
one, and runs the cross-field rules prime-rl's own validation would run (reference section 5).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlparse

from whileai.errors import ConfigError
from whileai.methods.base import plural
from whileai.prime_rl import schema
from whileai.prime_rl.plan import Context, Plan, group_size, put
from whileai.prime_rl.schema import PINNED_SHORT, SOURCE

# Short override names accepted besides dotted prime-rl keys.
ALIASES: dict[str, str] = {
    "lr": "trainer.optim.lr", "learning_rate": "trainer.optim.lr", "batch_size": "orchestrator.batch_size",
    "group_size": "orchestrator.group_size", "lora_rank": "trainer.model.lora.rank",
    "lora_alpha": "trainer.model.lora.alpha", "run_name": "run.name",
}


# ----------------------------------------------------------------- overrides
def apply_overrides(config: dict[str, Any], overrides: Mapping[str, Any], plan: Plan) -> None:
    """Each override: an alias or dotted key, a nested dict of one, or ``lora``; checked against the schema."""
    written: dict[str, tuple[Any, str]] = {}
    for raw, value in overrides.items():
        if raw == "lora":
            _lora(config, value, written)
            continue
        for path, leaf in _flatten(_source_path(ALIASES.get(raw, raw)), value):
            _put(config, _canonical(path, raw, plan), leaf, raw, written, plan)


def _source_path(path: str) -> str:
    """``orchestrator.train.source.X`` (or ``.0.X``) addresses the one source the writer makes."""
    for prefix in ("orchestrator.train.source.0.", "orchestrator.train.source."):
        if path.startswith(prefix):
            return f"{SOURCE}." + path[len(prefix):]
    return path


def _flatten(path: str, value: Any) -> Iterator[tuple[str, Any]]:
    """(path, value) pairs: a non-empty dict given for a table becomes one pair per field."""
    key = schema.lookup(path)
    if isinstance(value, Mapping) and value and key is not None and key.kind in ("table", "open-table"):
        for name, inner in value.items():
            yield from _flatten(f"{path}.{name}", inner)
    else:
        yield path, value


def _canonical(path: str, raw: str, plan: Plan) -> str:
    if path in schema.AUTO_SET:
        raise ConfigError(f"prime_rl_config: {raw} cannot set {path}: {schema.AUTO_SET[path]}")
    if path in schema.SHARED:
        top = schema.SHARED[path]
        plan.warnings.append(f"{path} is a shared field: written once at the top level as {top}, which prime-rl "
                             f"copies into every component.")
        return top
    return path


def _knob_hint(raw: str, plan: Plan) -> str:
    """A hint when an override is really a knob of the method (``--set rollouts_per_prompt=16``)."""
    fields = {f.name for f in dataclasses.fields(plan.method)} if dataclasses.is_dataclass(plan.method) else set()
    if raw not in fields:
        return ""
    return (f". {raw} is a knob of {type(plan.method).__name__}: set it on the method "
            f"({type(plan.method).__name__}({raw}=...); from the shell, --knob {raw}=VALUE)")


def _put(config: dict[str, Any], path: str, value: Any, raw: str, written: dict[str, tuple[Any, str]],
         plan: Plan) -> None:
    key = schema.lookup(path)
    if key is None:
        raise ConfigError(f"prime_rl_config: override {raw!r} names {path}, which is not a key of {PINNED_SHORT}"
                          f"{schema.suggest(path)}; prime-rl forbids unknown keys{_knob_hint(raw, plan)}")
    if _owned(path, plan):
        raise ConfigError(f"prime_rl_config: {path} is written from the method, env= or model=, not from an "
                          "override: pass another method object (or its knobs), env or model instead")
    if isinstance(value, Mapping) and not value and key.kind in ("table", "open-table"):
        if schema.get(config, path) is None:  # an empty table enables a block with its defaults
            put(config, path, {})
        return
    if value is None:
        if not key.nullable:
            raise ConfigError(f"prime_rl_config: {raw}=None is invalid: {path} takes no None")
        value = "None"
    if key.path == path and (why := schema.type_problem(key, value)) is not None:
        raise ConfigError(f"prime_rl_config: override {raw}={value!r} is invalid: {path} {why} ({key.where})")
    if path in written and written[path][0] != value:
        raise ConfigError(f"prime_rl_config: {path} is set twice, to {written[path][0]!r} by {written[path][1]} "
                          f"and to {value!r} by {raw}; keep one")
    written[path] = (value, raw)
    plan.overridden.add(path)
    if path in plan.keys and plan.keys[path][0] != value:
        knob_value, tag = plan.keys[path]
        plan.warnings.append(f"{raw}={value!r} replaces {tag}={knob_value!r}; setting the knob on the method "
                             "object keeps the two in step.")
        plan.mapped[tag] = f"{path} = {value!r} (set by {raw}, which replaced the knob's {knob_value!r})"
    put(config, path, copy.deepcopy(value))


def _owned(path: str, plan: Plan) -> bool:
    """Keys the method, env or model argument writes: an override may only touch the knob-mapped ones."""
    if path in plan.keys:
        return False
    if path in plan.owned or path in ("model", "model.name"):
        return True
    inside = ("orchestrator.algo", "trainer.loss.type", f"{SOURCE}.env.taskset", "orchestrator.train.source")
    return any(path == p or path.startswith(p + ".") for p in inside)


def _lora(config: dict[str, Any], value: Any, written: dict[str, tuple[Any, str]]) -> None:
    """``lora=True`` (prime-rl's defaults), an int rank, or a dict of [trainer.model.lora] fields."""
    if value is True:
        table: dict[str, Any] = {}
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        table = {"rank": value}
    elif isinstance(value, Mapping):
        table = dict(value)
    else:
        raise ConfigError(f"prime_rl_config: lora={value!r} is invalid: pass True, a rank (int >= 1) or a dict of "
                          "trainer.model.lora fields (rank, alpha, dropout, target_modules, modules_to_save)")
    for name, inner in table.items():
        key = schema.KEYS.get(f"trainer.model.lora.{name}")
        if key is None:
            raise ConfigError(f"prime_rl_config: lora has no field {name!r}; its fields are rank, alpha, dropout, "
                              "target_modules, modules_to_save")
        if (why := schema.type_problem(key, inner)) is not None:
            raise ConfigError(f"prime_rl_config: lora {name}={inner!r} is invalid: {why}")
    put(config, "trainer.model.lora", {**schema.get(config, "trainer.model.lora", {}), **table})
    written["trainer.model.lora"] = (table, "lora")


# ----------------------------------------------------------------- the last pass: batch, renderer, cross-checks
def finish(config: dict[str, Any], ctx: Context, plan: Plan) -> None:
    _knob_values(plan)
    _batch(config, plan)
    _renderer(config, ctx, plan)
    _seq_len(config, plan)
    _no_lag(config, plan)
    found = _cross_check(config) + schema.problems(config)
    if found:
        raise ConfigError("prime_rl_config: the config would not validate: " + "; ".join(found))


def _knob_values(plan: Plan) -> None:
    """A knob value prime-rl's key does not take (temperature 3.0 > 2.0) is named by its knob."""
    for path, (value, tag) in plan.keys.items():
        why = schema.type_problem(schema.KEYS[path], value)
        if why is not None and path not in plan.overridden:
            raise ConfigError(f"prime_rl_config: {tag}={value!r} cannot be written: it goes to {path}, which "
                              f"at {PINNED_SHORT} {why}; set {tag} within that range")


def _batch(config: dict[str, Any], plan: Plan) -> None:
    """Keep batch_size (rollouts per step) a multiple of group_size; only the pinned default is moved."""
    orchestrator = config["orchestrator"]
    chosen = "orchestrator.batch_size" in plan.overridden
    if "token_batch_size" in orchestrator:
        if not chosen:
            del orchestrator["batch_size"]
        return
    k, batch = group_size(config), orchestrator["batch_size"]
    if batch % k == 0:
        return
    if chosen:
        raise ConfigError(f"prime_rl_config: orchestrator.batch_size={batch} is not a multiple of group_size={k}: "
                          f"batch_size counts rollouts, group_size rollouts per prompt; use {max(k, batch // k * k)} "
                          f"or {(batch // k + 1) * k}")
    fitted = max(k, round(batch / k) * k)
    orchestrator["batch_size"] = fitted
    plan.warnings.append(f"orchestrator.batch_size set to {fitted} ({plural(fitted // k, 'prompt')} x group_size {k}): "
                         f"prime-rl's default {batch} is not a multiple of {k}.")


def _renderer(config: dict[str, Any], ctx: Context, plan: Plan) -> None:
    """A renderer prime-rl validates: 'auto' for a model id in the renderers map, else 'default' (or the user's)."""
    model_id = schema.get(config, "tokenizer.name") or ctx.model
    chosen = schema.get(config, "orchestrator.renderer.name", "auto")
    parsers = [path.rsplit(".", 1)[1] for path in schema.PARSER_KEYS if schema.get(config, path) is not None]
    if chosen == "auto" and model_id in schema.RENDERER_MAP:
        if parsers:
            raise ConfigError(_parser_refusal(parsers, f"'auto', which resolves {model_id!r} to "
                                                       f"{schema.RENDERER_MAP[model_id]!r} (the renderers map)"))
        return
    if chosen == "auto":
        chosen = "default"
        put(config, "orchestrator.renderer.name", chosen)
        plan.warnings.append(
            f"{model_id!r} is not in the renderers map ({schema.RENDERERS_PINNED}, MODEL_RENDERER_MAP: exact ids), "
            "where 'auto' fails prime-rl's validation: orchestrator.renderer.name = 'default', the model's own chat "
            "template (prime-rl's advice for fine-tunes). If the taskset passes tools, also set "
            "orchestrator.renderer.tool_parser; if the model shares a mapped family's template, set "
            "orchestrator.renderer.name to that family instead (e.g. 'qwen3', 'qwen3.5', 'llama-3').")
    elif chosen != "default" and parsers:
        raise ConfigError(_parser_refusal(parsers, repr(chosen)))
    elif chosen not in schema.RENDERER_NAMES:
        plan.warnings.append(f"orchestrator.renderer.name = {chosen!r} is not a renderer the writer knows "
                             f"({', '.join(schema.RENDERER_NAMES)}); prime-rl checks it against the renderers "
                             "package's RendererConfig at launch (`uv run rl @ rl.toml --dry-run` shows it).")
    if config["orchestrator"]["algo"]["type"] == "opsd":  # its hint block must use the policy's renderer
        config["orchestrator"]["algo"].setdefault("renderer", {"name": chosen})


def _parser_refusal(parsers: list[str], renderer: str) -> str:
    return (f"prime_rl_config: orchestrator.renderer.{' and '.join(parsers)} is set, but the renderer is {renderer}: "
            f"{' and '.join(parsers)} exist only on the 'default' renderer (renderers' DefaultRendererConfig, which "
            "runs the model's own chat template), and prime-rl cannot resolve them on another. Drop them to keep "
            "that renderer (it parses tool calls and reasoning itself), or also set "
            "orchestrator.renderer.name=default")


def _seq_len(config: dict[str, Any], plan: Plan) -> None:
    cap = schema.get(config, "orchestrator.train.sampling.max_completion_tokens")
    seq_len = config["seq_len"]
    if isinstance(cap, int) and cap >= seq_len:
        plan.warnings.append(f"max_completion_tokens {cap} >= seq_len {seq_len}: a rollout longer than seq_len is "
                             f"cut when packed, so the cap is not reached; set seq_len (e.g. seq_len={cap + 2048}) "
                             "or lower max_tokens on the method.")


def _no_lag(config: dict[str, Any], plan: Plan) -> None:
    if schema.get(config, "orchestrator.max_off_policy_steps") == 0:
        plan.warnings.append("max_off_policy_steps = 0 while prime-rl always samples one step ahead (TARGET_LAG = 1, "
                             "prime_rl/orchestrator/orchestrator.py): rollouts one version old may all be dropped, and "
                             "whether such a run trains or starves is untested; a bound of 1 or more covers the "
                             "fixed lag.")


def _cross_check(config: dict[str, Any]) -> list[str]:
    """prime-rl's own cross-field rules (reference section 5) that a writer can see before launch."""
    found = []
    orchestrator = config["orchestrator"]
    if "batch_size" in orchestrator and "token_batch_size" in orchestrator:
        found.append("set orchestrator.batch_size or orchestrator.token_batch_size, not both")
    k = group_size(config)
    for name in ("max_inflight", "initial_inflight"):
        value = schema.get(config, f"orchestrator.concurrency.{name}")
        if isinstance(value, int) and value < k:
            found.append(f"orchestrator.concurrency.{name}={value} must be >= group_size={k}")
    broadcast = schema.get(config, "weight_broadcast.type")
    if schema.get(config, "trainer.model.lora") is not None and broadcast in ("nccl", "nixl"):
        found.append(f"LoRA needs the filesystem weight broadcast, not weight_broadcast.type={broadcast!r}")
    if schema.get(config, "monitors.wandb.offline") is True:
        found.append("monitors.wandb.offline = true is rejected at the shared level")
    found += _scheduler_check(config) + _deployment_check(config) + _implementation_check(config)
    protected = {"CUDA_VISIBLE_DEVICES", "PRL_RUN_ID", "PRL_RUN_NAME", "WANDB_RUN_ID", "WANDB_SHARED_MODE",
                 "WANDB_SHARED_LABEL", "WANDB_SHARED_PRIMARY", "WANDB_SHARED_FINISHER"}
    found += [f"env_vars may not set {name}" for name in config.get("env_vars", {}) if name in protected]
    port = schema.get(config, "inference.server.port", schema.KEYS["inference.server.port"].default)
    url = schema.get(config, "orchestrator.model.client.base_url", schema.KEYS["orchestrator.model.client.base_url"].default)
    if (urlparse(url).port or 80) != port:
        found.append(f"orchestrator.model.client.base_url {url} must use inference.server.port {port}")
    return found


def _scheduler_check(config: dict[str, Any]) -> list[str]:
    kind = schema.get(config, "trainer.scheduler.type", "constant")
    steps = config.get("max_steps")
    warmup = schema.get(config, "trainer.scheduler.warmup_steps", 10)
    decay = schema.get(config, "trainer.scheduler.decay_steps", 10) if kind == "linear" else 0
    if kind == "constant":
        return []
    if not isinstance(steps, int):
        return [f"trainer.scheduler.type={kind!r} needs max_steps"]
    if kind == "cosine" and warmup >= steps:
        return [f"cosine warmup_steps={warmup} must be < max_steps={steps}"]
    if kind == "linear" and warmup + decay > steps:
        return [f"linear warmup_steps + decay_steps = {warmup + decay} must be <= max_steps={steps}"]
    return []


def _implementation_check(config: dict[str, Any]) -> list[str]:
    """trainer.model.impl against attn and trust_remote_code (prime_rl/configs/trainer.py, ModelConfig validators)."""
    impl = schema.get(config, "trainer.model.impl", "auto")
    attn = schema.get(config, "trainer.model.attn", "auto")
    found = []
    if impl not in ("custom", "auto") and attn in ("flash_attention_4", "auto"):
        found.append(f"trainer.model.impl={impl!r} needs trainer.model.attn set to 'flash_attention_2' or "
                     f"'flash_attention_3', not {attn!r}: attn 'auto' may pick flash attention 4 (on Blackwell), "
                     "which only the custom implementation runs (flash_attention_4_only_with_custom_impl); add "
                     "trainer.model.attn=flash_attention_2 (any GPU flash-attn 2 supports) or flash_attention_3 "
                     "(Hopper), or leave impl at 'auto'")
    if impl == "custom" and schema.get(config, "trainer.model.trust_remote_code") is True:
        found.append("trainer.model.trust_remote_code = true needs trainer.model.impl 'hf' or 'auto', not 'custom' "
                     "(trust_remote_code_only_with_hf)")
    return found


def _deployment_check(config: dict[str, Any]) -> list[str]:
    kind = schema.get(config, "deployment.type", "single_node")
    if kind == "multi_node":
        return [] if "slurm" in config else ["deployment.type='multi_node' needs a [slurm] table"]
    per_node = schema.get(config, "deployment.gpus_per_node", 8)
    used = schema.get(config, "deployment.num_train_gpus", 1) + schema.get(config, "deployment.num_infer_gpus", 1)
    return [] if used <= per_node else [f"num_train_gpus + num_infer_gpus = {used} exceeds gpus_per_node={per_node}"]
