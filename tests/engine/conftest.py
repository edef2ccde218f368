"""Shared settings of the engine tests.

Tiny models on a shared 2-core machine run far faster on one thread: threads spin-wait for each other
on microsecond-sized ops (a tiny-model step took 1.2 s with 2 threads and 15 ms with 1, measured; see
docs/decisions.md). ``tests/conftest.py`` sets one thread for the whole suite; this fixture holds it
for every engine test even if something else changed it, and restores the previous count after.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
