"""`wai serve` + the official Tinker SDK on a real model folder (tests/fixtures/qwen.py): the same stop rule as the
engine and `wai policy` (stop strings on the text, every generation_config EOS id), and the SDK's tokenizer."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

tinker = pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
from tinker import types  # noqa: E402

from tests.fixtures.qwen import EOS, mid_token_stop, qwen_model_folder  # noqa: E402
from whileai.service.launch import start_server  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:DEPRECATED:FutureWarning")]


@pytest.fixture(scope="module")
def folders(qwen_folder: Any, tmp_path_factory: Any) -> tuple[Any, Any]:
    """The plain folder, and one whose model ends with <|endoftext|> (generation_config's EOS, not the tokenizer's)."""
    return qwen_folder, qwen_model_folder(tmp_path_factory.mktemp("eot"), favour=[EOS])


@pytest.fixture(scope="module")
def real_sdk(folders: tuple[Any, Any], tmp_path_factory: Any) -> Iterator[Any]:
    models = [arg for folder in folders for arg in ("--model", str(folder))]
    token = "tml-" + secrets.token_urlsafe(24)
    with start_server(tmp_path_factory.mktemp("tinker-real") / "data", token=token, args=models) as server:
        client = tinker.ServiceClient(base_url=server.url, api_key=server.token)
        yield client
        client.holder.close()


def sampler_of(sdk: Any, folder: Any) -> Any:
    training = sdk.create_lora_training_client(base_model=str(folder), rank=4).result()
    return training, training.save_weights_and_get_sampling_client()


def test_the_tinker_front_stops_on_text_and_on_every_eos_id(real_sdk: Any, folders: tuple[Any, Any]) -> None:
    from transformers import AutoTokenizer

    sdk, (qwen_folder, ends_with_endoftext) = real_sdk, folders

    tok = AutoTokenizer.from_pretrained(str(qwen_folder))
    prompt = types.ModelInput.from_ints(tok.encode("Count: one,"))
    training, sampler = sampler_of(sdk, qwen_folder)
    assert training.get_tokenizer().encode("Count: one,") == tok.encode("Count: one,")  # the SDK's get_tokenizer

    def draw(stop: Any) -> Any:
        params = types.SamplingParams(max_tokens=24, seed=3, temperature=1.0, stop=stop)
        return sampler.sample(prompt, 1, params).result().sequences[0]

    free = draw([])                                              # stop=[]: no EOS stop either
    stop, k = mid_token_stop(tok, list(free.tokens))
    got = draw([stop])
    assert (list(got.tokens), got.stop_reason) == (list(free.tokens)[:k + 1], "stop")
    # a model that ends with <|endoftext|>: not the tokenizer's EOS, but generation_config.json's
    _, ends = sampler_of(sdk, ends_with_endoftext)
    seq = ends.sample(prompt, 1, types.SamplingParams(max_tokens=6, seed=0)).result().sequences[0]
    assert (list(seq.tokens), seq.stop_reason) == ([EOS], "stop")
