"""Serve -> record -> score -> export -> train -> serve -> record, with every part real: `wai policy` and
`wai record` in their own processes, the official `openai` client sending the asks, a program scoring them
through the reward endpoint, `wai train --rows` (FlashReinforce) on the export."""

from __future__ import annotations

import json

import openai
import pytest

import whileai as wai
from whileai.envs import load_taskset, render_prompt
from whileai.loop.types import PASS
from whileai.record.export import export
from whileai.record.launch import Started
from whileai.record.rewards import score

pytestmark = pytest.mark.slow
TRAIN_ASKS, TEST_ASKS, SAMPLES = 512, 64, 4


def ask(recorder, model, prompt, seed, n=1):
    raw = openai.OpenAI(base_url=recorder.url + "/v1", api_key=recorder.token, max_retries=0).completions.with_raw_response
    answer = raw.create(model=model, prompt=prompt, max_tokens=4, n=n, seed=seed)
    return json.loads(answer.headers["x-whileai-trace-ids"]), [c.text for c in answer.parse().choices]


def held_out(recorder, model, taskset, tokenizer):
    rows = []
    for k, task in enumerate(taskset.split("test")[:TEST_ASKS]):
        _, texts = ask(recorder, model, render_prompt(tokenizer, task), 10_000 + k, n=SAMPLES)
        rows += [{"task_id": task.task_id, "reward": taskset.grade(task, text)} for text in texts]
    return rows


def test_recorded_traffic_scored_late_trains_a_model_whose_served_pass_rate_rises(tmp_path):
    taskset = load_taskset("builtin:case")
    warm = wai.train(method="flash_reinforce", taskset="builtin:case", steps=1, warm_start_steps=14, eval_tasks=0,
                     rollouts_per_step=8, progress=False, run_dir=str(tmp_path / "warm"))
    from whileai.engine.models import byte_tokenizer

    tokenizer = byte_tokenizer()
    data = tmp_path / "data"
    with Started(["policy", str(warm.weights), "--threads", "1"], tmp_path) as policy, \
            Started(["record", "--upstream", policy.url, "--data-dir", str(data)], tmp_path) as recorder:
        model = str(warm.weights)
        for k, task in enumerate(taskset.split("train")[:TRAIN_ASKS]):
            (trace_id,), (text,) = ask(recorder, model, render_prompt(tokenizer, task), k)
            score(recorder.url, trace_id, taskset.grade(task, text))  # the late score, from a program
        before = held_out(recorder, model, taskset, tokenizer)
    report = export(data, tmp_path / "traces.jsonl", model=model)
    assert report.written == TRAIN_ASKS and not report.refused, str(report)
    run = wai.train(rows=str(tmp_path / "traces.jsonl"), method="flash_reinforce", model=model, steps=16,
                    rollouts_per_step=32, learning_rate=1e-2, progress=False, run_dir=str(tmp_path / "rl"))
    with Started(["policy", str(run.dir), "--threads", "1"], tmp_path) as policy, \
            Started(["record", "--upstream", policy.url, "--data-dir", str(data)], tmp_path) as recorder:
        after = held_out(recorder, str(run.weights), taskset, tokenizer)
    result = wai.compare(before, after, threshold=PASS, baseline_name="served before", treatment_name="after")
    print(result)
    (tmp_path / "result.json").write_text(json.dumps({"before": result.baseline, "after": result.treatment}))
    assert result.delta > 0.05 and result.ci95[0] > 0, result
