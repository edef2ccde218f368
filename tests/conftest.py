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


# ------------------------------------------------------------------ a real tokenizer (tests/fixtures/qwen.py)
@pytest.fixture(scope="session")
def qwen_tokenizer_dir():
    """Qwen2's tokenizer rebuilt from the vocabulary in the PyPI package dashscope (cached); skips when unfetchable."""
    from tests.fixtures.qwen import Unavailable, qwen_tokenizer_dir

    try:
        return qwen_tokenizer_dir()
    except Unavailable as err:
        pytest.skip(f"no real tokenizer: {err}")


@pytest.fixture(scope="session")
def qwen_folder(qwen_tokenizer_dir, tmp_path_factory):
    """A model folder as a user brings it: a tiny random Qwen2 (151,936 ids) in bfloat16, Qwen2's tokenizer with
    its ChatML template and no BOS, and generation_config.json's eos_token_id [151645, 151643]."""
    from tests.fixtures.qwen import qwen_model_folder

    return qwen_model_folder(tmp_path_factory.mktemp("qwen-folder"))
