"""The conformance table in docs/tinker.md covers the installed Tinker SDK, and its client-side rows hold.

The table is generated from the SDK by introspection (scripts/tinker_conformance.py): a new SDK with a public
method of RestClient, ServiceClient, TrainingClient or SamplingClient that the script's CALLS does not list
fails here, as does a doc table that differs from the generated one, a row that says 404 or names a test that
does not exist.
"""

from __future__ import annotations

import importlib.util
import pickle
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

tinker = pytest.importorskip("tinker", reason="the Tinker SDK is not installed: pip install whileai[tinker]")
from tinker import types  # noqa: E402
from tinker.lib.api_future_impl import QueueState  # noqa: E402

from whileai.service.launch import LocalServer, start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [1, 57, 46, 54, 64]
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


def conformance() -> Any:
    spec = importlib.util.spec_from_file_location("tinker_conformance", ROOT / "scripts" / "tinker_conformance.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_every_public_sdk_method_is_in_the_table_and_no_row_is_a_404() -> None:
    table = conformance()
    assert table.missing() == [], ("the installed SDK has methods the conformance table does not list; add them to "
                                   "scripts/tinker_conformance.py CALLS and run it with --write")
    doc = (ROOT / "docs" / "tinker.md").read_text()
    block = doc.split(table.START, 1)[1].split(table.END, 1)[0].strip()
    assert block == table.render(), "docs/tinker.md's table is stale: python scripts/tinker_conformance.py --write"
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    assert len(rows) == sum(len(v) for v in table.methods().values())
    for row in rows:
        call, status, how, test = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert status in table.STATUSES and "404" not in row, row
        path, _, name = test.strip("`").partition("::")
        assert re.search(rf"^def {name}\(", (ROOT / "tests" / "service" / path).read_text(), re.M), row


@pytest.fixture(scope="module")
def folder_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalServer, str]]:
    """A `wai serve` of a model directory (the built-in tiny model exported), as users serve their own."""
    from whileai.engine import TrainingEngine

    model = str(tmp_path_factory.mktemp("model") / "tiny")
    TrainingEngine("builtin:tiny").export(model, merged=True)
    with start_server(tmp_path_factory.mktemp("folder") / "data", token="tml-" + secrets.token_urlsafe(24),
                      args=["--model", model]) as server:
        yield server, model


def test_the_client_side_calls_and_handles_work_against_wai_serve(folder_server: tuple[LocalServer, str]) -> None:
    server, model = folder_server
    service = tinker.ServiceClient(base_url=server.url, api_key=server.token)
    rest = tinker.RestClient(base_url=server.url, api_key=server.token)
    assert [m.model_name for m in service.get_server_capabilities().supported_models] == [model]
    assert [m.model_name for m in rest.get_server_capabilities().result(timeout=30).supported_models] == [model]
    training = service.create_lora_training_client(base_model=model, rank=4).result()
    text = training.get_tokenizer().decode(PROMPT[1:])
    sampler = training.save_weights_and_get_sampling_client().result()
    assert sampler.get_base_model() == model
    assert sampler.get_tokenizer().decode(PROMPT[1:]) == text == "6+3="
    assert rest.get_sampler(sampler._sampling_session_id).result(timeout=30).base_model == model
    params = types.SamplingParams(max_tokens=3, seed=4)
    first = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, params).result(timeout=60)
    clone = tinker.SamplingClient.from_sampler_handle(sampler.get_sampler_handle(), api_key=server.token)
    assert list(clone.sample(types.ModelInput.from_ints(PROMPT), 1, params).result(timeout=60).sequences[0].tokens) \
        == list(first.sequences[0].tokens)
    created = tinker.SamplingClient.create(service.holder, model_path=None, base_model=model).result()
    assert created.sample(types.ModelInput.from_ints(PROMPT), 1, params).result(timeout=60).sequences
    sampler.on_queue_state_change(QueueState.ACTIVE, None)  # the SDK's own hook (it logs a paused queue)
    assert isinstance(service.get_console_url(), str) and isinstance(training.get_console_url(), str)
    assert pickle.loads(pickle.dumps(sampler)).get_base_model() == model
    with pytest.raises(RuntimeError, match="whoami requires JWT auth, but the server has it disabled"):
        rest.whoami().result(timeout=30)
    service.holder.close()


def test_a_custom_loss_runs_on_the_client_and_equals_cross_entropy(sdk: Any) -> None:
    training = sdk.create_lora_training_client(base_model="builtin:tiny", rank=4).result()
    tokens = PROMPT + [60, 2]
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [0.0] * 4 + [1.0, 1.0]})

    def neg_ll(logprobs: Any, weights: Any) -> Any:
        loss = -(logprobs * weights).sum()
        return loss, {"custom/neg_ll:sum": loss}

    handle = sdk.create_custom_loss(neg_ll, input_ranks={"logprobs": 1, "weights": 1}).result(timeout=60)
    custom = training.forward_backward_custom([datum], handle).result(timeout=60)
    reference = training.forward([datum], "cross_entropy").result(timeout=60)
    assert custom.metrics["custom/neg_ll:sum"] == pytest.approx(reference.metrics["loss:sum"], rel=1e-5)
