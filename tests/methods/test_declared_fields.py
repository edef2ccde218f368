"""Every method class's dataclass fields, as declared before the knob fields were shared between classes
(data/fields.json, recorded from the classes as they were): the same names in the same order (the repr and
positional construction read that order), the same annotations and defaults, and each knob field's default,
doc, source and rule as its row of the knob table said. Since then the sampling knobs (``temperature``,
``max_tokens``, ``rollouts_per_prompt``) are written once, on ``base.Sampled`` / ``base.SampledPerPrompt``, and
each class takes them at its row's place: the recording still holds."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

import whileai.methods as methods
from whileai.methods import CLASSES
from whileai.methods.base import Sampled, SampledPerPrompt
from whileai.methods.defaults import DEFAULTS

RECORDED = Path(__file__).parent / "data" / "fields.json"


def _knob(spec: Any) -> list[Any] | None:
    """What a field's knob says: value, doc, source, paper value, why, and which rule checks it."""
    if spec is None:
        return None
    return [repr(spec.value), spec.doc, spec.source, repr(spec.paper), spec.why, spec.check.__qualname__]


def declared(cls: type) -> list[list[Any]]:
    out = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else "<missing>"
        out.append([f.name, str(f.type), repr(default), _knob(f.metadata.get("knob"))])
    return out


def current() -> dict[str, Any]:
    return {name: declared(getattr(methods, name)) for name in sorted(CLASSES)}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_fields_are_the_recorded_ones(name: str) -> None:
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))
    assert declared(getattr(methods, name)) == recorded[name]


def test_a_knob_of_a_shared_field_is_the_class_own_row() -> None:
    """A field a base class declares takes each subclass's own row where that row names it."""
    assert methods.MaxRL.knobs()["rollouts_per_prompt"] is DEFAULTS["max_rl"]["rollouts_per_prompt"]
    assert methods.RLOO.knobs()["rollouts_per_prompt"] is DEFAULTS["rloo"]["rollouts_per_prompt"]
    assert methods.DAPO.knobs()["clip_high"] is DEFAULTS["dapo"]["clip_high"]
    assert methods.DAPO.knobs()["rollouts_per_prompt"] is DEFAULTS["grpo"]["rollouts_per_prompt"]  # DAPO's row has none
    assert methods.DAPO().clip_high == 0.28 and methods.GRPO().clip_high is None


SHARED = {"temperature": Sampled, "max_tokens": Sampled, "rollouts_per_prompt": SampledPerPrompt}


def test_each_sampling_knob_has_one_field_declaration() -> None:
    """``temperature: float = knob()`` and its two peers are written once in methods/: every class that has one
    derives from the base that declares it, and its per-method value is its row of the knob table."""
    found = [(path.name, m.group(1)) for path in sorted(Path(methods.__file__).parent.glob("*.py"))
             if path.name != "run_spec.py"  # what a method tells the loop, read from these fields
             for m in re.finditer(r"^    (temperature|max_tokens|rollouts_per_prompt): \w+ = ", path.read_text(), re.M)]
    assert sorted(found) == [("base.py", "max_tokens"), ("base.py", "rollouts_per_prompt"), ("base.py", "temperature")]
    for name in CLASSES:
        cls = getattr(methods, name)
        for f in dataclasses.fields(cls):
            if f.name in SHARED:
                assert issubclass(cls, SHARED[f.name]), (name, f.name)


def test_a_shared_knob_keeps_each_class_positional_order() -> None:
    """The shared knobs sit where each class wrote them: positional construction reads the recorded order."""
    assert methods.GRPO(4).rollouts_per_prompt == 4
    assert methods.RAE(0.5, 2).rollouts_per_prompt == 2
    assert methods.SAO((0.7, 6.0), 1.5, 2, 10, 0.7).temperature == 0.7
    made = methods.GRPO(4, temperature=0.7)
    assert made.set_fields() == {"rollouts_per_prompt", "temperature"}
    assert methods.MaxRL().rollouts_per_prompt == DEFAULTS["max_rl"]["rollouts_per_prompt"].value


def test_a_base_without_the_knob_in_its_row_is_refused_when_declared() -> None:
    with pytest.raises(TypeError, match="row 'sft' of the knob table .* has no 'temperature'"):
        @dataclasses.dataclass(frozen=True)
        class Broken(Sampled):
            name = "sft"


if __name__ == "__main__":  # re-record (only when a field is meant to change)
    lines = [f"{json.dumps(name)}: {json.dumps(fields)}" for name, fields in current().items()]
    RECORDED.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")
