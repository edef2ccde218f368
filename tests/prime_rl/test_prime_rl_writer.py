"""prime_rl_config: golden files, TOML round trips, the schema table, and how knobs and overrides land."""

from __future__ import annotations

import os

import numpy as np
import pytest

import whileai as wai
from whileai.errors import ConfigError
from whileai.prime_rl import schema

from .cases import CASES, CLIP_TAGS, GOLDEN, QWEN, SAMPLER, TEACHER, tomllib

# The reference's minimal validated config (shared/reference/prime-rl.md, section 1.7), line by line.
MINIMAL = """
max_steps = 20
seq_len = 2048

[model]
name = "Qwen/Qwen3-0.6B"

[orchestrator]
batch_size = 128
group_size = 16

[orchestrator.train.sampling]
max_completion_tokens = 128

[[orchestrator.train.source]]
name = "reverse-text"

[orchestrator.train.source.env.taskset]
id = "reverse-text"

[orchestrator.train.source.env.agent.harness]
id = "null"

[orchestrator.train.source.env.agent.runtime]
type = "subprocess"

[trainer.optim]
lr = 3e-6

[ckpt]

[inference]
"""


# ----------------------------------------------------------------- golden files
@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    cfg = CASES[name]()
    path = GOLDEN / f"{name}.toml"
    if os.environ.get("WHILEAI_UPDATE_GOLDEN"):
        path.write_text(cfg.toml)  # launch line as `uv run rl @ rl.toml`
    assert tomllib.loads(path.read_text()) == cfg.config


@pytest.mark.parametrize("name", sorted(CASES))
def test_written_toml_parses_back_to_config(name: str, tmp_path) -> None:
    cfg = CASES[name]()
    target = cfg.write(tmp_path / "run" / "rl.toml")
    assert tomllib.loads(target.read_text()) == cfg.config
    assert tomllib.loads(cfg.toml) == cfg.config
    assert cfg.command == f"uv run rl @ {target}"
    assert [p.name for p in target.parent.iterdir()] == ["rl.toml"]  # no temporary file left behind


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_written_key_is_in_the_schema_table(name: str) -> None:
    parsed = tomllib.loads(CASES[name]().toml)
    for path, value in schema.walk(parsed):
        key = schema.lookup(path)
        assert key is not None, f"{path} is not declared in schema.KEYS"
        if key.path == path:
            assert schema.type_problem(key, value) is None, path


@pytest.mark.parametrize("name", sorted(CASES))
def test_required_tables_and_shared_fields(name: str) -> None:
    config = CASES[name]().config
    assert {"trainer", "orchestrator", "inference"} <= set(config)
    assert config["model"]["name"] and "seq_len" in config
    for sub in ("trainer", "orchestrator", "inference"):  # shared fields are written once, at the top
        for shared, top in schema.SHARED.items():
            if shared.startswith(sub + "."):
                assert schema.get(config, shared) is None, f"{shared} written besides {top}"


def test_minimal_validated_config_is_reproduced_key_for_key() -> None:
    cfg = wai.prime_rl_config("reverse-text", wai.GRPO(rollouts_per_prompt=16, max_tokens=128), model=QWEN, max_steps=20,
                              lr=3e-6)
    minimal = tomllib.loads(MINIMAL)
    # The writer states two things the minimal file leaves to prime-rl's defaults, each equal to that default:
    added = {"orchestrator.algo.type": "grpo", "orchestrator.train.sampling.temperature": 1.0}
    for path, value in added.items():
        assert schema.KEYS[path].default == value
    expected = tomllib.loads(MINIMAL)
    expected["orchestrator"]["algo"] = {"type": "grpo"}
    expected["orchestrator"]["train"]["sampling"]["temperature"] = 1.0
    assert cfg.config == expected
    for path, value in schema.walk(minimal):  # every table and leaf of the minimal file, with its value
        written = schema.get(cfg.config, path)
        assert written is not None, path
        if not isinstance(value, (dict, list)):
            assert written == value, path


# ----------------------------------------------------------------- every knob goes somewhere
SUPPORTED = [
    wai.GRPO(), wai.DrGRPO(), wai.RLOO(), wai.MaxRL(), wai.RAE(), wai.OPSD(), wai.OPSD(anchor="live"),
    wai.OPD(TEACHER), wai.Async("grpo"), wai.Async("rae"), wai.Async(wai.OPSD()), wai.SFT(),
    wai.SFT(normalize="token_mean"),
]


@pytest.mark.parametrize("method", SUPPORTED, ids=lambda m: repr(m)[:40])
def test_every_knob_is_mapped_or_ignored_with_a_reason(method) -> None:
    cfg = wai.prime_rl_config("reverse-text", method, model=QWEN, teacher=SAMPLER if method.name == "sft" else None)
    methods = [method, method.method] if method.name == "async" else [method]
    expected = {f"{type(m).__name__}.{f}" for m in methods for f in type(m).knobs()}
    assert set(cfg.mapped) | set(cfg.ignored) == expected
    assert not set(cfg.mapped) & set(cfg.ignored)
    for tag, reason in cfg.ignored.items():
        owner, name = tag.split(".")
        value = next(getattr(m, name) for m in methods if type(m).__name__ == owner)
        assert reason.startswith(f"{value!r}: ") and len(reason) > 40, tag
        assert "prime_rl/" in reason or "prime-rl" in reason or "pinned schema" in reason, tag


