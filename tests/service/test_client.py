"""The client's own parts, without a server: light import, JSON encoding, the custom-loss weights."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from whileai.engine import AdamParams, SamplingParams
from whileai.errors import BatchError
from whileai.trainers.custom import custom_weights
from whileai.trainers.wai_client import dumps


def test_importing_the_client_does_not_import_torch():
    code = "import sys, whileai.service; print('torch' in sys.modules, 'fastapi' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_bodies_encode_dataclasses_arrays_and_tensors():
    body = {"adam": AdamParams(learning_rate=0.5), "params": SamplingParams(max_tokens=3, stop=[2]),
            "weights": np.array([0.0, 1.5], dtype=np.float32), "tokens": torch.tensor([1, 2]), "n": np.int64(4)}
    decoded = json.loads(dumps(body))
    assert decoded["adam"]["learning_rate"] == 0.5 and decoded["adam"]["beta2"] == 0.95
    assert decoded["params"]["max_tokens"] == 3 and decoded["params"]["stop"] == [[2]]
    assert decoded["weights"] == [0.0, 1.5] and decoded["tokens"] == [1, 2] and decoded["n"] == 4
    with pytest.raises(TypeError, match="cannot send a value of type object as JSON"):
        dumps({"x": object()})


def test_custom_weights_are_minus_the_gradient_at_the_scored_positions():
    """loss = sum lp^2 over scored positions, so dloss/dlp = 2 lp and the weight is -2 lp there, 0 elsewhere.
    Datum 0 scores positions 1 and 2 (lp -0.5, -2.0): weights [0, 1.0, 4.0]."""
    data = [{"model_input": [1, 5, 6], "loss_fn_inputs": {"target_tokens": [5, 6, 2], "weights": [0, 1, 1]}}]
    outputs = [{"logprobs": [-9.0, -0.5, -2.0]}]

    def loss_fn(data, logprobs):
        assert [lp.tolist() for lp in logprobs] == [[-0.5, -2.0]]  # only the scored positions
        return sum((lp ** 2).sum() for lp in logprobs), {"n": 2}

    weighted, loss, metrics = custom_weights(data, outputs, loss_fn)
    assert weighted[0]["loss_fn_inputs"]["weights"] == [0.0, 1.0, 4.0]
    assert weighted[0]["loss_fn_inputs"]["target_tokens"] == [5, 6, 2] and weighted[0]["model_input"] == [1, 5, 6]
    assert loss == 4.25 and metrics == {"n": 2.0}


def test_custom_weights_refuse_a_datum_without_weights_and_a_non_finite_loss():
    datum = {"model_input": [1, 5], "loss_fn_inputs": {"target_tokens": [5, 2]}}
    with pytest.raises(BatchError, match="datum 0: forward_backward_custom needs"):
        custom_weights([datum], [{"logprobs": [-1.0, -1.0]}], lambda d, lp: (lp[0].sum(), {}))
    datum["loss_fn_inputs"]["weights"] = [1, 1]
    with pytest.raises(BatchError, match="the loss is nan"):
        custom_weights([datum], [{"logprobs": [-1.0, -1.0]}], lambda d, lp: (lp[0].sum() * float("nan"), {}))


def test_an_export_archive_unpacks_the_same_with_or_without_pythons_data_filter(tmp_path, monkeypatch):
    """Python before 3.10.12 / 3.11.4 has no ``filter="data"``: the fallback unpacks plain files the same and
    refuses a member that would land outside the folder."""
    import io
    import tarfile

    from whileai.errors import WhileaiError
    from whileai.trainers.wai_client import _unpack

    def archive(name: str) -> tarfile.TarFile:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
        buffer.seek(0)
        return tarfile.open(fileobj=buffer, mode="r:gz")

    _unpack(archive("adapter/config.json"), tmp_path / "with")
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    _unpack(archive("adapter/config.json"), tmp_path / "without")
    assert (tmp_path / "with" / "adapter" / "config.json").read_bytes() == b"abc"
    assert (tmp_path / "without" / "adapter" / "config.json").read_bytes() == b"abc"
    with pytest.raises(WhileaiError, match="'../escape' is not a plain file inside the folder"):
        _unpack(archive("../escape"), tmp_path / "bad")
    assert not (tmp_path / "escape").exists()
