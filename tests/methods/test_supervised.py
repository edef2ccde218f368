"""SFT, DPO and RM: hand-worked cases, pairing, slow references and autograd of the stated losses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import whileai as wai
from whileai.methods.supervised import DPO, RM, SFT, pair_rows
from whileai.rows.batch import Batch
from whileai.simulations import reference

from ._kit import random_rows


# --------------------------------------------------------------------- SFT
def test_sft_hand_worked():
    """Rows of 3 tokens (one a tool token) and 1 token: N = 3 action tokens, B = 2, T = (2, 1).

    sum: c = 1 on action tokens; token_mean: c = 1/3; sequence_mean: c = 1/(B T_i) = 1/4 and 1/2.
    """
    rows = [{"reward": 1.0, "logprobs": [-0.1, -0.2, -0.3], "action_mask": [True, False, True]},
            {"reward": 1.0, "logprobs": [-0.5]}]
    assert [c.tolist() for c in SFT().update(rows).coefficients] == [[1.0, 0.0, 1.0], [1.0]]
    np.testing.assert_allclose(SFT(normalize="token_mean").update(rows).coefficients[0], [1 / 3, 0, 1 / 3])
    seq = SFT(normalize="sequence_mean").update(rows).coefficients
    np.testing.assert_allclose(seq[0], [0.25, 0.0, 0.25])
    np.testing.assert_allclose(seq[1], [0.5])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("normalize", ["sum", "token_mean", "sequence_mean"])
def test_sft_is_minus_the_gradient_of_the_nll(seed, normalize):
    rows = random_rows(seed, n=7)
    update = SFT(normalize=normalize).update(rows)
    leaves, loss = [], torch.zeros((), dtype=torch.float64)
    n_tokens = sum(sum(r["action_mask"]) for r in rows)
    for row in rows:
        lp = torch.tensor(row["logprobs"], dtype=torch.float64, requires_grad=True)
        mask = torch.tensor(row["action_mask"], dtype=torch.float64)
        scale = {"sum": 1.0, "token_mean": 1.0 / n_tokens, "sequence_mean": 1.0 / (len(rows) * mask.sum())}[normalize]
        loss = loss - scale * (mask * lp).sum()
        leaves.append(lp)
    loss.backward()
    for c, lp in zip(update.coefficients, leaves):
        np.testing.assert_allclose(c, -lp.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("normalize", ["sum", "token_mean", "sequence_mean"])
def test_sft_matches_slow_reference(seed, normalize):
    rows = random_rows(seed + 20, n=9)
    for got, want in zip(SFT(normalize=normalize).update(rows).coefficients, reference.sft(rows, normalize)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_sft_notes_rows_below_the_best_reward():
    rows = [{"reward": 1.0, "logprobs": [-0.1]}, {"reward": 0.0, "logprobs": [-0.1]}]
    assert "does not filter on reward" in SFT().update(rows).notes[0]
    assert SFT().update(rows[:1]).notes == []


# --------------------------------------------------------------------- pairing
def test_pairs_match_lengths_within_a_task():
    """Task a: passes of lengths 2 and 5, fails of lengths 4, 6 and 1.

    The shorter pass (row 0, length 2) takes the nearest fail: |1 - 2| = 1 (row 4). The pass of
    length 5 (row 1) then sees fails of lengths 4 and 6, both 1 away: the lower index, row 2, wins.
    Row 3 (length 6) is left unpaired; task b has only a pass, also unpaired.
    """
    def row(reward, n, task="a"):
        return {"reward": reward, "logprobs": [-0.1] * n, "task_id": task}
    rows = [row(1, 2), row(1, 5), row(0, 4), row(0, 6), row(0, 1), row(1, 3, "b")]
    pairs = pair_rows(Batch.from_rows(rows), 1.0, "dpo")
    assert pairs.chosen.tolist() == [0, 1] and pairs.rejected.tolist() == [4, 2]
    assert pairs.unpaired.tolist() == [3, 5]


def test_explicit_pairs_from_select_and_their_errors():
    rows = [{"reward": 0.0, "logprobs": [-0.1], "pair": 7, "chosen": False},
            {"reward": 0.0, "logprobs": [-0.2], "pair": 7, "chosen": True}]
    pairs = pair_rows(Batch.from_rows(rows), 1.0, "dpo")  # explicit pairs ignore reward
    assert pairs.chosen.tolist() == [1] and pairs.rejected.tolist() == [0]
    bad = rows + [{"reward": 1.0, "logprobs": [-0.1], "pair": 7, "chosen": True}]
    with pytest.raises(wai.BatchError, match="pair 7 has 3 rows"):
        pair_rows(Batch.from_rows(bad), 1.0, "dpo")
    with pytest.raises(wai.BatchError, match="row 2: .*needs 'pair'"):
        pair_rows(Batch.from_rows(rows + [{"reward": 1.0, "logprobs": [-0.1]}]), 1.0, "dpo")


def test_pairs_need_task_ids():
    with pytest.raises(wai.BatchError, match="row 0: field 'task_id' is missing"):
        pair_rows(Batch.from_rows([{"reward": 1.0, "logprobs": [-0.1]}]), 1.0, "dpo")


# --------------------------------------------------------------------- DPO
def test_dpo_hand_worked():
    """Chosen: sum(lp - ref) = (-1 + 1.5) + 0 = 0.5. Rejected: -2 - (-1) = -1.

    z = 0.1 * (0.5 - (-1)) = 0.15; sigmoid(-0.15) = 0.4625702; c = +-0.1 * 0.4625702 = +-0.04625702,
    on every action token of each row (row 0's tool token gets 0). Loss -log sigmoid(0.15) = log(1 + e^-0.15) = log(1.8607080) = 0.6209570.
    """
    rows = [{"reward": 1.0, "logprobs": [-1.0, -1.0, -3.0], "ref_logprobs": [-1.5, -1.0, -0.1],
             "action_mask": [True, True, False], "task_id": "q"},
            {"reward": 0.0, "logprobs": [-2.0], "ref_logprobs": [-1.0], "task_id": "q"}]
    update = DPO().update(rows)
    np.testing.assert_allclose(update.coefficients[0], [0.04625702, 0.04625702, 0.0], rtol=1e-6)
    np.testing.assert_allclose(update.coefficients[1], [-0.04625702], rtol=1e-6)
    assert update.stats["mean_margin"] == pytest.approx(0.15)
    assert update.stats["mean_loss"] == pytest.approx(0.6209570, rel=1e-6)
    assert update.stats["preference_accuracy"] == 1.0
    assert str(update).startswith("dpo update: 2 of 2 trajectories admitted")


def dpo_torch_loss(rows, pairs, beta):
    leaves = [torch.tensor(r["logprobs"], dtype=torch.float64, requires_grad=True) for r in rows]
    margins = [((lp - torch.tensor(r["ref_logprobs"], dtype=torch.float64))
                * torch.tensor(r["action_mask"], dtype=torch.float64)).sum() for lp, r in zip(leaves, rows)]
    loss = sum(-torch.nn.functional.logsigmoid(beta * (margins[w] - margins[lose])) for w, lose in pairs)
    return loss, leaves


@pytest.mark.parametrize("seed", range(4))
def test_dpo_is_minus_the_gradient_of_its_loss(seed):
    rows = random_rows(seed, n=10, ref=True, tasks=2)
    update = DPO(beta=0.3).update(rows)
    pairs = pair_rows(Batch.from_rows(rows), 1.0, "dpo")
    loss, leaves = dpo_torch_loss(rows, list(zip(pairs.chosen, pairs.rejected)), 0.3)
    if pairs.chosen.size:
        loss.backward()
    for i, (c, lp) in enumerate(zip(update.coefficients, leaves)):
        grad = lp.grad.numpy() if lp.grad is not None else np.zeros(len(c))
        np.testing.assert_allclose(c, -grad, rtol=1e-10, atol=1e-15)
        assert update.admitted[i] == (i in pairs.chosen or i in pairs.rejected)


@pytest.mark.parametrize("seed", range(4))
def test_dpo_matches_slow_reference(seed):
    """Loops over pairs and tokens with math.exp, no numpy."""
    rows = random_rows(seed + 10, n=9, ref=True, tasks=3)
    update = DPO(beta=0.2).update(rows)
    pairs = pair_rows(Batch.from_rows(rows), 1.0, "dpo")
    want = reference.dpo(rows, pairs.chosen.tolist(), pairs.rejected.tolist(), beta=0.2)
    for got, exp in zip(update.coefficients, want):
        np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-15)


def test_dpo_invariants_and_unpaired_note():
    rows = [{"reward": 1.0, "logprobs": [-0.3, -0.4], "ref_logprobs": [-0.3, -0.4], "task_id": "a"},
            {"reward": 0.0, "logprobs": [-0.9], "ref_logprobs": [-0.9], "task_id": "a"},
            {"reward": 1.0, "logprobs": [-0.2], "ref_logprobs": [-0.2], "task_id": "b"}]
    update = DPO().update(rows)
    # policy == reference: z = 0, sigmoid(0) = 1/2, c = +-beta/2
    np.testing.assert_allclose(update.coefficients[0], [0.05, 0.05])
    np.testing.assert_allclose(update.coefficients[1], [-0.05])
    assert update.coefficients[2].tolist() == [0.0] and update.admitted.tolist() == [True, True, False]
    assert "1 trajectory (2) of 3 left unpaired, c = 0" in update.notes[0]
    assert "explicit 'pair' and 'chosen'" in update.notes[0]


def test_dpo_repr_and_validation():
    assert repr(DPO()) == "DPO(beta=0.1, pass_reward=1.0)"
    with pytest.raises(wai.ConfigError, match=r"DPO.beta=0 is invalid: it must be a finite number in \(0.0, inf\)"):
        DPO(beta=0)


# --------------------------------------------------------------------- RM
def test_rm_hand_worked():
    """Scores r_w = 0.3, r_l = 0.5: the head prefers the fail. Delta = -0.2, sigmoid(0.2) = 0.5498340.

    c = +0.549834 on the chosen row's last token (index 2, a tool token: the head reads the last token
    whoever wrote it), -0.549834 on the rejected row's last token; 0 everywhere else. Loss
    -log sigmoid(-0.2) = 0.7981389.
    """
    rows = [{"reward": 1.0, "logprobs": [-0.1, -0.2, -0.3], "action_mask": [True, True, False], "task_id": "a",
             "score": 0.3},
            {"reward": 0.0, "logprobs": [-0.5, -0.4], "task_id": "a", "score": 0.5}]
    update = RM().update(rows)
    np.testing.assert_allclose(update.coefficients[0], [0.0, 0.0, 0.549834], rtol=1e-6)
    np.testing.assert_allclose(update.coefficients[1], [0.0, -0.549834], rtol=1e-6)
    assert update.stats["mean_loss"] == pytest.approx(0.7981389, rel=1e-6)
    assert update.stats["preference_accuracy"] == 0.0


@pytest.mark.parametrize("seed", range(3))
def test_rm_is_minus_the_gradient_of_bradley_terry(seed):
    rows = random_rows(seed, n=10, tasks=2)
    rng = np.random.default_rng(seed)
    for row in rows:
        row["score"] = float(rng.standard_normal())
    update = RM().update(rows)
    scores = torch.tensor([r["score"] for r in rows], dtype=torch.float64, requires_grad=True)
    pairs = pair_rows(Batch.from_rows(rows), 1.0, "rm")
    loss = sum(-torch.nn.functional.logsigmoid(scores[w] - scores[lose]) for w, lose in zip(pairs.chosen, pairs.rejected))
    grad = torch.autograd.grad(loss, scores)[0].numpy() if pairs.chosen.size else np.zeros(len(rows))
    for i, c in enumerate(update.coefficients):
        assert c.sum() == pytest.approx(-grad[i], abs=1e-12)
        assert np.count_nonzero(c) <= 1  # one coefficient per row, on its last token
        assert not c[:-1].any()


@pytest.mark.parametrize("seed", range(3))
def test_rm_matches_slow_reference(seed):
    rows = random_rows(seed + 40, n=10, tasks=2)
    for row, score in zip(rows, np.random.default_rng(seed).standard_normal(len(rows))):
        row["score"] = float(score)
    pairs = pair_rows(Batch.from_rows(rows), 1.0, "rm")
    assert pairs.chosen.size > 0
    want = reference.rm(rows, pairs.chosen.tolist(), pairs.rejected.tolist())
    for got, exp in zip(RM().update(rows).coefficients, want):
        np.testing.assert_allclose(got, exp, rtol=1e-12, atol=0)


@pytest.mark.slow  # imports transformers (~10 s on a busy machine)
def test_rm_coefficient_sits_where_a_transformers_classification_head_reads():
    """A tiny GPT-2 sequence classifier on right-padded rows that end on environment tokens: the pooled
    score is the head at the one position where c is non-zero (the last non-pad token), and the
    gradient of -sum c r with respect to the hidden states lands on that position only."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=2, num_labels=1,
                                     pad_token_id=0)
    model = transformers.GPT2ForSequenceClassification(config).double().eval()
    rows = [{"reward": 1.0, "logprobs": [-0.1, -0.2, -0.3, -0.4], "action_mask": [True, True, False, False],
             "task_id": "a", "score": 0.3},
            {"reward": 0.0, "logprobs": [-0.5, -0.4], "action_mask": [True, False], "task_id": "a", "score": 0.5}]
    update = RM().update(rows)
    ids = torch.tensor([[4, 5, 6, 7, 8], [9, 10, 11, 0, 0]])  # a prompt token, the row's tokens, padding
    attention = (ids != 0).long()
    hidden = model.transformer(ids, attention_mask=attention).last_hidden_state
    hidden.retain_grad()
    pooled = model(ids, attention_mask=attention).logits[:, 0]
    per_position = model.score(hidden)[..., 0]  # (rows, positions)
    for b, c in enumerate(update.coefficients):
        (where,) = np.flatnonzero(c)
        assert pooled[b].item() == pytest.approx(per_position[b, 1 + where].item(), abs=1e-12)
    weights = torch.zeros(2, 5, dtype=torch.float64)
    for b, c in enumerate(update.coefficients):
        weights[b, 1:1 + len(c)] = torch.tensor(c)
    (-(weights * per_position).sum()).backward()
    touched = hidden.grad.abs().sum(-1) > 0
    assert touched.tolist() == [[False, False, False, False, True], [False, False, True, False, False]]


def test_rm_refuses_rows_without_a_score():
    rows = [{"reward": 1.0, "logprobs": [-0.1], "task_id": "a", "score": 0.1},
            {"reward": 0.0, "logprobs": [-0.1], "task_id": "a"}]
    with pytest.raises(wai.BatchError, match=r"row 1: field 'score' is missing \(1 of 2 rows lack it\); rm needs the reward head's"):
        RM().update(rows)