def test_grpo_knobs_land_on_prime_rl_keys() -> None:
    cfg = wai.prime_rl_config("reverse-text", wai.GRPO(rollouts_per_prompt=4, temperature=0.7, max_tokens=300),
                              model=QWEN)
    orchestrator = cfg.config["orchestrator"]
    assert orchestrator["group_size"] == 4 and orchestrator["batch_size"] == 128
    assert orchestrator["train"]["sampling"] == {"temperature": 0.7, "max_completion_tokens": 300}
    assert orchestrator["algo"] == {"type": "grpo"}
    assert set(cfg.ignored) == {"GRPO.loss_type", "GRPO.truncated"} | CLIP_TAGS
    assert "std" in cfg.ignored["GRPO.loss_type"]
    assert all("prime-rl clips no ratio" in cfg.ignored[tag] for tag in CLIP_TAGS)
    assert cfg.algorithm == "grpo"


def test_async_ipo_writes_the_ipo_loss_with_its_threshold_and_lag() -> None:
    cfg = wai.prime_rl_config("reverse-text", wai.Async("max_rl", correction="ipo", threshold=0.25,
                                                        off_policy_steps=3), model=QWEN)
    assert cfg.config["trainer"]["loss"] == {"type": "ipo", "ipo_threshold": 0.25}
    assert cfg.config["orchestrator"]["max_off_policy_steps"] == 3
    assert cfg.config["orchestrator"]["algo"] == {"type": "max_rl"}
    assert cfg.algorithm == "max_rl + ipo loss"
    assert not any("TARGET_LAG" in w for w in cfg.warnings)  # Async states the lag itself


def test_plain_method_warns_that_prime_rl_runs_one_step_behind() -> None:
    cfg = wai.prime_rl_config("reverse-text", "grpo", model=QWEN)
    assert any("TARGET_LAG = 1" in w and "max_off_policy_steps = 8" in w for w in cfg.warnings)
    assert "max_off_policy_steps" not in cfg.config["orchestrator"]


def test_async_around_distillation_ignores_the_correction_it_cannot_apply() -> None:
    cfg = wai.prime_rl_config("reverse-text", wai.Async(wai.OPSD(), correction="ipo"), model=QWEN)
    assert "loss" not in cfg.config["trainer"]
    assert "ref_kl" in cfg.ignored["Async.correction"] and "ref_kl" in cfg.ignored["Async.threshold"]


def test_rae_at_one_rollout_warns_with_the_baseline_it_is() -> None:
    cfg = wai.prime_rl_config("refunds-v1", "rae", model="Qwen/Qwen3-4B", **{"orchestrator.group_size": 1})
    assert cfg.config["orchestrator"]["group_size"] == 1
    assert cfg.config["orchestrator"]["algo"] == {"type": "rae", "decay": 0.95}
    (warning,) = [w for w in cfg.warnings if w.startswith("rae at group_size 1")]
    assert "running average of past rewards" in warning and "b <- 0.95 b + 0.05 R" in warning


def test_rae_decay_comes_from_the_object() -> None:
    cfg = wai.prime_rl_config("reverse-text", wai.RAE(decay=0.9, rollouts_per_prompt=4), model=QWEN)
    assert cfg.config["orchestrator"]["algo"] == {"type": "rae", "decay": 0.9}
    assert not any(w.startswith("rae at group_size 1") for w in cfg.warnings)


