"""`wai train --help` says every fixed default (the flags default to None so a given value can be told apart,
which hid them: --lr-schedule, --eval-tasks, --eval-samples, --save-every, --warm-start-batch; newcomer review)."""

import re

import pytest

from whileai.cli import main
from whileai.loop.plan.config import TrainConfig


def test_every_fixed_default_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    sections = {m.group(1): re.sub(r"\s+", " ", m.group(2))  # each option's entry, up to the next option's
                for m in re.finditer(r"^  (--[a-z-]+)(.*?)(?=^  -)", out, re.S | re.M)}
    for name, spec in TrainConfig.__dataclass_fields__.items():
        if spec.default is None or isinstance(spec.default, bool) or name in ("knobs", "taskset_options"):
            continue
        flag = "--" + name.replace("_", "-")
        assert f"(default {spec.default})" in sections[flag], (flag, sections[flag])
