"""Engine settings declare their rules the way method knobs do: one ``Knob`` (value, doc, rule, source)
per field, which validation, CLI help and the service's capabilities all read."""

from __future__ import annotations

import dataclasses

import pytest

from whileai.engine import LOSSES, AdamParams, capabilities
from whileai.engine.training import ADAM_KNOBS
from whileai.errors import ConfigError
from whileai.knobs import Knob


def test_every_adam_field_is_a_knob_whose_value_is_the_default_and_whose_rule_is_enforced():
    fields = {f.name: f for f in dataclasses.fields(AdamParams)}
    assert list(fields) == list(ADAM_KNOBS) == list(AdamParams.knobs())
    for name, spec in ADAM_KNOBS.items():
        assert isinstance(spec, Knob) and spec.doc and "Tinker" in spec.source
        assert fields[name].default == spec.value == getattr(AdamParams(), name)
        assert fields[name].metadata["knob"] is spec
        assert spec.check(spec.value) is None and spec.check(-1.0) is not None  # every field refuses -1
        with pytest.raises(ConfigError) as caught:
            AdamParams(**{name: -1.0})
        assert str(caught.value).startswith(f"AdamParams.{name}=-1.0 must be {spec.check(-1.0)}")
    # the rules, one per field: [0, 1) for the betas, (0, inf) for eps, [0, inf) for the rest
    assert ADAM_KNOBS["beta1"].check(1.0) and ADAM_KNOBS["beta2"].check(1.0) and not ADAM_KNOBS["beta1"].check(0.0)
    assert ADAM_KNOBS["eps"].check(0.0) and not ADAM_KNOBS["learning_rate"].check(0.0)


def test_every_loss_config_key_is_a_knob_and_capabilities_read_them():
    caps = capabilities()
    for name, spec in LOSSES.items():
        for key, knob in spec.keys.items():
            assert isinstance(knob, Knob) and knob.doc and knob.source
            assert knob.check(knob.value) is None
            entry = caps[name]["config"][key]
            assert (entry["default"], entry["doc"], entry["source"]) == (knob.value, knob.doc, knob.source)
            assert entry["rule"] == knob.check(object())  # the rule text is the check's own words
    assert caps["ppo_critic"]["config"]["value_clip"]["rule"] == ("None (no clip; null from the shell) or a finite "
                                                                  "number in (0.0, inf)")
    assert caps["sapo"]["config"]["tau_pos"]["rule"] == "a finite number in (0.0, inf)"