@pytest.mark.parametrize("seed", range(4))
def test_rloo_as_grpo_with_adv_tau_gives_rloo_advantages(seed: int) -> None:
    """R_i - mean of the other k-1 = k/(k-1) (R_i - group mean); e.g. k=4, R=(1,0,0,0): 1 - 0 = 1 = 4/3 * 3/4."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 7))
    cfg = wai.prime_rl_config("reverse-text", wai.RLOO(rollouts_per_prompt=k), model=QWEN)
    adv_tau = cfg.config["trainer"]["loss"]["adv_tau"]
    rewards = rng.random((3, k))
    rows = [{"task_id": g, "reward": float(rewards[g, i]), "logprobs": [-0.5, -0.7]}
            for g in range(3) for i in range(k)]
    rloo = np.array([a[0] for a in wai.RLOO(rollouts_per_prompt=k).update(rows).advantages]).reshape(3, k)
    prime_rl_grpo = rewards - rewards.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(adv_tau * prime_rl_grpo, rloo, rtol=1e-12, atol=1e-12)


def test_opd_writes_the_teacher_as_a_frozen_model() -> None:
    cfg = wai.prime_rl_config("reverse-text", wai.OPD(TEACHER), model=QWEN)
    assert cfg.config["orchestrator"]["algo"] == {
        "type": "opd", "teacher": {"name": "Qwen/Qwen3-8B", "base_url": "http://127.0.0.1:8001/v1",
                                   "api_key_var": "TEACHER_API_KEY"}}
    assert cfg.config["orchestrator"]["group_size"] == 4  # OPD.samples
    assert any("was not compared" in w for w in cfg.warnings)  # student vocabulary unknown: said, not refused


def test_opd_teacher_can_come_from_the_call() -> None:
    cfg = wai.prime_rl_config("reverse-text", "opd", model=QWEN, teacher=TEACHER, model_vocab_size=151669)
    assert cfg.method.teacher == TEACHER
    assert cfg.config["orchestrator"]["algo"]["teacher"]["name"] == "Qwen/Qwen3-8B"


def test_opsd_privileged_choices_set_demo_key_and_template() -> None:
    demo = wai.prime_rl_config("reverse-text", wai.OPSD(privileged="demonstration"), model=QWEN)
    algo = demo.config["orchestrator"]["algo"]
    assert algo["demo_key"] == "demonstration"
    assert algo["template"] == schema.KEYS["orchestrator.algo.template"].default
    hint = wai.prime_rl_config("reverse-text", wai.OPSD(privileged="hint"), model=QWEN)
    assert hint.config["orchestrator"]["algo"]["demo_key"] == "hint"
    assert "{demonstration}" in hint.config["orchestrator"]["algo"]["template"]
    assert "OPSD.anchor" in demo.ignored and "live" in demo.ignored["OPSD.anchor"]


def test_sft_samples_from_the_frozen_model() -> None:
    cfg = wai.prime_rl_config("reverse-text", wai.SFT(), model=QWEN, teacher=SAMPLER)
    assert cfg.config["orchestrator"]["algo"] == {
        "type": "sft", "sampling": {"source": {"name": "Qwen/Qwen3-32B", "base_url": "http://127.0.0.1:8002/v1"}}}
    assert "token_mean" in cfg.ignored["SFT.normalize"]


# ----------------------------------------------------------------- renderer, batch, seq_len
def test_renderer_named_only_where_the_model_id_needs_one() -> None:
    mapped = wai.prime_rl_config("reverse-text", "grpo", model="Qwen/Qwen3-4B")
    assert "renderer" not in mapped.config["orchestrator"]
    assert not any("renderers map" in w for w in mapped.warnings)
    tuned = wai.prime_rl_config("reverse-text", "grpo", model="PrimeIntellect/Qwen3-0.6B-Reverse-Text-SFT")
    assert tuned.config["orchestrator"]["renderer"] == {"name": "default"}  # no family guessed from the name
    llama = wai.prime_rl_config("reverse-text", wai.OPSD(), model="meta-llama/Llama-3.1-8B-Instruct")
    assert llama.config["orchestrator"]["renderer"] == {"name": "default"}
    assert llama.config["orchestrator"]["algo"]["renderer"] == {"name": "default"}
    assert any("'meta-llama/Llama-3.1-8B-Instruct' is not in the renderers map" in w for w in llama.warnings)
    chosen = wai.prime_rl_config("reverse-text", "grpo", model="my/finetune",
                                 **{"orchestrator.renderer.name": "prime-qwen3"})
    assert chosen.config["orchestrator"]["renderer"] == {"name": "prime-qwen3"}
    assert not any("renderer" in w for w in chosen.warnings)


@pytest.mark.parametrize("model", ["Qwen/Qwen3.5-4B", "Qwen/Qwen3.5-0.8B", "meta-llama/Llama-3.2-1B-Instruct",
                                   "openai/gpt-oss-20b", "PrimeIntellect/Qwen3-1.7B"])
def test_a_model_in_the_pinned_renderers_map_keeps_auto(model: str) -> None:
    """These resolve from 'auto' at the pin (Qwen3.5 to qwen3.5, not qwen3; Llama 3.2 to llama-3): no name, no warning."""
    cfg = wai.prime_rl_config("reverse-text", wai.OPSD(), model=model)
    assert "renderer" not in cfg.config["orchestrator"] and "renderer" not in cfg.config["orchestrator"]["algo"]
    assert not any("renderer" in w for w in cfg.warnings)


def test_the_renderers_map_is_the_pinned_one() -> None:
    """54 exact ids at renderers 2846a3dc; no prefix matching (a Qwen3.5 fine-tune is not in it)."""
    assert len(schema.RENDERER_MAP) == 54
    assert schema.RENDERER_MAP["Qwen/Qwen3.5-9B"] == "qwen3.5"
    assert schema.RENDERER_MAP["Qwen/Qwen3-4B-Thinking-2507"] == "qwen3"
    assert schema.RENDERER_MAP["PrimeIntellect/Qwen3-0.6B"] == "prime-qwen3"
    assert schema.RENDERER_MAP["meta-llama/Llama-3.2-3B-Instruct"] == "llama-3"
    assert "meta-llama/Llama-3.1-8B-Instruct" not in schema.RENDERER_MAP
    assert "qwen3.5" in schema.RENDERER_NAMES and "default" in schema.RENDERER_NAMES


def test_the_renderer_is_resolved_from_the_tokenizer_name_when_set() -> None:
    """prime-rl resolves 'auto' from tokenizer.name when it is set, else model.name."""
    cfg = wai.prime_rl_config("reverse-text", "grpo", model="my/finetune", **{"tokenizer.name": "Qwen/Qwen3-4B"})
    assert "renderer" not in cfg.config["orchestrator"]
    other = wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"tokenizer.name": "my/tokenizer"})
    assert other.config["orchestrator"]["renderer"] == {"name": "default"}


def test_parsers_are_written_with_the_default_renderer_or_refused() -> None:
    cfg = wai.prime_rl_config("reverse-text", "grpo", model="my/finetune",
                              **{"orchestrator.renderer.tool_parser": "qwen3"})
    assert cfg.config["orchestrator"]["renderer"] == {"name": "default", "tool_parser": "qwen3"}
    named = wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"orchestrator.renderer.name": "default",
                                                                       "orchestrator.renderer.reasoning_parser": "think"})
    assert named.config["orchestrator"]["renderer"] == {"name": "default", "reasoning_parser": "think"}
    with pytest.raises(ConfigError, match=r"renderer\.tool_parser is set, but the renderer is 'auto', which resolves "
                                          r"'Qwen/Qwen3-0\.6B' to 'qwen3'.*only on the 'default' renderer.*"
                                          r"orchestrator\.renderer\.name=default"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"orchestrator.renderer.tool_parser": "qwen3"})
    with pytest.raises(ConfigError, match=r"reasoning_parser is set, but the renderer is 'qwen3'"):
        wai.prime_rl_config("reverse-text", "grpo", model="my/finetune", **{"orchestrator.renderer.name": "qwen3",
                                                                             "orchestrator.renderer.reasoning_parser": "x"})


def test_an_unknown_renderer_name_is_written_with_a_warning() -> None:
    cfg = wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"orchestrator.renderer.name": "qwen9"})
    assert cfg.config["orchestrator"]["renderer"] == {"name": "qwen9"}
    assert any("'qwen9' is not a renderer the writer knows" in w for w in cfg.warnings)


def test_opsd_hint_renderer_follows_an_explicit_policy_renderer() -> None:
    cfg = wai.prime_rl_config("reverse-text", wai.OPSD(), model=QWEN, **{"orchestrator.renderer.name": "prime-qwen3"})
    assert cfg.config["orchestrator"]["algo"]["renderer"] == {"name": "prime-qwen3"}


def test_default_batch_size_is_kept_a_multiple_of_the_group() -> None:
    """128 rollouts over groups of 12 is 10.67 prompts: the nearest whole count is 11 -> 132 rollouts."""
    cfg = wai.prime_rl_config("reverse-text", wai.GRPO(rollouts_per_prompt=12), model=QWEN)
    assert cfg.config["orchestrator"]["batch_size"] == 132
    assert any("132 (11 prompts x group_size 12)" in w for w in cfg.warnings)
    small = wai.prime_rl_config("reverse-text", wai.GRPO(rollouts_per_prompt=200), model=QWEN)
    assert small.config["orchestrator"]["batch_size"] == 200
    assert any("200 (1 prompt x group_size 200)" in w for w in small.warnings)  # not "1 prompts"


def test_an_explicit_batch_size_that_does_not_divide_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"batch_size=100 is not a multiple of group_size=8.*use 96 or 104"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, batch_size=100)


def test_token_batch_size_replaces_batch_size() -> None:
    cfg = wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"orchestrator.token_batch_size": 65536})
    assert "batch_size" not in cfg.config["orchestrator"]
    with pytest.raises(ConfigError, match="not both"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, batch_size=64,
                            **{"orchestrator.token_batch_size": 65536})


def test_a_cap_longer_than_seq_len_is_said() -> None:
    cfg = wai.prime_rl_config("reverse-text", wai.OPSD(), model=QWEN)
    assert any("max_completion_tokens 8192 >= seq_len 2048" in w for w in cfg.warnings)
    fitted = wai.prime_rl_config("reverse-text", wai.OPSD(), model=QWEN, seq_len=10240)
    assert not any("seq_len" in w for w in fitted.warnings)


# ----------------------------------------------------------------- overrides
def test_override_of_a_shared_sub_field_is_written_once_at_the_top() -> None:
    cfg = wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"trainer.max_steps": 40,
                                                                     "orchestrator.seq_len": 4096})
    assert cfg.config["max_steps"] == 40 and cfg.config["seq_len"] == 4096
    assert "max_steps" not in cfg.config["trainer"] and "seq_len" not in cfg.config["orchestrator"]
    assert any("trainer.max_steps is a shared field" in w for w in cfg.warnings)


def test_conflicting_overrides_are_refused() -> None:
    with pytest.raises(ConfigError, match="max_steps is set twice, to 10 by max_steps and to 20 by trainer.max_steps"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, max_steps=10, **{"trainer.max_steps": 20})


def test_unknown_override_key_is_refused_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"orchestrator\.group_sise.*did you mean orchestrator\.group_size"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"orchestrator.group_sise": 4})


@pytest.mark.parametrize("key", ["orchestrator.algo.type", "trainer.loss.type", "orchestrator.algo.teacher.name"])
def test_method_owned_keys_cannot_be_overridden(key: str) -> None:
    with pytest.raises(ConfigError, match="written from the method"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{key: "x"})


def test_launcher_set_keys_cannot_be_overridden() -> None:
    with pytest.raises(ConfigError, match="set by the rl launcher"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"orchestrator.num_train_workers": 2})


def test_override_of_a_knob_mapped_key_wins_and_says_so() -> None:
    cfg = wai.prime_rl_config("reverse-text", "rae", model=QWEN, **{"orchestrator.group_size": 4})
    assert cfg.config["orchestrator"]["group_size"] == 4
    assert any("replaces RAE.rollouts_per_prompt=1" in w for w in cfg.warnings)
    assert cfg.mapped["RAE.rollouts_per_prompt"] == ("orchestrator.group_size = 4 (set by orchestrator.group_size, which "
                                             "replaced the knob's 1)")
    assert "orchestrator.group_size = 1" not in str(cfg.to_dict())


def test_the_mapping_reports_overridden_async_values() -> None:
    cfg = wai.prime_rl_config("reverse-text", wai.Async("grpo", off_policy_steps=2, threshold=0.3), model=QWEN,
                              **{"orchestrator.max_off_policy_steps": 4, "trainer.loss.ipo_threshold": 0.1})
    assert cfg.config["orchestrator"]["max_off_policy_steps"] == 4
    assert cfg.mapped["Async.off_policy_steps"].startswith("orchestrator.max_off_policy_steps = 4 (set by")
    assert cfg.mapped["Async.threshold"].startswith("trainer.loss.ipo_threshold = 0.1 (set by")


def test_the_method_reported_carries_the_values_that_landed() -> None:
    """cfg.method (and the header's `method:` line) is the method prime-rl will run, inner and outer knobs alike."""
    cfg = wai.prime_rl_config("reverse-text", wai.Async(wai.GRPO(), off_policy_steps=2), model=QWEN,
                              **{"orchestrator.group_size": 4, "orchestrator.max_off_policy_steps": 3})
    assert cfg.method == wai.Async(wai.GRPO(rollouts_per_prompt=4), off_policy_steps=3)
    assert "method: Async(method=GRPO(rollouts_per_prompt=4," in cfg.toml
    same = wai.prime_rl_config("reverse-text", wai.RAE(rollouts_per_prompt=4), model=QWEN, **{"orchestrator.group_size": 4})
    assert same.method == wai.RAE(rollouts_per_prompt=4)


def test_the_lag_warning_states_the_bound_that_landed() -> None:
    cfg = wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"orchestrator.max_off_policy_steps": 2})
    assert any("max_off_policy_steps = 2 policy versions old" in w for w in cfg.warnings)
    assert not any("max_off_policy_steps = 8" in w for w in cfg.warnings)


