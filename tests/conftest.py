"""Suite-wide settings.

Tiny models run far faster on one thread: on a loaded 2-core machine a tiny-model step took 1.2 s with
torch's default threads and 15 ms with one (measured; see docs/decisions.md).
"""

from __future__ import annotations


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest hook signature
    try:
        import torch
    except ImportError:  # the numpy-only layers are tested without torch too
        return
    torch.set_num_threads(1)
