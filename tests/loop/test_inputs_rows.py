"""The wrong-model check on every --rows path (with --eval-taskset too), and a log only partly from this model
named with its admitted share (test_traces' real traces: sampled by a taught builtin:tiny, and the same tokens
with the random initialisation's log-probabilities, which the taught policy does not admit)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_traces import QUICK, _engine, _sampled_by, _taught, _write

import whileai as wai


def _logs() -> tuple[list[dict], list[dict], str]:
    taught, model = _taught()
    fresh = _sampled_by(taught, 48)
    other = _engine(0)
    stale = [dict(t, behavior_logprobs=other.compute_logprobs(t["prompt_tokens"] + t["tokens"])["logprobs"]
                  [len(t["prompt_tokens"]):]) for t in fresh]
    return fresh, stale, model


def _run(tmp_path: Path, name: str, rows: list[dict], model: str, **more):
    return wai.train(rows=str(_write(tmp_path / f"{name}.jsonl", rows)), method="flash_reinforce", taskset=None,
                     eval_taskset="builtin:case", eval_tasks=4, eval_samples=1, run_dir=str(tmp_path / name),
                     **{**QUICK, "model": model, **more})


def test_rows_with_an_eval_taskset_still_stop_on_logs_from_another_model(tmp_path: Path):
    fresh, stale, model = _logs()
    with pytest.raises(wai.ConfigError, match="admits only 2% of the logged traces at step 0.*--model the model the logs"):
        _run(tmp_path, "stopped", stale, model)
    assert _run(tmp_path, "fresh", fresh, model).summary["preflight"]["admitted_share"] == 1.0


def test_a_log_partly_from_older_weights_is_named_with_its_admitted_share(tmp_path: Path):
    fresh, stale, model = _logs()
    mixed = [fresh[i] if i % 2 else stale[i] for i in range(len(fresh))]
    run = _run(tmp_path, "mixed", mixed, model)
    share = run.summary["preflight"]["admitted_share"]
    assert 0.3 <= share <= 0.7
    assert any(n.startswith(f"the method admits only {share:.0%} of the logged traces at step 0")
               for n in run.summary["preflight"]["notes"])


@pytest.mark.slow
def test_rows_from_a_recorder_stop_on_traces_from_another_model(tmp_path: Path, wai_token: str):
    """--rows-from had no step-0 check: traces served by another model trained to the end, every one masked. Now
    the first batch is scored at step 0 and the run stops as a log from another model does."""
    from whileai.record.launch import Started
    from whileai.record.store import RecordStore

    other = {"endpoint": "completions", "model": "policy", "weights_version": "v1",
             "logprobs_mode": "processed_logprobs", "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0},
             "prompt_ids": [1, 5], "completion_ids": [6, 7], "logprobs": [-0.05, -0.02], "finish_reason": "stop",
             "conversation_key": None, "problem": None}  # near-certain tokens: not builtin:tiny's (about -5.5)
    with Started(["policy", "builtin:tiny", "--threads", "1"], tmp_path) as policy, \
            Started(["record", "--upstream", policy.url, "--data-dir", str(tmp_path / "data")], tmp_path) as recorder:
        store = RecordStore(tmp_path / "data")
        for i in range(16):
            store.add_exchange(f"x{i}", None, other)
            store.score(f"x{i}", float(i % 2), False)
        with pytest.raises(wai.ConfigError, match="dropped every logged trace at step 0.*--model the model the logs came from"):
            wai.train(rows_from=recorder.url, sampler_url=policy.url, method="flash_reinforce",
                      model="builtin:tiny", steps=2, rollouts_per_step=16, export=False, progress=False,
                      run_dir=str(tmp_path / "r"))
    assert not (tmp_path / "r" / "metrics.jsonl").exists()  # stopped before its first update