def test_hf_implementation_needs_an_attention_it_runs() -> None:
    """impl='hf' with attn 'auto' (or FA4) fails prime-rl's ModelConfig validation; FA2/FA3 pass."""
    with pytest.raises(ConfigError, match=r"trainer\.model\.impl='hf' needs trainer\.model\.attn set to "
                                          r"'flash_attention_2' or 'flash_attention_3', not 'auto'"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"trainer.model.impl": "hf"})
    with pytest.raises(ConfigError, match=r"not 'flash_attention_4'"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"trainer.model.impl": "hf",
                                                                   "trainer.model.attn": "flash_attention_4"})
    cfg = wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"trainer.model.impl": "hf",
                                                                     "trainer.model.attn": "flash_attention_2"})
    assert cfg.config["trainer"]["model"] == {"impl": "hf", "attn": "flash_attention_2"}
    assert wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"trainer.model.impl": "custom"})
    with pytest.raises(ConfigError, match="trust_remote_code = true needs trainer.model.impl 'hf' or 'auto'"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"trainer.model.impl": "custom",
                                                                   "trainer.model.trust_remote_code": True})


def test_override_values_are_type_checked() -> None:
    with pytest.raises(ConfigError, match=r"orchestrator\.group_size must be int"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"orchestrator.group_size": "8"})
    with pytest.raises(ConfigError, match=r"temperature must be <= 2.0"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"orchestrator.train.sampling.temperature": 3.0})
    with pytest.raises(ConfigError, match=r"orchestrator\.algo\.decay must be < 1\.0, got 1\.0"):
        wai.prime_rl_config("reverse-text", "rae", model=QWEN, **{"orchestrator.algo.decay": 1.0})
    with pytest.raises(ConfigError, match=r"source\[\]\.ratio must be > 0\.0, got 0\.0"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"orchestrator.train.source.ratio": 0.0})
    with pytest.raises(ConfigError, match="takes no None"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"trainer.optim.lr": None})


