"""Suite-wide settings.

Tiny models run far faster on one thread: on a loaded 2-core machine a tiny-model step took 1.2 s with
torch's default threads and 15 ms with one (measured; see docs/decisions.md).
"""

from __future__ import annotations

import pytest


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest hook signature
    try:
        import torch
    except ImportError:  # the numpy-only layers are tested without torch too
        return
    torch.set_num_threads(1)


@pytest.fixture
def wai_token(monkeypatch: pytest.MonkeyPatch) -> str:
    """``$WAI_TOKEN`` set to the token every `wai policy` / `wai record` started by ``Started`` takes, so the
    library's clients in this process (ServerSampler, score, the recorder feed) authenticate as a user's would."""
    from whileai.record.launch import SHARED_TOKEN
    from whileai.service.auth import TOKEN_ENV

    monkeypatch.setenv(TOKEN_ENV, SHARED_TOKEN)
    return SHARED_TOKEN
