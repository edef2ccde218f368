"""Every method class's dataclass fields, as declared before the knob fields were shared between classes
(data/fields.json, recorded from the classes as they were): the same names in the same order (the repr and
positional construction read that order), the same annotations and defaults, and each knob field's default,
doc, source and rule as its row of the knob table said."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import whileai.methods as methods
from whileai.methods import CLASSES
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


if __name__ == "__main__":  # re-record (only when a field is meant to change)
    lines = [f"{json.dumps(name)}: {json.dumps(fields)}" for name, fields in current().items()]
    RECORDED.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")