def test_none_is_written_as_prime_rl_s_none_string() -> None:
    cfg = wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"trainer.optim.max_norm": None})
    assert cfg.config["trainer"]["optim"]["max_norm"] == "None"


def test_discriminated_union_keys_must_match_their_variant() -> None:
    with pytest.raises(ConfigError, match=r"dppo_mask_low belongs to trainer\.loss\.type = 'default'"):
        wai.prime_rl_config("reverse-text", wai.Async("grpo"), model=QWEN, **{"trainer.loss.dppo_mask_low": 0.1})
    cfg = wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"trainer.loss.dppo_mask_low": 0.1})
    assert cfg.config["trainer"]["loss"] == {"dppo_mask_low": 0.1}


def test_lora_forms_and_the_broadcast_rule() -> None:
    assert wai.prime_rl_config("reverse-text", "grpo", model=QWEN, lora=True).config["trainer"]["model"] == {
        "lora": {}}
    assert wai.prime_rl_config("reverse-text", "grpo", model=QWEN, lora={"rank": 8, "alpha": 16.0}).config[
        "trainer"]["model"]["lora"] == {"rank": 8, "alpha": 16.0}
    with pytest.raises(ConfigError, match="LoRA needs the filesystem weight broadcast"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, lora=16, **{"weight_broadcast.type": "nccl"})
    with pytest.raises(ConfigError, match="lora has no field 'ranks'"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, lora={"ranks": 8})


