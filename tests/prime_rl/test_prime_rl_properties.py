"""Invariants over many generated methods and overrides: a config that validates against the table, or a refusal."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import whileai as wai
from whileai.errors import ConfigError
from whileai.prime_rl import schema

from .cases import QWEN, tomllib

GROUPED = st.sampled_from([wai.GRPO, wai.DrGRPO, wai.RLOO, wai.MaxRL, wai.RAE])


@st.composite
def methods(draw):
    cls = draw(GROUPED)
    method = cls(rollouts_per_prompt=draw(st.integers(1, 40)), temperature=draw(st.floats(0.1, 2.0)),
                 max_tokens=draw(st.integers(1, 4096)))
    if draw(st.booleans()):
        method = wai.Async(method, correction="ipo", off_policy_steps=draw(st.integers(0, 16)),
                           threshold=draw(st.floats(0.01, 1.0)))
    return method


OVERRIDES = st.fixed_dictionaries({}, optional={
    "max_steps": st.integers(1, 1000),
    "lr": st.floats(1e-7, 1e-3),
    "seq_len": st.integers(512, 16384),
    "orchestrator.group_size": st.integers(1, 32),
    "lora": st.one_of(st.just(True), st.integers(1, 128)),
    "run.name": st.text("abcdefgh-", min_size=1, max_size=12),
})


@settings(max_examples=60, deadline=None)
@given(method=methods(), overrides=OVERRIDES)
def test_written_or_refused_never_invalid(method, overrides) -> None:
    try:
        cfg = wai.prime_rl_config("reverse-text", method, model=QWEN, **overrides)
    except ConfigError as err:
        assert "What you can do:" in str(err)  # the only refusal here is a group of one
        return
    config = cfg.config
    assert tomllib.loads(cfg.toml) == config
    assert schema.problems(config) == []
    k = config["orchestrator"]["group_size"]
    assert k == overrides.get("orchestrator.group_size", (getattr(method, "method", method)).rollouts_per_prompt)
    assert config["orchestrator"]["batch_size"] % k == 0
    if k == 1:
        assert config["orchestrator"]["algo"]["type"] == "rae"
    inner = getattr(method, "method", method)
    assert config["orchestrator"]["train"]["sampling"]["max_completion_tokens"] == inner.max_tokens
    if method.name == "async":
        assert config["trainer"]["loss"]["ipo_threshold"] == method.threshold
        assert config["orchestrator"]["max_off_policy_steps"] == method.off_policy_steps


def test_top_level_exports() -> None:
    from whileai.prime_rl import PrimeRLConfig, prime_rl_config

    assert wai.PrimeRLConfig is PrimeRLConfig and wai.prime_rl_config is prime_rl_config


@settings(max_examples=40, deadline=None)
@given(method=methods())
def test_what_is_written_is_the_methods_run_spec(method) -> None:
    """Group size, temperature and generation cap in the config equal the method's run spec (Async: the inner one's)."""
    try:
        cfg = wai.prime_rl_config("reverse-text", method, model=QWEN)
    except ConfigError:
        return
    spec = method.run_spec()
    assert schema.get(cfg.config, "orchestrator.group_size") == spec.rollouts_per_prompt
    assert schema.get(cfg.config, "orchestrator.train.sampling.temperature") == spec.temperature
    assert schema.get(cfg.config, "orchestrator.train.sampling.max_completion_tokens") == spec.max_tokens
