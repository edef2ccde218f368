"""Tool environments in the loop: the environment's tokens carry no gradient, the critic methods' GAE skips
them, ``wai train`` runs episodes for every kind of method, and the built-in tool task is learnable."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import whileai as wai
from whileai.engine import TrainingEngine
from whileai.engine.datums import make_datum
from whileai.envs import load_taskset, reference_episode, render_prompt

DOCS = Path(__file__).resolve().parents[2] / "docs" / "environments.md"


def reference_rows(engine: TrainingEngine, count: int = 6) -> list[dict]:
    """Rows of builtin:lookup's reference episodes (tool call, the store's answer, the answer), rewards that
    differ, on-policy log-probabilities of -1 (the gradient test reads only c and the tokens)."""
    tasks = load_taskset("builtin:lookup", test_size=4, train_size=count)
    rows = []
    for i, task in enumerate(tasks.split("train")):
        tokens, mask = reference_episode(tasks, task, engine.tokenizer)
        rows.append({"reward": float(i % 2), "prompt_tokens": render_prompt(engine.tokenizer, task),
                     "tokens": tokens, "action_mask": mask, "logprobs": [-1.0] * len(tokens),
                     "behavior_logprobs": [-1.0] * len(tokens)})
    return rows


def parameter_gradient(engine: TrainingEngine, data: list[dict], coefficients: list, custom: bool
                       ) -> dict[str, torch.Tensor]:
    """The parameter gradient of -sum c log pi as a copy: through the kernel (weights = c), or as the loop's
    single pass does it (every completion token scored, c applied in a custom loss). Gradients are cleared
    before and after."""
    engine.zero_grad()
    if custom:
        def loss_fn(batch, logprobs):
            return sum(-(torch.as_tensor(c, dtype=lp.dtype) * lp).sum() for c, lp in zip(coefficients, logprobs)), {}

        engine.forward_backward_custom(data, loss_fn)
    else:
        weighted = [{"model_input": d["model_input"], "loss_fn_inputs": {
            **d["loss_fn_inputs"], "weights": [0.0] * (len(d["model_input"]) - len(c)) + list(c)}}
            for d, c in zip(data, coefficients)]
        engine.forward_backward(weighted, "cross_entropy")
    grads = {n: p.grad.detach().clone() for n, p in engine.named_params.items() if p.grad is not None}
    engine.zero_grad()
    return grads


@pytest.mark.parametrize("custom", [False, True])
def test_tool_tokens_get_c_zero_and_exactly_zero_parameter_gradient(custom):
    """FlashReinforce's c is 0 on every environment token; replacing the environment tokens' *targets* (what
    the loss would push up there) by other tokens leaves every parameter's gradient bit-for-bit the same,
    while the same change on one action token does change it (so the comparison can fail)."""
    torch.manual_seed(0)
    engine = TrainingEngine("builtin:tiny", seed=0)
    rows = reference_rows(engine)
    assert all("action_mask" in r and not all(r["action_mask"]) for r in rows)
    update = wai.FlashReinforce().update([{k: r[k] for k in ("reward", "logprobs", "behavior_logprobs",
                                                             "action_mask")} for r in rows])
    for row, c in zip(rows, update.coefficients):
        assert np.all(c[~np.asarray(row["action_mask"])] == 0.0)
    data = [make_datum(r["prompt_tokens"], r["tokens"]) for r in rows]
    base = parameter_gradient(engine, data, update.coefficients, custom)
    assert any(bool(g.abs().sum() > 0) for g in base.values())

    def with_targets_changed(env: bool) -> list[dict]:
        out = []
        for row, datum in zip(rows, data):
            targets = list(datum["loss_fn_inputs"]["target_tokens"])
            start = len(row["prompt_tokens"]) - 1  # position of the first completion target
            mask = np.asarray(row["action_mask"])
            where = np.flatnonzero(~mask if env else mask)[:None if env else 1]
            for k in where:
                targets[start + k] = 3 + (targets[start + k] * 7 + 11) % 256  # another byte token
            out.append({"model_input": datum["model_input"],
                        "loss_fn_inputs": {**datum["loss_fn_inputs"], "target_tokens": targets}})
        return out

    changed = parameter_gradient(engine, with_targets_changed(env=True), update.coefficients, custom)
    assert base.keys() == changed.keys()
    for name in base:
        assert torch.equal(base[name], changed[name]), name
    control = parameter_gradient(engine, with_targets_changed(env=False), update.coefficients, custom)
    assert any(not torch.equal(base[n], control[n]) for n in base)


def test_gae_skips_environment_tokens_by_hand():
    """Actions at tokens 0 and 2, the environment at token 1; values 0.2, 0.9 (env), 0.5; R = 1.

    SAO (gae_alpha 1.5): L = 2, lambda = 1 - 1/(1.5 * 2) = 2/3. delta_1 = R - V_2 = 0.5, A_1 = 0.5;
    delta_0 = V_2 - V_0 = 0.3 (the bootstrap skips the env token's 0.9), A_0 = 0.3 + 2/3 * 0.5 = 0.6333.
    BPCO (gae_alpha 0.4): lambda = max(0, 1 - 1/0.8) = 0: A_0 = 0.3, A_1 = 0.5. The env token: A = 0, c = 0."""
    row = {"reward": 1.0, "logprobs": [-0.3, -1.0, -0.2], "action_mask": [True, False, True],
           "values": [0.2, 0.9, 0.5]}
    sao = wai.SAO().update([row])
    np.testing.assert_allclose(sao.advantages[0], [0.3 + 0.5 * 2 / 3, 0.0, 0.5])
    np.testing.assert_allclose(sao.coefficients[0], [(0.3 + 0.5 * 2 / 3) / 2, 0.0, 0.5 / 2])
    bpco = wai.BPCO().update([row])
    np.testing.assert_allclose(bpco.advantages[0], [0.3, 0.0, 0.5])
    np.testing.assert_allclose(bpco.value_targets[0], [1.0, 1.0, 1.0])


def test_bpco_does_not_check_the_value_at_an_environment_token():
    """A value outside reward_range is refused on a model token and not read on an environment token."""
    row = {"reward": 1.0, "logprobs": [-0.3, -1.0, -0.2], "action_mask": [True, False, True], "values": [0.2, 0.9, 0.5]}
    same = wai.BPCO().update([{**row, "values": [0.2, 7.0, 0.5]}])
    np.testing.assert_array_equal(same.coefficients[0], wai.BPCO().update([row]).coefficients[0])
    with pytest.raises(wai.BatchError, match="row 0: field 'values' is 7 at token 2, outside BPCO's reward_range"):
        wai.BPCO().update([{**row, "values": [0.2, 0.9, 7.0]}])


@pytest.mark.parametrize("method", [wai.SAO(), wai.BPCO()])
@pytest.mark.parametrize("seed", range(5))
def test_gae_never_reads_the_value_at_an_environment_token(method, seed):
    """Random ragged batches: any values at environment tokens (inside BPCO's bounded range) leave every
    advantage, coefficient, value target and statistic unchanged."""
    from tests.methods._kit import random_rows  # noqa: PLC0415

    rows = random_rows(seed, 10, values=True)
    rng = np.random.default_rng(seed + 50)
    other = []
    for row in rows:
        mask = np.asarray(row["action_mask"])
        values = np.asarray(row["values"])
        values[~mask] = rng.random(int((~mask).sum()))
        other.append({**row, "values": values.tolist()})
    assert any(not all(r["action_mask"]) for r in rows)
    a, b = method.update(rows), method.update(other)
    for x, y in zip(a.advantages + a.coefficients + a.value_targets, b.advantages + b.coefficients + b.value_targets):
        np.testing.assert_array_equal(x, y)
    assert a.stats == b.stats


def test_the_loops_drift_statistic_skips_environment_tokens():
    """k3 = exp(x) - 1 - x of x = log pi - log mu on the model's tokens only: x = 0 and 0.2 give
    (0 + 0.0214028) / 2; the env token (x = -2 against its 0.0) would add 1.1353 if it were read."""
    from whileai.loop.step import _drift

    row = {"logprobs": [-1.0, -2.0, -0.5], "behavior_logprobs": [-1.0, 0.0, -0.7], "action_mask": [True, False, True]}
    assert _drift([row]) == pytest.approx((np.exp(0.2) - 1.2) / 2, rel=1e-12)


@pytest.mark.parametrize(("method", "settings"), [
    ("flash_reinforce", {"lag": 1}),
])
def test_wai_train_samples_episodes_and_evaluates_them(method, settings, tmp_path):
    """Two steps on builtin:lookup: the batch in flight (the checkpoint's queue) holds episodes whose
    environment tokens are masked, and held-out pass@1 was measured on episodes before and after."""
    run = wai.train(method=method, model="builtin:tiny", taskset="builtin:lookup", steps=2, rollouts_per_step=8,
                    warm_start_steps=30, warm_start_learning_rate=1e-2, eval_tasks=8, eval_samples=1,
                    taskset_options={"test_size": 16, "train_size": 64}, run_dir=str(tmp_path / "run"),
                    progress=False, export=False, force=True, **settings)  # 30 warm-start steps pass no probe
    assert [m["step"] for m in run.metrics()] == [1, 2]
    assert run.summary["eval_before"]["tasks"] == 8 and "compare" in run.summary
    queue = [row for batch in _queue(run.dir) for row in batch]
    assert queue, "lag 1 keeps one batch in flight"
    masked = [r for r in queue if "action_mask" in r]
    assert masked, "after a warm start on reference episodes some episodes call the tool"
    for row in masked:
        mask = np.asarray(row["action_mask"])
        assert len(mask) == len(row["tokens"]) == len(row["behavior_logprobs"])
        assert np.all(np.asarray(row["behavior_logprobs"])[~mask] == 0.0)


def _queue(run_dir: Path) -> list:
    import json

    (path,) = (run_dir / "checkpoint").glob("loop-*.json")
    return json.loads(path.read_text())["queue"]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "settings", "critic"), [
    ("grpo", {"lag": 1, "knobs": {"rollouts_per_prompt": 4}}, False),
    ("sao", {"lag": 2, "knobs": {"critic_warmup": 1}}, True),
    ("bpco", {"lag": 2, "knobs": {"critic_warmup": 1}}, True),
    ("rae", {"lag": 3}, False),
])
def test_every_kind_of_method_trains_on_episodes(method, settings, critic, tmp_path):
    """A group method, the two critic methods and a running baseline, each at a lag: three steps on episodes,
    finite statistics, the critic trained where there is one, and the rows in flight masked as played."""
    run = wai.train(method=method, model="builtin:tiny", taskset="builtin:lookup", steps=3, rollouts_per_step=8,
                    warm_start_steps=60, warm_start_learning_rate=1e-2, eval_tasks=4, eval_samples=1,
                    taskset_options={"test_size": 16, "train_size": 64}, run_dir=str(tmp_path / "run"),
                    progress=False, export=False, **settings)
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(np.isfinite(m["reward"]) and np.isfinite(m["drift"]) and np.isfinite(m["grad_norm"]) for m in metrics)
    assert all(np.isfinite(m["critic_loss"]) for m in metrics) if critic else "critic_loss" not in metrics[0]
    queue = [row for batch in _queue(run.dir) for row in batch]
    assert len(queue) == 8 * settings["lag"]
    for row in queue:
        mask = np.asarray(row.get("action_mask", [True] * len(row["tokens"])))
        assert len(mask) == len(row["tokens"]) == len(row["behavior_logprobs"]) <= 48
        assert np.all(np.asarray(row["behavior_logprobs"])[~mask] == 0.0)


# ------------------------------------------------------------------------------------- the docs' example
@pytest.mark.slow
def test_the_user_environment_in_the_docs_trains(tmp_path, monkeypatch):
    """docs/environments.md's example, run as written (its run_dir moved under tmp_path)."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    example = next(b for b in blocks if "class " in b and "wai.train" in b)
    assert len(example.splitlines()) < 60
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(example, str(DOCS), "exec"), namespace)
    run = namespace["run"]
    assert len(run.metrics()) == run.config.steps
    assert "compare" in run.summary


# ------------------------------------------------------------------------------------- learnable
def _held_out(path: Path, seed: int) -> list[dict]:
    import json

    return [{"task_id": r["task_id"], "reward": r["reward"], "seed": str(seed)}
            for r in map(json.loads, path.read_text().splitlines())]


@pytest.mark.slow
def test_rl_with_the_defaults_raises_held_out_pass_rate_on_the_tool_task(tmp_path):
    """docs/environments.md, "Learning to use the tool": `wai train --taskset builtin:lookup` with nothing else set
    (the taskset's recommended settings) on seeds 0, 1, 2. Each seed's paired interval excludes zero, and so does
    the one pooled over seeds x held-out tasks: compare on the three runs' held-out rows, each marked with its
    seed, pairs each task's before and after pass rates over all three seeds (measured +0.191 [+0.147, +0.236])."""
    before, after, deltas = [], [], []
    for seed in (0, 1, 2):
        began = time.perf_counter()
        run = wai.train(taskset="builtin:lookup", seed=seed, run_dir=str(tmp_path / f"seed{seed}"), progress=False,
                        export=False)
        compare = run.summary["compare"]
        print(f"seed {seed}: {compare['text']} in {time.perf_counter() - began:.0f} s")
        assert run.summary["resolved"] == {"steps": 60, "warm_start_steps": 200, "warm_start_learning_rate": 3e-3,
                                           "learning_rate": 1e-3, "lag": 2, "max_tokens": 48, "temperature": 1.0}
        assert compare["delta"] > 0 and compare["excludes_zero"], compare
        before += _held_out(run.dir / "heldout-before.jsonl", seed)
        after += _held_out(run.dir / "heldout.jsonl", seed)
        deltas.append(compare["delta"])
    pooled = wai.compare(before, after, threshold=1.0, baseline_name="before", treatment_name="after")
    print(pooled)
    assert pooled.n_tasks == 64 and pooled.delta == pytest.approx(np.mean(deltas))  # the same 64 keys every seed
    assert pooled.ci95[0] > 0.1, pooled
