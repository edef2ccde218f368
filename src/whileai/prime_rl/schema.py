"""The one table of prime-rl config keys the writer may emit, read at one pinned commit.

prime-rl validates its combined ``RLConfig`` with ``extra="forbid"`` everywhere except
``[inference.vllm]``, and its schema changes every few weeks, so the writer targets one commit
(``PINNED``) and may only emit a key declared here. Each ``Key`` says where the field lives in
prime-rl (file and class), its type, the pinned default and, for fields of a discriminated union
(``trainer.loss``, ``orchestrator.algo``, ...), which variant it belongs to.

Paths are dotted; ``[]`` marks the element of an array of tables (``orchestrator.train.source[]``).
Facts are from the reference page ``shared/reference/prime-rl.md`` (sections 1-5).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

PINNED = {
    "repo": "PrimeIntellect-ai/prime-rl",
    "commit": "559b44772e471d1538537b8805cc77f3824a5e64",
    "tag": "v0.8.1.dev67",
    "date": "2026-08-21",
    "configs_package": "prime-rl-configs 0.4.0",
}
PINNED_SHORT = f"prime-rl {PINNED['tag']} ({PINNED['commit'][:9]})"

# files in prime-rl, as the messages name them
RL = "prime_rl/configs/rl.py::RLConfig"
TRAINER = "prime_rl/configs/trainer.py::TrainerConfig"
ORCH = "prime_rl/configs/orchestrator.py::OrchestratorConfig"
ALGO = "prime_rl/configs/algorithm.py"
INFER = "prime_rl/configs/inference.py::InferenceConfig"
ENV = "verifiers/v1/configs (EnvConfig, TasksetConfig, AgentConfig)"

SEQ_LEN_DEFAULT = 2048  # trainer.model.seq_len and orchestrator.seq_len; the shared key itself defaults to None
NO_DEFAULT: Any = type("NoDefault", (), {"__repr__": lambda self: "no default"})()
SOURCE = "orchestrator.train.source[]"


@dataclass(frozen=True)
class Key:
    """One key of the pinned schema."""

    path: str
    kind: str  # table, open-table, int, float, str, bool, list[str], dict[str,str]
    default: Any
    where: str
    doc: str = ""
    nullable: bool = False  # accepts None, written as the string "None"
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # the value must be > low (not >=)
    high_open: bool = False  # the value must be < high (not <=)
    variant: tuple[str, tuple[str, ...]] | None = None  # (discriminator path, variants it belongs to)


def _keys() -> list[Key]:
    loss_default = ("trainer.loss.type", ("default",))
    loss_both = ("trainer.loss.type", ("default", "ipo"))
    decaying = ("trainer.scheduler.type", ("linear", "cosine"))
    return [
        # ---- top level (RLConfig); shared fields are written here once and copied down by prime-rl
        Key("model", "table", NO_DEFAULT, RL, "shared model"),
        Key("model.name", "str", "Qwen/Qwen3-0.6B", RL, "fills trainer/orchestrator model.name and inference.vllm.model"),
        Key("seq_len", "int", None, RL, "fills trainer.model.seq_len and orchestrator.seq_len (both default 2048)",
            low=1),
        Key("max_steps", "int", None, RL, "fills trainer/orchestrator max_steps", nullable=True, low=1),
        Key("output_dir", "str", "outputs", RL, "the run writes to output_dir/run.name"),
        Key("clean", "bool", False, RL, "wipe the run directory first"),
        Key("dry_run", "bool", False, RL, "write the resolved configs and stop"),
        Key("run", "table", NO_DEFAULT, RL),
        Key("run.name", "str", None, RL, "predictable run directory; needed to resume", nullable=True),
        Key("run.dir", "str", None, RL, nullable=True),
        Key("log", "table", NO_DEFAULT, RL),
        Key("log.level", "str", None, RL, "its allowed names are not in the reference: unchecked", nullable=True),
        Key("log.json_logging", "bool", False, RL),
        Key("env_vars", "dict[str,str]", {}, RL, "environment variables for every component"),
        Key("ckpt", "table", None, "prime_rl/configs/rl.py::SharedCheckpointConfig",
            "an empty table checkpoints at the end only"),
        Key("ckpt.interval", "int", None, RL, nullable=True, low=1),
        Key("ckpt.keep_last", "int", None, RL, nullable=True, low=1),
        Key("ckpt.keep_interval", "int", None, RL, nullable=True, low=1),
        Key("ckpt.output_dir", "str", None, RL, nullable=True),
        Key("resume", "table", None, "prime_rl/configs/rl.py::ResumeConfig", "an empty table resumes from the latest"),
        Key("resume.step", "int", None, RL, nullable=True, low=1),
        Key("resume.dir", "str", None, RL, nullable=True),
        Key("monitors", "table", NO_DEFAULT, RL),
        Key("monitors.wandb", "table", None, RL),
        Key("monitors.wandb.project", "str", "prime-rl", RL),
        Key("monitors.wandb.entity", "str", None, RL, nullable=True),
        Key("monitors.wandb.name", "str", None, RL, nullable=True),
        Key("monitors.wandb.group", "str", None, RL, nullable=True),
        Key("monitors.wandb.tags", "list[str]", [], RL),
        Key("monitors.wandb.offline", "bool", False, RL, "true is rejected at the shared level"),
        Key("monitors.file", "table", None, RL),
        Key("monitors.file.path", "str", "metrics.jsonl", RL),
        Key("tokenizer", "table", None, RL),
        Key("tokenizer.name", "str", None, RL, nullable=True),
        Key("tokenizer.trust_remote_code", "bool", False, RL),
        Key("tokenizer.chat_template", "str", None, RL, nullable=True),
        Key("weight_broadcast", "table", None, RL, "auto: nccl with [inference] and no LoRA, else filesystem"),
        Key("weight_broadcast.type", "str", "filesystem", RL, choices=("filesystem", "nccl", "nixl")),
        Key("deployment", "table", NO_DEFAULT, RL),
        Key("deployment.type", "str", "single_node", RL, choices=("single_node", "multi_node")),
        Key("deployment.gpus_per_node", "int", 8, RL, low=1),
        Key("deployment.num_train_gpus", "int", 1, RL, low=1, variant=("deployment.type", ("single_node",))),
        Key("deployment.num_infer_gpus", "int", 1, RL, low=0, variant=("deployment.type", ("single_node",))),
        Key("deployment.num_train_nodes", "int", NO_DEFAULT, RL, low=1, variant=("deployment.type", ("multi_node",))),
        Key("deployment.num_infer_nodes", "int", None, RL, nullable=True, low=1,
            variant=("deployment.type", ("multi_node",))),
        Key("deployment.num_infer_replicas", "int", 1, RL, low=1, variant=("deployment.type", ("multi_node",))),
        Key("slurm", "table", None, RL, "multi-node runs are submitted as a SLURM job"),
        Key("slurm.job_name", "str", "prime-rl", RL),
        Key("slurm.project_dir", "str", ".", RL),
        Key("slurm.partition", "str", "cluster", RL),
        Key("slurm.account", "str", None, RL, nullable=True),
        Key("slurm.time", "str", None, RL, nullable=True),
        Key("slurm.pre_run_command", "str", None, RL, nullable=True),
        # ---- [trainer] (required table)
        Key("trainer", "table", NO_DEFAULT, TRAINER, "required: validation fails without it"),
        Key("trainer.model", "table", NO_DEFAULT, TRAINER),
        Key("trainer.model.trust_remote_code", "bool", False, TRAINER),
        Key("trainer.model.attn", "str", "auto", TRAINER,
            choices=("auto", "flash_attention_2", "flash_attention_3", "flash_attention_4")),
        Key("trainer.model.impl", "str", "auto", TRAINER, choices=("auto", "hf", "custom")),
        Key("trainer.model.optim_cpu_offload", "bool", True, TRAINER),
        Key("trainer.model.lora", "table", None, TRAINER, "an empty table enables LoRA with its defaults"),
        Key("trainer.model.lora.rank", "int", 16, TRAINER, low=1),
        Key("trainer.model.lora.alpha", "float", 32.0, TRAINER, low=0.0),
        Key("trainer.model.lora.dropout", "float", 0.0, TRAINER, low=0.0, high=1.0),
        Key("trainer.model.lora.target_modules", "list[str]",
            ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "experts",
             "fc1_latent_proj", "fc2_latent_proj"], TRAINER, "names missing from the model are silently ignored"),
        Key("trainer.model.lora.modules_to_save", "list[str]", [], TRAINER),
        Key("trainer.optim", "table", NO_DEFAULT, TRAINER),
        Key("trainer.optim.type", "str", "adamw", TRAINER, choices=("adamw", "sgd", "muon", "sign_sgd")),
        Key("trainer.optim.lr", "float", 1e-6, TRAINER, low=0.0),
        Key("trainer.optim.weight_decay", "float", 0.01, TRAINER, low=0.0),
        Key("trainer.optim.max_norm", "float", 1.0, TRAINER, nullable=True, low=0.0),
        Key("trainer.optim.betas1", "float", 0.9, TRAINER, variant=("trainer.optim.type", ("adamw", "muon"))),
        Key("trainer.optim.betas2", "float", 0.999, TRAINER, variant=("trainer.optim.type", ("adamw", "muon"))),
        Key("trainer.scheduler", "table", NO_DEFAULT, TRAINER),
        Key("trainer.scheduler.type", "str", "constant", TRAINER, choices=("constant", "linear", "cosine")),
        Key("trainer.scheduler.warmup_steps", "int", 10, TRAINER, low=0, variant=decaying),
        Key("trainer.scheduler.decay_steps", "int", 10, TRAINER, low=0,
            variant=("trainer.scheduler.type", ("linear",))),
        Key("trainer.scheduler.min_lr", "float", 0.0, TRAINER, low=0.0, variant=decaying),
        Key("trainer.loss", "table", NO_DEFAULT, "prime_rl/configs/trainer.py (loss union; trainer/rl/loss.py)"),
        Key("trainer.loss.type", "str", "default", TRAINER, "the rl component's loss", choices=("default", "ipo")),
        Key("trainer.loss.dppo_mask_low", "float", 0.2, TRAINER, "mask a negative-advantage token whose "
            "probability fell by more than this", low=0.0, variant=loss_default),
        Key("trainer.loss.dppo_mask_high", "float", 0.2, TRAINER, "mask a positive-advantage token whose "
            "probability rose by more than this", low=0.0, variant=loss_default),
        Key("trainer.loss.ipo_threshold", "float", 0.1, TRAINER, "mask a token whose probability moved by more "
            "than this, either way", low=0.0, variant=("trainer.loss.type", ("ipo",))),
        Key("trainer.loss.adv_tau", "float", 1.0, TRAINER, "multiplier on the advantage", variant=loss_both),
        Key("trainer.loss.kl_tau", "float", 1e-3, TRAINER, "trainer/inference log-ratio^2 weight (not a KL to a "
            "reference)", low=0.0, variant=loss_both),
        # ---- [orchestrator] (required table)
        Key("orchestrator", "table", NO_DEFAULT, ORCH, "required: validation fails without it"),
        Key("orchestrator.batch_size", "int", 128, ORCH, "rollouts per step (not prompts); a multiple of "
            "group_size", low=1),
        Key("orchestrator.token_batch_size", "int", None, ORCH, "set this or batch_size, not both",
            nullable=True, low=1),
        Key("orchestrator.group_size", "int", 1, ORCH, "rollouts per example", low=1),
        Key("orchestrator.max_off_policy_steps", "int", 8, ORCH, "drop rollouts more than this many policy "
            "versions old", low=0),
        Key("orchestrator.tasks_per_minute", "int", None, ORCH, nullable=True, low=1),
        Key("orchestrator.concurrency", "table", NO_DEFAULT, ORCH),
        Key("orchestrator.concurrency.initial_inflight", "int", None, ORCH, nullable=True, low=1),
        Key("orchestrator.concurrency.min_inflight", "int", 1, ORCH, low=1),
        Key("orchestrator.concurrency.max_inflight", "int", 1024, ORCH, "must be >= group_size", low=1),
        Key("orchestrator.collect_inference_metrics", "bool", True, ORCH),
        Key("orchestrator.model", "table", NO_DEFAULT, ORCH),
        Key("orchestrator.model.trust_remote_code", "bool", False, ORCH),
        Key("orchestrator.model.client", "table", NO_DEFAULT, "prime_rl/configs/shared.py::ClientConfig"),
        Key("orchestrator.model.client.base_url", "str", "http://localhost:8000/v1", ORCH,
            "its port must equal inference.server.port at launch"),
        Key("orchestrator.model.client.api_key_var", "str", "VLLM_API_KEY", ORCH),
        Key("orchestrator.renderer", "table", NO_DEFAULT, ORCH),
        Key("orchestrator.renderer.name", "str", "auto", ORCH, "'auto' only for model ids in the renderers map"),
        Key("orchestrator.renderer.tool_parser", "str", None, ORCH, "renderers' DefaultRendererConfig only",
            nullable=True, variant=("orchestrator.renderer.name", ("default",))),
        Key("orchestrator.renderer.reasoning_parser", "str", None, ORCH, "renderers' DefaultRendererConfig only",
            nullable=True, variant=("orchestrator.renderer.name", ("default",))),
        Key("orchestrator.train", "table", NO_DEFAULT, ORCH),
        Key("orchestrator.train.filter_zero_advantages", "bool", True, ORCH, "drop zero-advantage rl tokens"),
        Key("orchestrator.train.sampling", "table", NO_DEFAULT, ORCH),
        Key("orchestrator.train.sampling.temperature", "float", 1.0, ORCH, low=0.0, high=2.0),
        Key("orchestrator.train.sampling.max_completion_tokens", "int", None, ORCH, "per turn", nullable=True,
            low=1),
        # ---- [orchestrator.algo]: a union on type
        Key("orchestrator.algo", "table", NO_DEFAULT, ALGO, "the advantage/loss-routing algorithm"),
        Key("orchestrator.algo.type", "str", "grpo", ALGO, choices=("grpo", "max_rl", "rae", "opd", "opsd", "sft")),
        Key("orchestrator.algo.decay", "float", 0.95, f"{ALGO}::RAEConfig", "EMA baseline decay", low=0.0,
            high=1.0, high_open=True, variant=("orchestrator.algo.type", ("rae",))),
        Key("orchestrator.algo.teacher", "table", NO_DEFAULT, f"{ALGO}::FrozenModelConfig", "required by opd",
            variant=("orchestrator.algo.type", ("opd",))),
        Key("orchestrator.algo.teacher.name", "str", NO_DEFAULT, f"{ALGO}::FrozenModelConfig",
            variant=("orchestrator.algo.type", ("opd",))),
        Key("orchestrator.algo.teacher.base_url", "str", NO_DEFAULT, f"{ALGO}::FrozenModelConfig",
            "must be set explicitly", variant=("orchestrator.algo.type", ("opd",))),
        Key("orchestrator.algo.teacher.api_key_var", "str", "VLLM_API_KEY", f"{ALGO}::FrozenModelConfig",
            "the name of an environment variable", variant=("orchestrator.algo.type", ("opd",))),
        Key("orchestrator.algo.demo_key", "str", "demonstration", f"{ALGO}::OPSDConfig",
            "info field holding the privileged text", variant=("orchestrator.algo.type", ("opsd",))),
        Key("orchestrator.algo.template", "str", "Here is an example of an expert response:\n<demonstration>\n"
            "{demonstration}\n</demonstration>", f"{ALGO}::OPSDConfig", variant=("orchestrator.algo.type", ("opsd",))),
        Key("orchestrator.algo.renderer", "table", NO_DEFAULT, f"{ALGO}::OPSDConfig",
            variant=("orchestrator.algo.type", ("opsd",))),
        Key("orchestrator.algo.renderer.name", "str", "auto", f"{ALGO}::OPSDConfig",
            variant=("orchestrator.algo.type", ("opsd",))),
        Key("orchestrator.algo.sampling", "table", NO_DEFAULT, ALGO, variant=("orchestrator.algo.type", ("sft",))),
        Key("orchestrator.algo.sampling.source", "table", "policy", ALGO, "sft needs a frozen model here",
            variant=("orchestrator.algo.type", ("sft",))),
        Key("orchestrator.algo.sampling.source.name", "str", NO_DEFAULT, f"{ALGO}::FrozenModelConfig",
            variant=("orchestrator.algo.type", ("sft",))),
        Key("orchestrator.algo.sampling.source.base_url", "str", NO_DEFAULT, f"{ALGO}::FrozenModelConfig",
            variant=("orchestrator.algo.type", ("sft",))),
        Key("orchestrator.algo.sampling.source.api_key_var", "str", "VLLM_API_KEY", f"{ALGO}::FrozenModelConfig",
            variant=("orchestrator.algo.type", ("sft",))),
        # ---- [[orchestrator.train.source]]: one per taskset
        Key("orchestrator.train.source", "list[table]", [], ORCH, "an array of tables, one per train source"),
        Key(f"{SOURCE}.name", "str", None, "prime_rl/configs/orchestrator.py::TrainSourceConfig",
            "unique per source; defaults to the taskset id"),
        Key(f"{SOURCE}.ratio", "float", 1.0, "prime_rl/configs/orchestrator.py::TrainSourceConfig", low=0.0,
            low_open=True),
        Key(f"{SOURCE}.env", "table", NO_DEFAULT, ENV),
        Key(f"{SOURCE}.env.taskset", "open-table", NO_DEFAULT, ENV, "id plus the taskset package's own fields"),
        Key(f"{SOURCE}.env.taskset.id", "str", NO_DEFAULT, ENV, "an installed taskset package ('-' becomes '_')"),
        Key(f"{SOURCE}.env.taskset.system_prompt", "str", None, ENV, nullable=True),
        Key(f"{SOURCE}.env.agent", "table", NO_DEFAULT, ENV),
        Key(f"{SOURCE}.env.agent.max_turns", "int", None, ENV, nullable=True, low=1),
        Key(f"{SOURCE}.env.agent.harness", "table", None, ENV),
        Key(f"{SOURCE}.env.agent.harness.id", "str", "bash", ENV, "'null' means plain model turns, no tools"),
        Key(f"{SOURCE}.env.agent.runtime", "table", NO_DEFAULT, ENV),
        Key(f"{SOURCE}.env.agent.runtime.type", "str", "prime", ENV, "'prime' provisions remote sandboxes",
            choices=("subprocess", "docker", "prime", "modal")),
        # ---- [inference]: present, or vLLM is never started
        Key("inference", "table", None, INFER, "always written: without it the launcher starts no vLLM"),
        Key("inference.server", "table", NO_DEFAULT, INFER),
        Key("inference.server.port", "int", 8000, INFER, low=1, high=65535),
        Key("inference.vllm", "open-table", NO_DEFAULT, INFER, "extra='allow': any vLLM engine argument passes"),
        Key("inference.vllm.gpu_memory_utilization", "float", 0.9, INFER, low=0.0, high=1.0),
        Key("inference.vllm.max_model_len", "int", None, INFER, nullable=True, low=1),
        Key("inference.vllm.tensor_parallel_size", "int", 1, INFER, low=1),
        Key("inference.vllm.enforce_eager", "bool", False, INFER),
        Key("inference.vllm.dtype", "str", "auto", INFER),
    ]


KEYS: dict[str, Key] = {k.path: k for k in _keys()}

# A sub-config field that prime-rl fills from a shared top-level key (propagate_shared_fields, reference
# section 1.3). The writer writes the top-level key once; a sub-config override is moved up to it.
_SPREAD: dict[str, tuple[str, ...]] = {
    "model.name": ("trainer.model.name", "orchestrator.model.name", "inference.vllm.model"),
    "seq_len": ("trainer.model.seq_len", "orchestrator.seq_len"),
    "ckpt.output_dir": ("trainer.ckpt.output_dir",),
    "tokenizer.chat_template": ("trainer.tokenizer.chat_template", "orchestrator.tokenizer.chat_template",
                                "inference.vllm.chat_template"),
    **{top: (f"trainer.{top}", f"orchestrator.{top}") for top in (
        "max_steps", "ckpt.interval", "ckpt.keep_last", "ckpt.keep_interval", "tokenizer.name",
        "tokenizer.trust_remote_code", "monitors.file.path",
        *(f"monitors.wandb.{name}" for name in ("project", "entity", "name", "group", "tags", "offline")))},
    **{top: (f"trainer.{top}", f"orchestrator.{top}", f"inference.{top}") for top in ("log.level", "log.json_logging")},
}
SHARED: dict[str, str] = {sub: top for top, subs in _SPREAD.items() for sub in subs}

# Fields the `rl` launcher sets itself; writing them fails or is overwritten (reference section 5).
AUTO_SET: dict[str, str] = {
    "orchestrator.num_train_workers": "set by the rl launcher from the deployment",
    "orchestrator.pad_to_multiple_of": "set to trainer.model.cp by the rl launcher",
    "trainer.output_dir": "must equal output_dir/run.name; set by the rl launcher",
    "orchestrator.output_dir": "must equal output_dir/run.name; set by the rl launcher",
    "inference.vllm.data_parallel_size": "set to num_infer_gpus // tensor_parallel_size on a single node",
    "inference.vllm.api_server_count": "set by the rl launcher (1 under LoRA)",
    "inference.vllm.enable_lora": "set from [trainer.model.lora]",
    "inference.vllm.max_lora_rank": "set from trainer.model.lora.rank, rounded up to a vLLM rank",
    "orchestrator.model.lora": "filled from [trainer.model.lora]",
}

# prime-rl validates orchestrator.renderer.name = "auto" only for a model id that is an exact key of
# renderers.base.MODEL_RENDERER_MAP (prime_rl/configs/orchestrator.py, validate_renderer_auto_resolves);
# the id is tokenizer.name when set, else model.name. This is that map at the renderers commit prime-rl
# pins (deps/renderers @ 2846a3dc, renderers/base.py), copied key for key: exact ids, no prefixes.
RENDERERS_PINNED = "renderers 2846a3dc (deps/renderers of the pinned prime-rl)"
RENDERER_MAP: dict[str, str] = {
    **{f"Qwen/Qwen3-{size}": "qwen3" for size in (
        "0.6B", "1.7B", "4B", "4B-Instruct-2507", "4B-Thinking-2507", "8B", "14B", "32B", "30B-A3B",
        "30B-A3B-Instruct-2507", "30B-A3B-Thinking-2507", "235B-A22B")},
    "PrimeIntellect/Qwen3-0.6B": "prime-qwen3", "PrimeIntellect/Qwen3-1.7B": "prime-qwen3",
    **{f"Qwen/Qwen3.5-{size}": "qwen3.5" for size in ("0.8B", "2B", "4B", "9B", "35B-A3B", "122B-A10B",
                                                       "397B-A17B")},
    "Qwen/Qwen3.6-35B-A3B": "qwen3.6",
    **{f"Qwen/Qwen3-VL-{size}-Instruct": "qwen3-vl" for size in ("4B", "8B", "30B-A3B")},
    "zai-org/GLM-5": "glm-5", "zai-org/GLM-5-FP8": "glm-5", "zai-org/GLM-4.7-Flash": "glm-5",
    "zai-org/GLM-5.1": "glm-5.1", "THUDM/GLM-4.5-Air": "glm-4.5", "zai-org/GLM-4.5-Air": "glm-4.5",
    "MiniMaxAI/MiniMax-M2": "minimax-m2", "MiniMaxAI/MiniMax-M2.5": "minimax-m2",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3", "deepseek-ai/DeepSeek-V3-Base": "deepseek-v3",
    "deepseek-ai/DeepSeek-R1": "deepseek-r1", "deepseek-ai/DeepSeek-R1-0528": "deepseek-r1",
    "moonshotai/Kimi-K2-Instruct": "kimi-k2", "moonshotai/Kimi-K2.5": "kimi-k2.5", "moonshotai/Kimi-K2.6": "kimi-k2.5",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "nemotron-3",
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16": "nemotron-3",
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16": "nemotron-3-ultra",
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8": "nemotron-3-ultra",
    "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16": "nemotron-3.5",
    "meta-llama/Llama-3.2-1B-Instruct": "llama-3", "meta-llama/Llama-3.2-3B-Instruct": "llama-3",
    "poolside/Laguna-XS.2": "laguna-xs.2", "poolside/Laguna-M.1": "laguna-m.1",
    "poolside/Laguna-XS-2.1": "laguna-xs-2.1",
    "openai/gpt-oss-20b": "gpt-oss", "openai/gpt-oss-120b": "gpt-oss",
    "tencent/Hy3": "hy3", "tencent/Hy3-FP8": "hy3",
}
# Renderer names the writer knows: the two generic ones and every family the map routes to. Only "default"
# (renderers' DefaultRendererConfig: the model's own chat template) has tool_parser / reasoning_parser.
RENDERER_NAMES: tuple[str, ...] = ("auto", "default", *sorted(set(RENDERER_MAP.values())))
PARSER_KEYS = ("orchestrator.renderer.tool_parser", "orchestrator.renderer.reasoning_parser")

# Each taskset package declares its own config class; these are the fields (with their value rules) of the
# tasksets read at the pinned verifiers (deps/verifiers @ a60a606, environments/<name>/<name>/taskset.py).
# A taskset not listed here is written unchecked, with a warning.
_VF = "verifiers:environments"
TASKSET_FIELDS: dict[str, dict[str, Key]] = {
    "reverse-text": {
        "dataset_name": Key("dataset_name", "str", "PrimeIntellect/Reverse-Text-RL",
                            f"{_VF}/reverse_text/reverse_text/taskset.py::ReverseTextConfig"),
        "dataset_split": Key("dataset_split", "str", "train",
                             f"{_VF}/reverse_text/reverse_text/taskset.py::ReverseTextConfig"),
    },
    "gsm8k": {"split": Key("split", "str", "test", f"{_VF}/gsm8k/gsm8k/taskset.py::GSM8KConfig",
                           choices=("train", "test"))},
    "alphabet-sort": {
        name: Key(name, "int", default, f"{_VF}/alphabet_sort/alphabet_sort/taskset.py::AlphabetSortConfig", low=1)
        for name, default in (("min_turns", 1), ("max_turns", 3), ("min_names_per_turn", 1),
                              ("max_names_per_turn", 5))
    } | {"split": Key("split", "str", "train", f"{_VF}/alphabet_sort/alphabet_sort/taskset.py::AlphabetSortConfig",
                      choices=("train",))},
    "math-env": {  # from examples/basic/hendrycks-sanity/rl.toml; the class itself was not available
        "dataset_name": Key("dataset_name", "str", NO_DEFAULT, "prime-envs math-env (unverified)"),
        "dataset_subset": Key("dataset_subset", "str", NO_DEFAULT, "prime-envs math-env (unverified)"),
    },
}
# Pairs a taskset requires in order (low <= high), with the check's source; alphabet-sort asserts both at load.
TASKSET_ORDER: dict[str, tuple[tuple[str, str], ...]] = {
    "alphabet-sort": (("min_turns", "max_turns"), ("min_names_per_turn", "max_names_per_turn")),
}
TASKSET_COMMON = ("id", "system_prompt", "task")  # verifiers/v1/configs/taskset.py::TasksetConfig


def lookup(path: str) -> Key | None:
    """The key at ``path``, or None. Children of an open table resolve to the open table."""
    if path in KEYS:
        return KEYS[path]
    parent = path.rsplit(".", 1)[0] if "." in path else ""
    while parent:
        key = KEYS.get(parent)
        if key is not None:
            return key if key.kind == "open-table" else None
        parent = parent.rsplit(".", 1)[0] if "." in parent else ""
    return None


def suggest(path: str) -> str:
    """' (did you mean ...?)' for the closest declared keys, or ''."""
    close = difflib.get_close_matches(path, [*KEYS, *SHARED], n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def walk(config: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every (path, value) of a nested config, tables included; array elements get the ``[]`` path."""
    for name, value in config.items():
        path = f"{prefix}{name}"
        yield path, value
        if isinstance(value, dict):
            yield from walk(value, path + ".")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                yield from walk(item, path + "[].")


