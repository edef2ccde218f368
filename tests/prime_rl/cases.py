"""The supported-method configs the golden files pin, one builder per file in golden/.

Regenerate a file only after reading its diff: `WHILEAI_UPDATE_GOLDEN=1 pytest tests/prime_rl`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import whileai as wai

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["CASES", "CLIP_TAGS", "GOLDEN", "QWEN", "SAMPLER", "TEACHER", "tomllib"]
GOLDEN = Path(__file__).parent / "golden"
QWEN = "Qwen/Qwen3-0.6B"
TEACHER = wai.Endpoint(base_url="http://127.0.0.1:8001/v1", model="Qwen/Qwen3-8B", vocab_size=151669,
                       api_key_env="TEACHER_API_KEY")
# GRPO's PPO-clip knobs (clip, and clip_high / dual_clip where the method has them): prime-rl reads none
CLIP_TAGS = {f"GRPO.{name}" for name in ("clip", "clip_high", "dual_clip") if name in wai.GRPO.knobs()}
SAMPLER = wai.Endpoint(base_url="http://127.0.0.1:8002/v1", model="Qwen/Qwen3-32B")

CASES: dict[str, Callable[[], wai.PrimeRLConfig]] = {
    # the string methods: prime-rl's three group baselines
    "grpo": lambda: wai.prime_rl_config("reverse-text", "grpo", model=QWEN, max_steps=20),
    "max_rl": lambda: wai.prime_rl_config({"id": "gsm8k", "split": "train"}, "max_rl", model="Qwen/Qwen3-4B",
                                          lr=3e-6, max_steps=200, **{"monitors.wandb.project": "whileai"}),
    "rae_k1": lambda: wai.prime_rl_config("reverse-text", "rae", model=QWEN, **{"orchestrator.group_size": 1}),
    # method objects
    "rloo": lambda: wai.prime_rl_config("reverse-text", wai.RLOO(rollouts_per_prompt=4), model=QWEN),
    "async_grpo_ipo": lambda: wai.prime_rl_config(
        "reverse-text", wai.Async(wai.GRPO(rollouts_per_prompt=16, max_tokens=512), correction="ipo", off_policy_steps=2),
        model=QWEN, lora=32, **{"ckpt.interval": 50}),
    "opd": lambda: wai.prime_rl_config("reverse-text", wai.OPD(TEACHER, max_tokens=1536), model=QWEN,
                                       model_vocab_size=151669),
    "opsd": lambda: wai.prime_rl_config("gsm8k", wai.OPSD(privileged="reference", max_tokens=1024),
                                        model="meta-llama/Llama-3.1-8B-Instruct", seq_len=4096),
    "sft": lambda: wai.prime_rl_config("reverse-text", wai.SFT(), model=QWEN, teacher=SAMPLER),
}
