"""The batch contract: every refusal names the row, the field, what is wrong and how to fix it."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import whileai as wai
from whileai.rows.batch import Batch

from ._kit import random_rows


def good() -> dict:
    return {"reward": 1.0, "logprobs": [-0.5, -1.0, -0.1], "behavior_logprobs": [-0.4, -1.0, -0.2],
            "action_mask": [True, False, True]}


@pytest.mark.parametrize("change, pieces", [
    ({"behavior_logprobs": [-0.4, -1.0]}, ["row 1", "'behavior_logprobs'", "2 entries", "'logprobs' has 3"]),
    ({"action_mask": [True]}, ["row 1", "'action_mask'", "1 entries"]),
    ({"values": [0.1, 0.2, 0.3, 0.4]}, ["row 1", "'values'", "4 entries"]),
    ({"logprobs": [-0.5, float("nan"), -0.1]}, ["row 1", "'logprobs'", "nan at token 1", "finite"]),
    ({"behavior_logprobs": [-0.4, float("-inf"), -0.2]}, ["row 1", "'behavior_logprobs'", "-inf at token 1"]),
    ({"values": [0.1, float("inf"), 0.3]}, ["row 1", "'values'", "inf at token 1"]),
    ({"logprobs": [-0.5, 0.2, -0.1]}, ["row 1", "'logprobs'", "0.2 at token 1", "above 0", "not probabilities"]),
    ({"ref_logprobs": [-0.5, -0.1, 1e-3]}, ["row 1", "'ref_logprobs'", "above 0"]),
    ({"logprobs": [], "behavior_logprobs": [], "action_mask": []}, ["row 1", "'logprobs' is empty", "Drop the row"]),
    ({"action_mask": [False, False, False]}, ["row 1", "'action_mask'", "no action tokens"]),
    ({"reward": None}, ["row 1", "'reward'", "must be a number"]),
    ({"reward": float("nan")}, ["row 1", "'reward'", "finite"]),
    ({"logprobs": "abc"}, ["row 1", "'logprobs'", "list"]),
    # a string is not read as true, nor a 2 as a mask value, nor a nested list as a flat one
    ({"action_mask": ["false", "true", "true"]}, ["row 1", "'action_mask'", "true/false (or 0/1)", "'false'"]),
    ({"action_mask": [2, 1, 0]}, ["row 1", "'action_mask'", "true/false (or 0/1)"]),
    ({"action_mask": [[True], [False], [True]]}, ["row 1", "'action_mask'", "flat list"]),
    ({"truncated": "no"}, ["row 1", "'truncated' is 'no' (str)", "true or false"]),
])
def test_each_bad_row_is_refused_with_row_field_and_fix(change, pieces):
    rows = [good(), {**good(), **change}]
    with pytest.raises(wai.BatchError) as err:
        Batch.from_rows(rows)
    assert isinstance(err.value, ValueError)
    for piece in pieces:
        assert piece in str(err.value), (piece, str(err.value))


def test_missing_reward_and_missing_logprobs():
    row = good()
    del row["reward"]
    with pytest.raises(wai.BatchError, match=r"row 0: field 'reward' is missing.*grade the row first"):
        Batch.from_rows([row])
    row = good()
    del row["logprobs"]
    with pytest.raises(wai.BatchError, match=r"row 0: field 'logprobs' is missing"):
        Batch.from_rows([row])


def test_empty_batch_and_non_dict_row():
    with pytest.raises(wai.BatchError, match="the batch is empty"):
        Batch.from_rows([])
    with pytest.raises(wai.BatchError, match="row 1: expected a dict"):
        Batch.from_rows([good(), [1, 2]])


def test_values_on_some_rows_only_is_refused():
    rows = [{**good(), "values": [0.1, 0.2, 0.3]}, good()]
    with pytest.raises(wai.BatchError, match="row 1: field 'values' is missing but other rows carry it"):
        Batch.from_rows(rows)


def test_critic_method_without_values_is_refused_naming_the_method():
    sao = wai.method("sao")
    with pytest.raises(wai.BatchError) as err:
        sao.update([good(), good()])
    text = str(err.value)
    assert "row 0" in text and "'values'" in text and "sao needs it" in text and "2 of 2 rows lack it" in text


def test_method_needing_reference_says_so():
    with pytest.raises(wai.BatchError, match=r"row 0: field 'ref_logprobs' is missing.*dpo needs it"):
        wai.method("dpo").update([{**good(), "task_id": "a"}])


def test_packed_layout_and_on_policy_default():
    """Row 0 has 3 tokens, row 1 has 2 with no behavior_logprobs: offsets (0, 3, 5), rho = 1 on row 1."""
    rows = [good(), {"reward": 0.0, "logprobs": [-0.3, -0.2]}]
    batch = Batch.from_rows(rows)
    np.testing.assert_array_equal(batch.offsets, [0, 3, 5])
    np.testing.assert_array_equal(batch.action_tokens_B, [2, 2])
    np.testing.assert_allclose(batch.ratio_N, np.exp([-0.1, 0.0, 0.1, 0.0, 0.0]))
    assert [len(a) for a in batch.split(batch.logprobs_N)] == [3, 2]


@pytest.mark.parametrize("name", ["flash_reinforce", "sft", "dpo", "rm", "opd", "opsd", "grpo", "sao", "bpco",
                                  "reinforce_ada"])
def test_no_method_mutates_its_input_rows(name):
    rows = random_rows(3, n=8, values=True, ref=True, teacher=True)
    for i, row in enumerate(rows):
        row["score"] = 0.1 * i
    before = copy.deepcopy(rows)
    wai.method(name).update(rows)
    assert rows == before