def type_problem(key: Key, value: Any) -> str | None:
    """Why ``value`` does not fit ``key``, or None."""
    if value == "None" and key.nullable:
        return None
    expected: Any = {"int": int, "float": (int, float), "str": str, "bool": bool, "table": dict, "open-table": dict,
                "list[str]": list, "dict[str,str]": dict, "list[table]": list}[key.kind]
    if isinstance(value, bool) and key.kind in ("int", "float"):
        return f"must be {key.kind}, got a bool"
    if not isinstance(value, expected):
        return f"must be {key.kind}{' or None' if key.nullable else ''}, got {type(value).__name__} {value!r}"
    if key.kind == "list[str]" and not all(isinstance(v, str) for v in value):
        return f"must be a list of strings, got {value!r}"
    if key.kind == "dict[str,str]" and not all(isinstance(v, str) for v in value.values()):
        return f"must map names to strings, got {value!r}"
    if key.choices and value not in key.choices:
        return f"must be one of {', '.join(repr(c) for c in key.choices)}, got {value!r}"
    if isinstance(value, (int, float)):
        if key.low is not None and (value < key.low or (key.low_open and value == key.low)):
            return f"must be {'>' if key.low_open else '>='} {key.low}, got {value!r}"
        if key.high is not None and (value > key.high or (key.high_open and value == key.high)):
            return f"must be {'<' if key.high_open else '<='} {key.high}, got {value!r}"
    return None


def problems(config: dict[str, Any]) -> list[str]:
    """Every key of ``config`` that the pinned schema does not declare, or whose value does not fit it."""
    found = []
    for path, value in walk(config):
        key = lookup(path)
        if key is None:
            found.append(f"{path} is not a key of {PINNED_SHORT}{suggest(path)}")
            continue
        if key.path != path:  # a child of an open table (taskset fields, vLLM args): no type to check
            continue
        if (why := type_problem(key, value)) is not None:
            found.append(f"{path} {why}")
        elif key.variant is not None:
            switch, allowed = key.variant
            chosen = get(config, switch, KEYS[switch].default)
            if chosen not in allowed:
                found.append(f"{path} belongs to {switch} = {' or '.join(map(repr, allowed))}, but it is {chosen!r}")
    return found


def get(config: dict[str, Any], path: str, default: Any = None) -> Any:
    """The value at a dotted path ([] paths read the first array element), or ``default``."""
    node: Any = config
    for part in path.split("."):
        if part.endswith("[]"):
            node = node.get(part[:-2]) if isinstance(node, dict) else None
            node = node[0] if isinstance(node, list) and node else None
        else:
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return default
    return node
