"""Check the writer's output with prime-rl's own validator at the pinned commit (not part of the test suite).

prime-rl's schema package installs from git and needs Python 3.12, so this runs in two environments:

    # 1. in whileai's environment: write the configs (the golden cases and more) and hand-broken ones
    python tests/prime_rl/check_with_prime_rl.py write /tmp/prl/cfgs

    # 2. in a Python 3.12 venv with prime-rl-configs (packages/prime-rl-configs of the pinned prime-rl),
    #    verifiers and the gsm8k / reverse_text / alphabet_sort tasksets (deps/verifiers @ a60a606) and
    #    renderers from PyPI: load every file with RLConfig, the first call `uv run rl` makes
    python tests/prime_rl/check_with_prime_rl.py validate /tmp/prl/cfgs

The second environment, as it was built for the recorded run (prime-rl and verifiers checked out at their
pinned commits in PRL and VF; verifiers' version comes from git tags, hence the pretend version):

    python3.12 -m venv /tmp/prl/venv
    SETUPTOOLS_SCM_PRETEND_VERSION=0.3.1 /tmp/prl/venv/bin/pip install $VF $PRL/packages/prime-rl-configs \
        $VF/environments/gsm8k $VF/environments/reverse_text $VF/environments/alphabet_sort

It also writes the configs the writer accepts for 80 random methods, models, tasksets and overrides
(seed 0). Every ``good_*`` file must pass and every ``bad_*`` file must fail (they hold what the writer refuses).
The renderers map is replaced by the pinned one (written to ``map.json`` in step 1), since PyPI's
renderers need not be the commit prime-rl pins. The run and its result are recorded in docs/prime-rl.md.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any


def write(out: Path) -> None:
    import whileai as wai
    from whileai.prime_rl.schema import RENDERER_MAP

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.prime_rl.cases import CASES, QWEN

    out.mkdir(parents=True, exist_ok=True)
    (out / "map.json").write_text(json.dumps(RENDERER_MAP))
    more = {
        "qwen35_auto": lambda: wai.prime_rl_config("reverse-text", "grpo", model="Qwen/Qwen3.5-4B"),
        "llama32_auto": lambda: wai.prime_rl_config("reverse-text", wai.OPSD(),
                                                    model="meta-llama/Llama-3.2-1B-Instruct"),
        "finetune_parser": lambda: wai.prime_rl_config("reverse-text", "grpo", model="my-org/qwen3-ft",
                                                       **{"orchestrator.renderer.tool_parser": "qwen3"}),
        "hf_fa2": lambda: wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{
            "trainer.model.impl": "hf", "trainer.model.attn": "flash_attention_2"}),
        "alphabet_all": lambda: wai.prime_rl_config({"id": "alphabet-sort", "min_turns": 2, "max_turns": 4,
                                                     "min_names_per_turn": 2, "max_names_per_turn": 8,
                                                     "split": "train"}, "grpo", model=QWEN),
        "gsm8k_test": lambda: wai.prime_rl_config({"id": "gsm8k", "split": "test"}, "dr_grpo", model=QWEN),
        "opsd_named": lambda: wai.prime_rl_config("reverse-text", wai.OPSD(), model="my-org/ft",
                                                  **{"orchestrator.renderer.name": "qwen3"}),
        "overridden": lambda: wai.prime_rl_config("reverse-text", "rae", model=QWEN, **{"orchestrator.group_size": 4}),
    }
    for name, build in {**CASES, **more}.items():
        build().write(out / f"good_{name}.toml")
    for index, cfg in enumerate(_random_configs(wai, QWEN, count=80, seed=0)):
        cfg.write(out / f"good_random_{index:03d}.toml")
    grpo = (out / "good_grpo.toml").read_text()
    bad = {  # each is refused by the writer; prime-rl must refuse it too
        "gsm8k_validation": (out / "good_max_rl.toml").read_text().replace('split = "train"', 'split = "validation"'),
        "parser_without_name": grpo + '\n[orchestrator.renderer]\ntool_parser = "qwen3"\n',
        "hf_alone": grpo.replace("[trainer]\n", '[trainer]\n\n[trainer.model]\nimpl = "hf"\n', 1),
        "auto_unmapped": grpo.replace('name = "Qwen/Qwen3-0.6B"', 'name = "my-org/qwen3-ft"'),
    }
    for name, text in bad.items():
        (out / f"bad_{name}.toml").write_text(text)


def _random_configs(wai: Any, qwen: str, count: int, seed: int) -> list[Any]:
    """Configs the writer accepts for random methods, models, tasksets and overrides (refusals are skipped)."""
    from tests.prime_rl.cases import SAMPLER, TEACHER

    rng = random.Random(seed)
    models = [qwen, "Qwen/Qwen3.5-4B", "meta-llama/Llama-3.2-3B-Instruct", "my-org/ft", "openai/gpt-oss-20b"]
    envs = ["reverse-text", {"id": "gsm8k", "split": "train"},
            {"id": "alphabet-sort", "max_turns": 5, "max_names_per_turn": 3}]
    methods = {
        "grpo": lambda g: wai.GRPO(rollouts_per_prompt=g, temperature=rng.uniform(0.1, 2), max_tokens=rng.randint(1, 4096),
                                   loss_type="dr_grpo"),
        "dr_grpo": lambda g: wai.DrGRPO(rollouts_per_prompt=g), "rloo": lambda g: wai.RLOO(rollouts_per_prompt=g),
        "max_rl": lambda g: wai.MaxRL(rollouts_per_prompt=g), "rae": lambda g: wai.RAE(rollouts_per_prompt=g),
        "opd": lambda g: wai.OPD(TEACHER, rollouts_per_prompt=rng.randint(1, 8), max_tokens=rng.randint(64, 1500)),
        "opsd": lambda g: wai.OPSD(privileged=rng.choice(["reference", "hint", "demonstration"]), max_tokens=1000),
        "sft": lambda g: wai.SFT(normalize="token_mean"),
    }
    written = []
    for _ in range(count):
        kind = rng.choice(sorted(methods))
        method = methods[kind](rng.randint(1, 24))
        if kind != "sft" and rng.random() < 0.5:
            method = wai.Async(method, correction="ipo", off_policy_steps=rng.randint(0, 12),
                               threshold=rng.uniform(0.01, 1))
        over: dict[str, Any] = {}
        if rng.random() < 0.5:
            over["lora"] = rng.choice([True, rng.randint(1, 64)])
        if rng.random() < 0.3:
            over["max_steps"] = rng.randint(1, 500)
        if rng.random() < 0.3:
            over |= {"orchestrator.renderer.name": "default", "orchestrator.renderer.tool_parser": "qwen3"}
        if rng.random() < 0.3:
            over |= {"trainer.model.impl": "hf",
                     "trainer.model.attn": rng.choice(["flash_attention_2", "flash_attention_3"])}
        if rng.random() < 0.3:
            over["seq_len"] = rng.randint(2048, 16384)
        try:
            written.append(wai.prime_rl_config(rng.choice(envs), method, model=rng.choice(models),
                                               teacher=SAMPLER if kind == "sft" else None, **over))
        except wai.ConfigError:
            continue
    return written


def validate(folder: Path) -> int:
    import renderers.base
    from pydantic_config import cli

    from prime_rl.configs.rl import RLConfig

    pinned = json.loads((folder / "map.json").read_text())
    renderers.base.MODEL_RENDERER_MAP.clear()
    renderers.base.MODEL_RENDERER_MAP.update(pinned)
    wrong = 0
    for path in sorted(folder.glob("*.toml")):
        try:
            cli(RLConfig, args=["@", str(path)])
            verdict, why = "PASS", ""
        except BaseException as err:  # pydantic_config raises its own error types (and SystemExit)
            verdict, why = "FAIL", str(err).replace("\n", " | ")[:300]
        wrong += (verdict == "PASS") != path.name.startswith("good_")
        print(verdict, path.name, why)
    print(f"{wrong} unexpected")
    return 1 if wrong else 0


if __name__ == "__main__":
    mode, where = sys.argv[1], Path(sys.argv[2])
    if mode == "write":
        write(where)
    else:
        sys.exit(validate(where))