def test_cross_checks_prime_rl_runs_at_validation() -> None:
    with pytest.raises(ConfigError, match="needs max_steps"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"trainer.scheduler.type": "cosine"})
    with pytest.raises(ConfigError, match="warmup_steps \\+ decay_steps = 20 must be <= max_steps=10"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, max_steps=10, **{"trainer.scheduler.type": "linear"})
    with pytest.raises(ConfigError, match="exceeds gpus_per_node=8"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"deployment.num_train_gpus": 6,
                                                                   "deployment.num_infer_gpus": 4})
    with pytest.raises(ConfigError, match=r"multi_node' needs a \[slurm\] table"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"deployment": {"type": "multi_node",
                                                                                  "num_train_nodes": 2}})
    with pytest.raises(ConfigError, match="offline = true is rejected"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"monitors.wandb.offline": True})
    with pytest.raises(ConfigError, match="env_vars may not set CUDA_VISIBLE_DEVICES"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, env_vars={"CUDA_VISIBLE_DEVICES": "0"})
    with pytest.raises(ConfigError, match="must use inference.server.port 8001"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"inference.server.port": 8001})


def test_vllm_arguments_pass_through_and_source_keys_reach_the_source() -> None:
    cfg = wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{"inference.vllm.max_num_seqs": 256,
                                                                     "orchestrator.train.source.ratio": 2.0})
    assert cfg.config["inference"] == {"vllm": {"max_num_seqs": 256}}
    assert cfg.config["orchestrator"]["train"]["source"][0]["ratio"] == 2.0


def test_taskset_fields_are_checked_where_the_taskset_is_known() -> None:
    with pytest.raises(ConfigError, match="taskset 'gsm8k' has no field 'splt'.*its fields are split"):
        wai.prime_rl_config({"id": "gsm8k", "splt": "train"}, "grpo", model=QWEN)
    cfg = wai.prime_rl_config({"id": "my-tasks", "level": 3}, "grpo", model=QWEN)
    assert cfg.config["orchestrator"]["train"]["source"][0]["env"]["taskset"] == {"id": "my-tasks", "level": 3}
    assert any("does not check its fields level" in w for w in cfg.warnings)


def test_bad_arguments_are_refused_clearly() -> None:
    with pytest.raises(ConfigError, match="model=''"):
        wai.prime_rl_config("reverse-text", "grpo", model="")
    with pytest.raises(ConfigError, match="no taskset id"):
        wai.prime_rl_config({"split": "train"}, "grpo", model=QWEN)
    with pytest.raises(ConfigError, match="teacher=.*is read only for wai.SFT"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, teacher=TEACHER)
    with pytest.raises(ConfigError, match="unknown method 'gpro'.*grpo"):
        wai.prime_rl_config("reverse-text", "gpro", model=QWEN)
    with pytest.raises(ConfigError, match=r"teacher='http://x:1/v1' is invalid: it must be None or wai\.Endpoint"):
        wai.prime_rl_config("reverse-text", "opd", model=QWEN, teacher="http://x:1/v1")
    with pytest.raises(ConfigError, match="model_vocab_size=0"):
        wai.prime_rl_config("reverse-text", wai.OPD(TEACHER), model=QWEN, model_vocab_size=0)


