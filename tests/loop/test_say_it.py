"""Said out loud from a log: a reward off the scale of the rest, held-out tasks the run also trains on, a vLLM
log without token ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import whileai as wai
from whileai.loop.sources.traces import load_vocab, reward_outliers, scan


def _traces(path: Path, rewards: list[float]) -> Path:
    lines = [{"prompt_tokens": [1, 100 + k % 20], "tokens": [101, 2], "behavior_logprobs": [-5.5, -5.6],
              "reward": r, "task_id": f"t{k % 10}"} for k, r in enumerate(rewards)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_reward_off_the_logs_scale_is_named_with_its_line(tmp_path: Path):
    rewards = [float(k % 2) for k in range(40)]
    rewards[4] = 7.0                                                     # line 5: a 7 among 0 and 1
    source = scan(_traces(tmp_path / "log.jsonl", rewards), load_vocab("builtin:tiny"), trace=True)
    note = reward_outliers(source)
    assert note is not None and note in source.notes
    assert note.startswith("1 trace with a reward outside the range the rest of the log spans (0 to 1): ")
    assert f"{tmp_path / 'log.jsonl'}, line 5 (reward 7)" in note and "Fix" in note


def test_rewards_on_one_scale_raise_nothing(tmp_path: Path):
    graded = [float(k % 11) for k in range(44)]                          # a 0-10 grader: no outlier
    partial = [k / 39 for k in range(40)]                                # partial credit in [0, 1]
    for name, rewards in (("graded", graded), ("partial", partial), ("ones", [1.0] * 30 + [0.0])):
        source = scan(_traces(tmp_path / f"{name}.jsonl", rewards), load_vocab("builtin:tiny"), trace=True)
        assert reward_outliers(source) is None, name


def test_a_method_with_a_reward_range_refuses_a_reward_outside_it_before_training(tmp_path: Path):
    rewards = [float(k % 2) for k in range(40)]
    rewards[4] = 7.0
    path = _traces(tmp_path / "log.jsonl", rewards)
    with pytest.raises(wai.BatchError) as info:
        wai.train(rows=str(path), method="bpco", model="builtin:tiny", steps=20, progress=False, export=False,
                  run_dir=str(tmp_path / "run"))
    message = str(info.value)
    assert f"{path}, line 5: field 'reward' is 7, outside the method's reward_range (0, 1)" in message
    assert "Fix:" in message and message.count("line ") == 1


def test_held_out_tasks_the_log_also_trains_on_are_counted_and_named(tmp_path: Path, capsys):
    from whileai.engine.models import byte_tokenizer
    from whileai.envs import load_taskset, render_prompt

    taskset, tok = load_taskset("builtin:case"), byte_tokenizer()
    test = taskset.split("test")[:8]
    logged = [(t.task_id, t) for t in taskset.split("train")[:20]]
    logged += [(test[1].task_id, test[1]), ("renamed", test[4])]        # one by task id, one by prompt only
    lines = [{"prompt_tokens": render_prompt(tok, t), "tokens": [101, 2], "behavior_logprobs": [-5.5, -5.6],
              "reward": float(k % 2), "task_id": task_id} for k, (task_id, t) in enumerate(logged * 2)]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    wai.train(rows=str(path), eval_taskset="builtin:case", eval_tasks=8, eval_samples=1, method="flash_reinforce",
              model="builtin:tiny", steps=1, progress=False, export=False, run_dir=str(tmp_path / "run"))
    out = capsys.readouterr().out
    assert (f"warning: contamination: 2 of 8 held-out tasks also appear in the training log {path} (by task_id or "
            f"prompt): {test[1].task_id!r}, {test[4].task_id!r}.") in out


def test_a_log_apart_from_the_held_out_tasks_gets_no_warning(tmp_path: Path):
    from whileai.engine.models import byte_tokenizer
    from whileai.envs import load_taskset, render_prompt
    from whileai.loop.sources.traces import contamination

    taskset, tok = load_taskset("builtin:case"), byte_tokenizer()
    lines = [{"prompt_tokens": render_prompt(tok, t), "tokens": [101, 2], "behavior_logprobs": [-5.5, -5.6],
              "reward": 1.0, "task_id": t.task_id} for t in taskset.split("train")[:20]]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert contamination(scan(path, load_vocab("builtin:tiny"), trace=True), taskset.split("test")[:64]) is None


def test_a_vllm_log_without_token_ids_gets_one_short_error_naming_the_text_rows_route(tmp_path: Path):
    line = {"request": {"model": "m", "prompt": "abc", "logprobs": 1}, "reward": 1.0,
            "response": {"choices": [{"index": 0, "text": "xy", "finish_reason": "stop",
                                      "logprobs": {"tokens": ["x", "y"], "token_logprobs": [-1.0, -2.0]}}]}}
    path = tmp_path / "vllm.jsonl"
    path.write_text("".join(json.dumps({**line, "task_id": f"t{k}"}) + "\n" for k in range(30)))
    with pytest.raises(wai.BatchError) as info:
        scan(path, load_vocab("builtin:tiny"), trace=True)
    message = str(info.value)
    assert message.startswith(f"{path}: 30 lines (line 1, 2, 3, ...) have no token ids for the completion")
    assert len(message) < 600 and message.count("--return-tokens-as-token-ids") == 1
    assert "text row" in message and '"completion"' in message


def test_the_preflight_of_a_log_reads_every_trace_it_trains_on_not_the_first_batch(tmp_path: Path):
    """A log whose only pass sits past its first batch still has a signal: the preflight reads the whole file
    (64 traces, 1 pass: 1/64 = 0.015625), never just the 16 the first step happens to draw."""
    rewards = [0.0] * 64
    rewards[60] = 1.0
    path = _traces(tmp_path / "log.jsonl", rewards)
    run = wai.train(rows=str(path), method="flash_reinforce", model="builtin:tiny", steps=1, rollouts_per_step=16,
                    progress=False, export=False, run_dir=str(tmp_path / "run"))
    report = run.summary["preflight"]
    assert 16 < report["rollouts"] <= 64                       # the file's trained traces, not one batch
    assert report["pass_rate"] == pytest.approx(1 / report["rollouts"]) and not report["fatal"]


def test_a_long_method_cap_is_noted_once(tmp_path: Path, capsys):
    """Rows from a log scored on a taskset of one's own: the method's 8192-token cap is past the model's context;
    the plan's note says so, and the loop does not add a second note on the same cap."""
    log = _traces(tmp_path / "log.jsonl", [float(k % 2) for k in range(40)])
    tasks = tmp_path / "eval.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"{k}?", "answer": str(k % 10)}) + "\n" for k in range(40)))
    wai.train(rows=str(log), eval_taskset=str(tasks), steps=1, eval_tasks=2, eval_samples=1, progress=False,
              export=False, force=True, run_dir=str(tmp_path / "r"))
    out = capsys.readouterr().out
    assert "max_tokens = 8192 is not below the model's context of 256 tokens" in out
    assert "replies may run to 8192 tokens" not in out
