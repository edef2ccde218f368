"""`wai policy` and `wai serve` take torch's threads from the rule `wai train` uses (not torch's default of every
core, which made a shared 2-core machine 47x slower): --threads N as given, 0 for torch's own, else the rule."""

from __future__ import annotations

import pytest
import torch

from whileai.cli.options import set_threads
from whileai.errors import ConfigError


@pytest.fixture(autouse=True)
def _keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_rule_gives_the_servers_threads_and_says_where_they_came_from(monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    set_threads(None, "policy")
    assert torch.get_num_threads() == 3
    assert capsys.readouterr().out == "wai policy: torch threads 3 (rule: 3: $OMP_NUM_THREADS)\n"
    set_threads(2, "serve")
    assert torch.get_num_threads() == 2 and "torch threads 2 (--threads)" in capsys.readouterr().out


def test_zero_keeps_torchs_own_and_a_negative_count_is_refused(capsys):
    torch.set_num_threads(1)
    set_threads(0, "serve")
    assert torch.get_num_threads() == 1 and "torch's own choice" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="--threads -1"):
        set_threads(-1, "policy")