def test_schema_problems_catch_unknown_keys_and_bad_types() -> None:
    """The check the writer runs last can fail: a key the pinned version lacks, or a wrong type."""
    config = {"trainer": {"loss": {"ratio_type": "token"}}, "orchestrator": {"rollouts_per_example": 8,
                                                                            "group_size": 0}, "wandb": {}}
    found = schema.problems(config)
    assert any(p.startswith("trainer.loss.ratio_type is not a key") for p in found)
    assert any(p.startswith("orchestrator.rollouts_per_example is not a key") for p in found)
    assert any(p.startswith("wandb is not a key") for p in found)
    assert "orchestrator.group_size must be >= 1, got 0" in found
    assert schema.problems({"inference": {"vllm": {"anything_vllm_takes": 1}}}) == []


def test_str_and_json_views() -> None:
    cfg = wai.prime_rl_config("reverse-text", "grpo", model=QWEN)
    text = str(cfg)
    assert text.splitlines()[1] == "launch: uv run rl @ rl.toml"
    assert "ignored GRPO.clip" in text
    data = cfg.to_dict()
    assert data["config"] == cfg.config and data["pinned"]["commit"] == schema.PINNED["commit"]
    assert cfg.toml.startswith("# written by whileai prime_rl_config for PrimeIntellect-ai/prime-rl v0.8.1.dev67")


def test_nested_dict_overrides_are_checked_field_by_field() -> None:
    cfg = wai.prime_rl_config("reverse-text", "grpo", model=QWEN, monitors={"wandb": {"project": "p", "tags": ["a"]}},
                              **{"monitors.file": {}, "ckpt": {}})
    assert cfg.config["monitors"] == {"wandb": {"project": "p", "tags": ["a"]}, "file": {}}
    assert cfg.config["ckpt"] == {}
    with pytest.raises(ConfigError, match=r"monitors\.wandb\.projekt.*did you mean monitors\.wandb\.project"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, monitors={"wandb": {"projekt": "p"}})
    with pytest.raises(ConfigError, match=r"trainer\.model\.name is a shared|model\.name is written from"):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, trainer={"model": {"name": "other"}})


@pytest.mark.parametrize("override", [{"orchestrator.algo": {}}, {"orchestrator.train.source": []},
                                      {"orchestrator.train.source.env.taskset.id": "x"}, {"model.name": "x"}])
def test_keys_written_from_method_env_or_model_are_not_overridable(override) -> None:
    with pytest.raises(ConfigError, match="written from the method, env= or model="):
        wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **override)


def test_rloo_scale_is_owned_and_follows_the_final_group_size() -> None:
    with pytest.raises(ConfigError, match="trainer.loss.adv_tau is written from the method"):
        wai.prime_rl_config("reverse-text", "rloo", model=QWEN, **{"trainer.loss.adv_tau": 2.0})
    cfg = wai.prime_rl_config("reverse-text", "rloo", model=QWEN, group_size=5)
    assert cfg.config["trainer"]["loss"] == {"adv_tau": 1.25}  # 5 / 4


def test_the_same_teacher_twice_is_fine_two_different_ones_are_not() -> None:
    cfg = wai.prime_rl_config("reverse-text", wai.OPD(TEACHER), model=QWEN, teacher=TEACHER)
    assert cfg.config["orchestrator"]["algo"]["teacher"]["base_url"] == TEACHER.base_url
    with pytest.raises(ConfigError, match="two teachers"):
        wai.prime_rl_config("reverse-text", wai.OPD(TEACHER), model=QWEN, teacher=SAMPLER)


def test_a_failed_write_leaves_nothing_and_keeps_the_old_path(tmp_path) -> None:
    cfg = wai.prime_rl_config("reverse-text", "grpo", model=QWEN)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError):
        cfg.write(blocker / "rl.toml")
    assert cfg.path is None and cfg.command == "uv run rl @ rl.toml"
    target = cfg.write(tmp_path / "rl.toml")
    target.write_text("old")
    cfg.write(target)  # replaces the old file whole
    assert tomllib.loads(target.read_text()) == cfg.config


def test_distillation_ratio_cap_is_ignored_and_no_cap_is_what_prime_rl_runs() -> None:
    """prime-rl's ref_kl loss weights by the uncapped ratio: a cap goes to ignored, max_ratio=None to mapped."""
    if "max_ratio" not in wai.OPD.knobs():
        pytest.skip("OPD has no max_ratio knob")
    capped = wai.prime_rl_config("reverse-text", wai.OPD(TEACHER, max_ratio=2.0), model=QWEN)
    assert capped.ignored["OPD.max_ratio"].startswith("2.0: no key caps the ratio: prime-rl's ref_kl loss")
    uncapped = wai.prime_rl_config("reverse-text", wai.OPSD(max_ratio=None), model=QWEN)
    assert uncapped.mapped["OPSD.max_ratio"].startswith("None: the uncapped ratio pi/mu")


