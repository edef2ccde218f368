"""The prime-rl config writer: a config that trains the method, or a refusal that says why it cannot.

    cfg = wai.prime_rl_config("reverse-text", "rae", model="Qwen/Qwen3-0.6B", **{"orchestrator.group_size": 1})
    cfg.write("rl.toml"); print(cfg.command, cfg.ignored, cfg.warnings)

Targets one pinned prime-rl commit (``schema.PINNED``); every key it writes is in ``schema.KEYS``.
See ``docs/prime-rl.md``.
"""

from whileai.prime_rl.plan import PrimeRLConfig
from whileai.prime_rl.schema import KEYS, PINNED
from whileai.prime_rl.writer import prime_rl_config

__all__ = ["KEYS", "PINNED", "PrimeRLConfig", "prime_rl_config"]
