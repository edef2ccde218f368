"""OPD and OPSD: both coefficient forms against autograd of the divergence they claim to descend."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import whileai as wai
from whileai.endpoints import Endpoint
from whileai.methods.distill import OPD, OPSD, keep_top, parse_anchor, sampled_coefficients
from whileai.simulations import reference

from ._kit import random_rows

DIVERGENCES = ["reverse_kl", "forward_kl", "jsd"]


def torch_divergence(name, student_lp, teacher_lp, tail=False):
    """D over the given categories; with ``tail`` one more category holds the mass outside them."""
    if tail:
        student_lp = torch.cat([student_lp, torch.log1p(-student_lp.exp().sum()).reshape(1)])
        teacher_lp = torch.cat([teacher_lp, torch.log1p(-teacher_lp.exp().sum()).reshape(1)])
    p, q = student_lp.exp(), teacher_lp.exp()
    if name == "reverse_kl":
        return (p * (student_lp - teacher_lp)).sum()
    if name == "forward_kl":
        return (q * (teacher_lp - student_lp)).sum()
    log_m = torch.logaddexp(student_lp, teacher_lp) - math.log(2.0)
    return 0.5 * ((q * (teacher_lp - log_m)).sum() + (p * (student_lp - log_m)).sum())


# --------------------------------------------------------------------- sampled-token form
def test_sampled_hand_worked():
    """pi = (0.2, 0.5), pi_T = (0.4, 0.5), the second token is tool output.

    reverse_kl: c = log 0.4 - log 0.2 = log 2 = 0.6931472; forward_kl: c = 0.4/0.2 = 2;
    jsd: m = (0.2 + 0.4)/2 = 0.3, c = 0.5 log(0.3/0.2) = 0.2027326. The tool token gets 0 in each.
    """
    row = {"reward": 0.0, "logprobs": [math.log(0.2), math.log(0.5)],
           "teacher_logprobs": [math.log(0.4), math.log(0.5)], "action_mask": [True, False]}
    for divergence, want in [("reverse_kl", 0.6931472), ("forward_kl", 2.0), ("jsd", 0.2027326)]:
        update = OPD(divergence=divergence).update([row])
        np.testing.assert_allclose(update.coefficients[0], [want, 0.0], rtol=1e-6)
    assert OPD().update([row]).stats["mean_teacher_gap"] == pytest.approx(math.log(2))


@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("seed", range(3))
def test_sampled_form_is_an_unbiased_estimate_of_the_divergence_gradient(divergence, seed):
    """sum_v p_v c(v) (onehot(v) - p) = -d D / d logits, exactly, over a 6-token vocabulary."""
    rng = np.random.default_rng(seed)
    logits = torch.tensor(rng.standard_normal(6), dtype=torch.float64, requires_grad=True)
    teacher = torch.log_softmax(torch.tensor(rng.standard_normal(6), dtype=torch.float64), 0)
    student = torch.log_softmax(logits, 0)
    torch_divergence(divergence, student, teacher).backward()
    p = student.exp().detach().numpy()
    c = sampled_coefficients(divergence, student.detach().numpy(), teacher.numpy())
    expected_step = sum(p[v] * c[v] * (np.eye(6)[v] - p) for v in range(6))
    np.testing.assert_allclose(expected_step, -logits.grad.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_sampled_matches_slow_reference(seed):
    rows = random_rows(seed, n=8, teacher=True)
    update = OPD().update(rows)
    for got, want in zip(update.coefficients, reference.opd(rows)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_sampled_form_needs_teacher_logprobs():
    with pytest.raises(wai.BatchError, match=r"row 0: field 'teacher_logprobs' is missing.*opd needs it"):
        OPD().update([{"reward": 0.0, "logprobs": [-0.1]}])


# --------------------------------------------------------------------- top-k form
def topk_row(rng, length, vocab, k, mask=None):
    student = np.log(rng.dirichlet(np.ones(vocab), size=length))
    teacher = np.log(rng.dirichlet(np.ones(vocab), size=length))
    slots = np.argsort(-teacher, axis=1)[:, :k]
    return {"reward": 0.0, "logprobs": np.take_along_axis(student, slots[:, :1], 1)[:, 0].tolist(),
            "action_mask": mask if mask is not None else [True] * length,
            "teacher_topk_tokens": slots.tolist(),
            "teacher_topk_logprobs": np.take_along_axis(teacher, slots, 1).tolist(),
            "topk_logprobs": np.take_along_axis(student, slots, 1).tolist()}, student, teacher


@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("seed", range(3))
def test_topk_slots_are_minus_the_gradient_wrt_slot_logprobs(divergence, seed):
    """K = 3 slots of a 9-token vocabulary: the loss is D over the 3 slots plus the tail category."""
    rng = np.random.default_rng(seed)
    row, _, _ = topk_row(rng, length=4, vocab=9, k=3, mask=[True, False, True, True])
    update = OPD(divergence=divergence).update([row])
    student = torch.tensor(row["topk_logprobs"], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor(row["action_mask"], dtype=torch.float64)
    teacher = torch.tensor(row["teacher_topk_logprobs"], dtype=torch.float64)
    loss = sum(mask[t] * torch_divergence(divergence, student[t], teacher[t], tail=True) for t in range(4))
    loss.backward()
    assert update.coefficients[0].shape == (4, 3)
    np.testing.assert_allclose(update.coefficients[0], -student.grad.numpy(), rtol=1e-10, atol=1e-14)
    assert np.all(update.coefficients[0][1] == 0.0)  # the tool token


@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("seed", range(3))
def test_topk_matches_slow_reference(divergence, seed):
    rng = np.random.default_rng(seed + 50)
    rows = [topk_row(rng, length=int(rng.integers(1, 6)), vocab=7, k=3,
                     mask=None)[0] for _ in range(4)]
    rows[1]["action_mask"] = [i % 2 == 0 for i in range(len(rows[1]["logprobs"]))]
    update = OPD(divergence=divergence).update(rows)
    for got, want in zip(update.coefficients, reference.opd_topk(rows, divergence)):
        np.testing.assert_allclose(got, np.array(want).reshape(got.shape), rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_topk_over_the_whole_vocabulary_is_the_exact_logit_gradient(divergence):
    """With K = V, sum_k c_k (onehot(v_k) - p) is -dD/dlogits: the kernel's step is the true gradient."""
    rng = np.random.default_rng(5)
    logits = torch.tensor(rng.standard_normal(5), dtype=torch.float64, requires_grad=True)
    student = torch.log_softmax(logits, 0)
    teacher = torch.log_softmax(torch.tensor(rng.standard_normal(5), dtype=torch.float64), 0)
    torch_divergence(divergence, student, teacher).backward()
    slots = np.arange(5)
    row = {"reward": 0.0, "logprobs": [float(student[0].detach())], "teacher_topk_tokens": [slots.tolist()],
           "teacher_topk_logprobs": [teacher.numpy().tolist()], "topk_logprobs": [student.detach().numpy().tolist()]}
    c = OPD(divergence=divergence).update([row]).coefficients[0][0]
    p = student.exp().detach().numpy()
    step = sum(c[k] * (np.eye(5)[k] - p) for k in range(5))
    np.testing.assert_allclose(step, -logits.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_topk_keeps_only_the_top_k_teacher_slots():
    """K = 4 slots, top_k = 2: the two slots with the highest teacher log-probability keep c."""
    teacher = np.log(np.array([[0.1, 0.4, 0.3, 0.2]]))
    assert keep_top(teacher, 2).tolist() == [[False, True, True, False]]
    row = {"reward": 0.0, "logprobs": [-1.0], "teacher_topk_tokens": [[0, 1, 2, 3]],
           "teacher_topk_logprobs": teacher.tolist(), "topk_logprobs": np.log([[0.25] * 4]).tolist()}
    c = OPD(top_k=2).update([row]).coefficients[0][0]
    assert c[0] == 0.0 and c[3] == 0.0 and c[1] != 0.0 and c[2] != 0.0
    # kept slots 1, 2: student mass 0.5, teacher 0.7, so tails p_tail = 0.5, q_tail = 0.3;
    # reverse_kl c_1 = p (t - l + log p_tail - log q_tail) = 0.25 (0.4700036 + 0.5108256) = 0.2452073
    assert c[1] == pytest.approx(0.2452073, rel=1e-6)


def test_top_k_sum_without_the_tail_would_settle_at_a_third_of_the_teacher():
    """Why the tail category: minimising sum_v p log(p/q) alone over p gives p = q/e on every slot.

    For one slot with q = 0.5, d/dp [p log(p/q)] = log(p/q) + 1 = 0 at p = q/e = 0.1839397, while the
    (k+1)-category loss has zero slope at p = q (c_v = 0 there).
    """
    q = 0.5
    assert math.log((q / math.e) / q) + 1.0 == pytest.approx(0.0)
    row = {"reward": 0.0, "logprobs": [math.log(0.5)], "teacher_topk_tokens": [[0]],
           "teacher_topk_logprobs": [[math.log(q)]], "topk_logprobs": [[math.log(0.5)]]}
    assert OPD().update([row]).coefficients[0][0, 0] == pytest.approx(0.0, abs=1e-15)


def test_topk_errors_name_row_and_field():
    rng = np.random.default_rng(0)
    row, _, _ = topk_row(rng, 2, 5, 3)
    missing = {k: v for k, v in row.items() if k != "topk_logprobs"}
    with pytest.raises(wai.BatchError, match=r"row 0: field 'topk_logprobs' is missing"):
        OPD().update([missing])
    with pytest.raises(wai.BatchError, match=r"row 0: the top-k fields disagree on K .*'topk_logprobs' K=2"):
        OPD().update([{**row, "topk_logprobs": [[-0.1, -0.2], [-0.1, -0.2]]}])
    with pytest.raises(wai.BatchError, match=r"row 0: field 'topk_logprobs' has shape \(1, 3\); it must be \(2, K\)"):
        OPD().update([{**row, "topk_logprobs": [[-0.1, -0.2, -0.3]]}])
    with pytest.raises(wai.BatchError, match="row 0: field 'teacher_topk_logprobs' is 0.5 at token 0, slot 0, above 0"):
        OPD().update([{**row, "teacher_topk_logprobs": [[0.5, -1, -1], [-1, -1, -1]]}])
    with pytest.raises(wai.BatchError, match="row 0: field 'topk_logprobs' is nan at token 1, slot 2"):
        OPD().update([{**row, "topk_logprobs": [[-1, -1, -1], [-1, -1, float("nan")]]}])
    with pytest.raises(wai.BatchError, match="row 0: field 'teacher_topk_tokens' must hold token ids"):
        OPD().update([{**row, "teacher_topk_tokens": [[0, 1, 2.5], [0, 1, 2]]}])
    # the contract, not the method, refuses a batch mixing rows with and without top-k, or different K
    plain = {k: v for k, v in row.items() if "topk" not in k}
    with pytest.raises(wai.BatchError, match="row 1: field 'teacher_topk_tokens' is missing but other rows carry it"):
        wai.Batch.from_rows([row, plain])
    wider, _, _ = topk_row(rng, 2, 5, 4)
    with pytest.raises(wai.BatchError, match="row 1: field 'teacher_topk_tokens' has K=4 slots per token but row 0 "
                                             "has K=3"):
        wai.Batch.from_rows([row, wider])


# --------------------------------------------------------------------- a stale sampler
def test_stale_sampler_hand_worked():
    """pi = (0.2, 0.6, 0.5), mu = (0.4, 0.2, 0.5), pi_T = (0.4, 0.3, 0.25): rho = 0.5, 3, 1.

    reverse_kl c = min(rho, 2) (t - l): 0.5 log 2 = 0.3465736, 2 log 0.5 = -1.3862944 (the cap binds),
    log 0.5 = -0.6931472. max_ratio=None: the second token gets 3 log 0.5 = -2.0794415.
    """
    row = {"reward": 0.0, "logprobs": np.log([0.2, 0.6, 0.5]).tolist(),
           "behavior_logprobs": np.log([0.4, 0.2, 0.5]).tolist(), "teacher_logprobs": np.log([0.4, 0.3, 0.25]).tolist()}
    update = OPD().update([row])
    np.testing.assert_allclose(update.coefficients[0], [0.3465736, -1.3862944, -0.6931472], rtol=1e-6)
    assert update.stats["capped_token_share"] == pytest.approx(1 / 3)
    assert any("1 action token in 1 trajectory (0) had a ratio above max_ratio=2 (largest 3)" in n
               for n in update.notes)
    np.testing.assert_allclose(OPD(max_ratio=None).update([row]).coefficients[0],
                               [0.3465736, -2.0794415, -0.6931472], rtol=1e-6)
    np.testing.assert_allclose(OPSD(max_ratio=4.0).update([row]).coefficients[0],
                               [0.3465736, -2.0794415, -0.6931472], rtol=1e-6)


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_at_lag_zero_nothing_changes(divergence):
    """No behavior_logprobs, or behavior_logprobs equal to logprobs: c is the on-policy rule, bit for bit."""
    rows = random_rows(3, n=6, teacher=True)
    plain = [{k: v for k, v in row.items() if k != "behavior_logprobs"} for row in rows]
    same = [{**row, "behavior_logprobs": row["logprobs"]} for row in plain]
    for method in (OPD(divergence=divergence), OPSD(divergence=divergence, max_ratio=None)):
        on_policy = method.update(plain)
        for row, c in zip(plain, on_policy.coefficients):
            mask = np.asarray(row["action_mask"])
            want = np.where(mask, sampled_coefficients(divergence, np.asarray(row["logprobs"]),
                                                       np.asarray(row["teacher_logprobs"])), 0.0)
            np.testing.assert_array_equal(c, want)
        np.testing.assert_array_equal(method.update(same).coefficients_flat, on_policy.coefficients_flat)
        assert not any("max_ratio" in n for n in method.update(same).notes)
    rng = np.random.default_rng(4)
    topk = topk_row(rng, length=3, vocab=6, k=3)[0]
    np.testing.assert_array_equal(OPD().update([{**topk, "behavior_logprobs": topk["logprobs"]}]).coefficients[0],
                                  OPD().update([topk]).coefficients[0])


@pytest.mark.parametrize("seed", range(3))
def test_at_lag_above_zero_c_is_trls_self_distillation_gradient(seed):
    """TRL's sampled-token self-distillation loss (trl/experimental/self_distillation), written as TRL writes
    it: per_token_loss = sg(l - t) * l, times sg(min(exp(clamp(l - old, -20, 20)), is_clip = 2)), summed
    over action tokens. c must be minus its gradient with respect to l."""
    rows = random_rows(seed, n=8, teacher=True, drift=0.8)
    update = OPD().update(rows)
    batch = wai.Batch.from_rows(rows)
    logp = torch.tensor(batch.logprobs_N, requires_grad=True)
    teacher = torch.tensor(batch.token_fields["teacher_logprobs"])
    old = torch.tensor(batch.behavior_logprobs_N)
    per_token_loss = (logp - teacher).detach() * logp
    ratio = torch.exp(torch.clamp((logp - old).detach(), min=-20.0, max=20.0)).clamp(max=2.0)
    (per_token_loss * ratio * torch.tensor(batch.action_weight_N)).sum().backward()
    np.testing.assert_allclose(update.coefficients_flat, -logp.grad.numpy(), rtol=1e-12, atol=1e-15)
    assert 0 < update.stats["capped_token_share"] < 1  # the cap binds on some tokens, not all


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_topk_form_at_lag_above_zero_weights_each_position(divergence):
    """The top-k loss sum_t sg(min(rho_t, 2)) D_t (TRL applies the same per-token weight to its top-k loss):
    c is minus its gradient with respect to the slot log-probabilities."""
    rng = np.random.default_rng(8)
    row, _, _ = topk_row(rng, length=4, vocab=9, k=3, mask=[True, False, True, True])
    rho = np.array([0.5, 1.7, 3.0, 1.0])
    row["behavior_logprobs"] = (np.asarray(row["logprobs"]) - np.log(rho)).tolist()
    update = OPD(divergence=divergence).update([row])
    student = torch.tensor(row["topk_logprobs"], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor(row["teacher_topk_logprobs"], dtype=torch.float64)
    weight = np.minimum(rho, 2.0) * np.asarray(row["action_mask"])
    loss = sum(weight[t] * torch_divergence(divergence, student[t], teacher[t], tail=True) for t in range(4))
    loss.backward()
    np.testing.assert_allclose(update.coefficients[0], -student.grad.numpy(), rtol=1e-10, atol=1e-14)
    for got, want in zip(update.coefficients, reference.opd_topk([row], divergence)):
        np.testing.assert_allclose(got, np.array(want).reshape(got.shape), rtol=1e-10, atol=1e-15)


def test_max_ratio_below_one_is_refused():
    with pytest.raises(wai.ConfigError, match=r"OPD.max_ratio=0.5 is invalid: it must be None \(uncapped; null from the shell\) or a "
                                              r"finite number in \[1.0, inf\)"):
        OPD(max_ratio=0.5)


# --------------------------------------------------------------------- configs
def test_endpoint_validation():
    assert Endpoint("http://127.0.0.1:8000/v1", model="teacher").model == "teacher"
    assert wai.Endpoint is Endpoint and Endpoint.__module__ == "whileai.endpoints"
    with pytest.raises(wai.ConfigError, match=r"Endpoint.base_url='localhost:8000' is invalid: it must be an http\(s\)"):
        Endpoint("localhost:8000")
    with pytest.raises(wai.ConfigError, match="vocab_size=0"):
        Endpoint("https://x.example/v1", vocab_size=0)
    with pytest.raises(wai.ConfigError, match="OPD.teacher='http://x' is invalid"):
        OPD(teacher="http://x")  # type: ignore[arg-type]


def test_reprs():
    assert repr(OPD()) == ("OPD(teacher=None, top_k=32, rollouts_per_prompt=4, divergence='reverse_kl', max_ratio=2.0, "
                           "temperature=1.0, max_tokens=8192, loss='cross_entropy', kl_coef=1.0)")
    assert repr(OPSD()) == ("OPSD(privileged='reference', anchor='ema:0.01', top_k=32, rollouts_per_prompt=1, "
                            "divergence='reverse_kl', max_ratio=2.0, temperature=1.0, max_tokens=8192, "
                            "loss='cross_entropy', kl_coef=1.0)")


@pytest.mark.parametrize("anchor, parsed", [("ema:0.01", ("ema", 0.01)), ("ema:1", ("ema", 1.0)),
                                            ("initial", ("initial", None)), ("live", ("live", None)),
                                            ("ema:0", None), ("ema:1.5", None), ("ema:x", None), ("frozen", None)])
def test_opsd_anchor(anchor, parsed):
    assert parse_anchor(anchor) == parsed
    if parsed is None:
        with pytest.raises(wai.ConfigError, match=f"OPSD.anchor='{anchor}' is invalid: it must be 'ema:<rate>'"):
            OPSD(anchor=anchor)
    else:
        assert OPSD(anchor=anchor).run_spec().teacher.weights == parsed[0]


def test_opsd_teacher_spec_and_update():
    spec = OPSD(privileged="feedback", anchor="ema:0.05").run_spec().teacher
    assert (spec.weights, spec.ema_rate, spec.privileged) == ("ema", 0.05, "feedback")
    assert "theta_bar <- (1 - 0.05) theta_bar + 0.05 theta" in spec.describe()
    assert "'feedback'" in spec.describe()
    assert "frozen" in OPSD(anchor="initial").run_spec().teacher.describe()
    rows = random_rows(1, n=4, teacher=True)
    np.testing.assert_array_equal(OPSD().update(rows).coefficients_flat, OPD().update(rows).coefficients_flat)
    with pytest.raises(wai.ConfigError, match="OPSD.privileged='oracle'"):
        OPSD(privileged="oracle")