def test_taskset_field_values_are_checked_where_declared() -> None:
    """gsm8k's split is Literal['train', 'test']; alphabet-sort's counts are >= 1 and ordered, its split only 'train'."""
    with pytest.raises(ConfigError, match=r"taskset 'gsm8k' field split='validation' is invalid: it must be one of "
                                          r"'train', 'test', got 'validation' \(verifiers:environments/gsm8k"):
        wai.prime_rl_config({"id": "gsm8k", "split": "validation"}, "grpo", model=QWEN)
    with pytest.raises(ConfigError, match=r"field split='test' is invalid: it must be one of 'train'"):
        wai.prime_rl_config({"id": "alphabet-sort", "split": "test"}, "grpo", model=QWEN)
    with pytest.raises(ConfigError, match=r"field min_turns=0 is invalid: it must be >= 1"):
        wai.prime_rl_config({"id": "alphabet-sort", "min_turns": 0}, "grpo", model=QWEN)
    with pytest.raises(ConfigError, match=r"min_names_per_turn=6 above max_names_per_turn=5: it needs "
                                          r"min_names_per_turn <= max_names_per_turn"):
        wai.prime_rl_config({"id": "alphabet-sort", "min_names_per_turn": 6}, "grpo", model=QWEN)


def test_every_bad_taskset_field_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        wai.prime_rl_config({"id": "alphabet-sort", "max_name_per_turn": 3, "min_turns": 0, "split": "dev"}, "grpo",
                            model=QWEN)
    message = str(caught.value)
    for part in ("has no field 'max_name_per_turn' (did you mean max_names_per_turn?", "field min_turns=0 is invalid: it must be >= 1",
                 "field split='dev' is invalid: it must be one of 'train'"):
        assert part in message, part


def test_alphabet_sort_fields_of_the_pin_are_accepted() -> None:
    fields = {"id": "alphabet-sort", "min_turns": 2, "max_turns": 4, "min_names_per_turn": 2,
              "max_names_per_turn": 8, "split": "train", "task": {"similarity_power": 2}}
    cfg = wai.prime_rl_config(fields, "grpo", model=QWEN)
    assert cfg.config["orchestrator"]["train"]["source"][0]["env"]["taskset"] == fields


def test_known_taskset_field_types_are_checked() -> None:
    with pytest.raises(ConfigError, match="field min_turns='2' is invalid: it must be int"):
        wai.prime_rl_config({"id": "alphabet-sort", "min_turns": "2"}, "grpo", model=QWEN)
    cfg = wai.prime_rl_config({"id": "alphabet-sort", "min_turns": 2, "max_turns": 4}, "grpo", model=QWEN)
    assert cfg.config["orchestrator"]["train"]["source"][0]["env"]["taskset"]["max_turns"] == 4


def test_written_file_is_readable_by_all(tmp_path) -> None:
    target = wai.prime_rl_config("reverse-text", "grpo", model=QWEN).write(tmp_path / "rl.toml")
    assert target.stat().st_mode & 0o777 == 0o644


def test_a_knob_value_prime_rl_does_not_take_is_named_by_its_knob() -> None:
    with pytest.raises(ConfigError, match=r"GRPO\.temperature=3\.0 cannot be written: it goes to "
                                          r"orchestrator\.train\.sampling\.temperature.*must be <= 2\.0"):
        wai.prime_rl_config("reverse-text", wai.GRPO(temperature=3.0), model=QWEN)


def test_no_lag_bound_is_written_with_a_warning() -> None:
    cfg = wai.prime_rl_config("reverse-text", wai.Async("grpo", off_policy_steps=0), model=QWEN)
    assert cfg.config["orchestrator"]["max_off_policy_steps"] == 0
    assert any(w.startswith("max_off_policy_steps = 0") for w in cfg.warnings)


def test_async_opd_carries_the_teacher_given_to_the_call() -> None:
    cfg = wai.prime_rl_config("reverse-text", wai.Async(wai.OPD()), model=QWEN, teacher=TEACHER)
    assert cfg.method.name == "async" and cfg.method.method.teacher == TEACHER
    assert cfg.config["orchestrator"]["algo"]["teacher"]["name"] == TEACHER.model


@pytest.mark.parametrize("sub", sorted(schema.SHARED))
def test_every_shared_sub_field_is_written_at_its_top_level_key(sub: str) -> None:
    top = schema.SHARED[sub]
    if top == "model.name":
        with pytest.raises(ConfigError, match="written from the method, env= or model="):
            wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{sub: "x"})
        return
    key = schema.KEYS[top]
    value = key.choices[0] if key.choices else {"int": 7, "str": "x", "bool": False, "list[str]": ["a"]}[key.kind]
    cfg = wai.prime_rl_config("reverse-text", "grpo", model=QWEN, **{sub: value})
    assert schema.get(cfg.config, top) == value
    assert schema.get(cfg.config, sub) is None
