"""The run's default rules (whileai.loop.plan.rules), each with hand-worked values."""

import json
import math

import pytest

from whileai.loop.plan import rules


# ------------------------------------------------------------------------------------- warm start
def test_a_random_init_model_with_answers_gets_the_warm_start_budget():
    steps, source = rules.warm_start_steps(random_init=True, train_size=900, answered=900)
    assert steps == rules.WARM_START_MAX_STEPS == 2000
    assert "all 900 train tasks" in source and "0.7" in source


def test_a_loaded_model_or_missing_answers_get_no_warm_start():
    steps, source = rules.warm_start_steps(random_init=False, train_size=900, answered=900)
    assert steps == 0 and "loaded" in source
    steps, source = rules.warm_start_steps(random_init=True, train_size=900, answered=899)
    assert steps == 0 and "1 of the 900 train tasks have no reference answer" in source
    assert rules.warm_start_steps(random_init=True, train_size=0, answered=0)[0] == 0


def test_warm_start_reached_reads_the_pass_estimate_over_the_last_window():
    # two answer tokens a task: loss 0.2/token -> exp(-0.4) = 0.670 < 0.7; 0.15 -> exp(-0.3) = 0.741 >= 0.7
    assert not rules.warm_start_reached([0.2] * 60, [2.0] * 60)
    assert rules.warm_start_reached([0.15] * 60, [2.0] * 60)
    # never before the minimum (60 steps), however low the loss
    assert not rules.warm_start_reached([0.0] * 59, [2.0] * 59)
    # only the last 20 steps count: 40 bad steps then 20 at 0.1/token -> exp(-0.2) = 0.819
    assert rules.warm_start_reached([5.0] * 40 + [0.1] * 20, [2.0] * 60)
    # one bad step in the window: mean loss (19 * 0.1 + 2.1) / 20 = 0.2 -> exp(-0.4) = 0.670
    assert not rules.warm_start_reached([0.1] * 59 + [2.1], [2.0] * 60)
    # the window's mean answer length counts: 0.15/token x 3 tokens -> exp(-0.45) = 0.638
    assert not rules.warm_start_reached([0.15] * 60, [3.0] * 60)


def test_the_warm_start_rate_is_the_builtins_measured_one():
    rate, source = rules.warm_start_learning_rate()
    assert rate == 1e-2 and "0.01" in source


# ------------------------------------------------------------------------------------- generation cap
def test_answer_tokens_counts_text_answers_only():
    encode = lambda text: list(text.encode())  # noqa: E731 - a byte tokenizer
    assert rules.answer_tokens(["ab", 123, None, ["get x", "y"], True, 1.5], encode) == [2, 3, 3]


@pytest.mark.parametrize(("lengths", "cap"), [
    ([1, 1, 1], 3),       # 1 + max(1, ceil(0.25)) + EOS = 3: the parity task
    ([2, 4, 3], 6),       # 4 + max(1, ceil(1.0)) + 1 = 6
    ([10, 2], 14),        # 10 + ceil(2.5) = 3, + 1 = 14
    ([100], 126),         # 100 + 25 + 1
])
def test_the_cap_from_the_longest_answer(lengths, cap):
    got, source = rules.generation_cap(taskset_cap=None, answer_lengths=lengths, whole_answer=True, method_cap=8192)
    assert got == cap
    assert f"longest reference answer ({max(lengths)} token{'s' * (max(lengths) > 1)})" in source


def test_the_cap_falls_back_to_the_taskset_then_the_method_then_the_loop():
    assert rules.generation_cap(taskset_cap=5, answer_lengths=[1], whole_answer=True, method_cap=8192)[0] == 5
    cap, source = rules.generation_cap(taskset_cap=None, answer_lengths=[1], whole_answer=False, method_cap=8192)
    assert cap == 8192 and "reads reasoning" in source
    cap, source = rules.generation_cap(taskset_cap=None, answer_lengths=[], whole_answer=True, method_cap=None)
    assert cap == rules.FALLBACK_MAX_TOKENS == 256 and "no text reference answers" in source


def test_whole_answer_by_grader_or_warm_start():
    assert rules.whole_answer("exact", 0) and rules.whole_answer("chars", 0)
    assert not rules.whole_answer("numeric", 0) and not rules.whole_answer(lambda t, c: 1.0, 0)
    assert rules.whole_answer("math", 600)  # the warm start teaches the answer and EOS


# ------------------------------------------------------------------------------------- learning rate
@pytest.mark.parametrize(("kwargs", "rate", "words"), [
    (dict(random_init=True, warm_start_steps=600, lora_rank=0, parameters=None), 1e-3, "after a warm start of 600"),
    (dict(random_init=True, warm_start_steps=0, lora_rank=0, parameters=None), 1e-2, "without a warm start"),
    (dict(random_init=False, warm_start_steps=0, lora_rank=0, parameters=107_000), 1e-3, "small loaded model (0.11M"),
    (dict(random_init=False, warm_start_steps=0, lora_rank=8, parameters=107_000), 1e-2, "LoRA rank 8 of a small"),
    (dict(random_init=False, warm_start_steps=0, lora_rank=0, parameters=494_000_000), 1e-5, "494M parameters"),
    (dict(random_init=False, warm_start_steps=0, lora_rank=16, parameters=494_000_000), 2e-4, "LoRA rank 16"),
    (dict(random_init=False, warm_start_steps=0, lora_rank=0, parameters=None), 1e-5, "unknown size"),
])
def test_the_learning_rate_by_model_kind_and_size(kwargs, rate, words):
    got, source = rules.learning_rate(**kwargs)
    assert got == rate and words in source and f"{rate:g}" in source


def test_estimate_parameters_is_within_a_few_percent_of_the_real_count():
    from whileai.engine.models import BUILTINS, load_model, parameter_count

    for name in BUILTINS:
        loaded = load_model(f"builtin:{name}")
        real = parameter_count(loaded.model)
        estimate = rules.estimate_parameters(loaded.model.config.to_dict())
        assert estimate is not None and abs(estimate - real) / real < 0.05, (name, estimate, real)


def test_estimate_parameters_by_hand():
    # GPT-2 style: 50257 x 768 embeddings + 12 layers x (2 x 768^2 + 2 x 768 x 768 + 2 x 768 x 3072)
    gpt2 = dict(n_embd=768, n_layer=12, vocab_size=50257, n_head=12)
    assert rules.estimate_parameters(gpt2) == 50257 * 768 + 12 * (4 * 768 * 768 + 2 * 768 * 3072)
    assert math.isclose(rules.estimate_parameters(gpt2), 124e6, rel_tol=0.01)  # GPT-2's 124M
    assert rules.estimate_parameters({"hidden_size": 64}) is None


def test_model_parameters_reads_a_folders_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(n_embd=768, n_layer=12, vocab_size=50257, n_head=12)))
    assert rules.model_parameters(str(tmp_path)) == rules.estimate_parameters(
        dict(n_embd=768, n_layer=12, vocab_size=50257, n_head=12))
    assert rules.model_parameters("builtin:tiny") is None
    assert rules.model_parameters(str(tmp_path / "absent")) is None
    (tmp_path / "config.json").write_text("{not json")
    assert rules.model_parameters(str(tmp_path)) is None


# ------------------------------------------------------------------------------------- on a real warm start
def test_the_warm_start_stops_where_the_model_passes_the_target():
    """examples/tasksets/parity.jsonl, builtin:tiny, seed 1, the warm start exactly as `wai train` runs it: the
    rule stops it at step 86 (measured, docs/tasksets.md), and there the model passes at least the target on
    sampled train answers (the estimate is a lower bound): 64 tasks x 4 samples."""
    from pathlib import Path

    from whileai.engine import TrainingEngine
    from whileai.engine.datums import make_datum
    from whileai.envs import load_taskset, render_prompt
    from whileai.envs.episode import reference_episode
    from whileai.loop.sources.rollouts import Sampling, rollouts, step_tasks

    taskset = load_taskset(str(Path(__file__).resolve().parents[2] / "examples" / "tasksets" / "parity.jsonl"))
    engine = TrainingEngine("builtin:tiny", seed=1, keep_sampler_versions=1)
    train = taskset.split("train")
    losses, tokens = [], []
    while not rules.warm_start_reached(losses, tokens) and len(losses) < 200:
        tasks = step_tasks(train, 16, 1, 10_000_000 + len(losses))
        data = [(render_prompt(engine.tokenizer, t), *reference_episode(taskset, t, engine.tokenizer)) for t in tasks]
        count = sum(sum(mask) for _, _, mask in data)
        out = engine.forward_backward([make_datum(p, a, weights=[m / count for m in mask]) for p, a, mask in data],
                                      "cross_entropy")
        engine.optim_step({"learning_rate": rules.WARM_START_LEARNING_RATE})
        losses.append(float(out.metrics["loss:sum"]))
        tokens.append(count / len(data))
    assert len(losses) == 86
    probe = train[:64]
    rows = rollouts(engine, taskset, probe, [render_prompt(engine.tokenizer, t) for t in probe], [4] * 64,
                    Sampling(1.0, 3, cap_is_answer_length=False), seed=0, sampler_step=0)
    assert sum(r["reward"] >= 1.0 for r in rows) / len(rows) >= rules.WARM_START_TARGET


@pytest.mark.slow
def test_a_user_taskset_learns_under_the_rules(tmp_path):
    """examples/tasksets/successor.jsonl on builtin:tiny, seed 0, with every setting the rules give (the warm
    start never reaches the target here, so its budget, 2000 steps, is what the rule runs): held-out pass@1
    0.512 -> 0.594, +0.082 [+0.033, +0.131] measured (docs/tasksets.md); today's defaults: 0.000 -> 0.000."""
    from pathlib import Path

    from whileai.envs import load_taskset
    from whileai.loop import train
    from whileai.methods.registry import method

    path = str(Path(__file__).resolve().parents[2] / "examples" / "tasksets" / "successor.jsonl")
    taskset = load_taskset(path)
    train_tasks = taskset.split("train")
    warm, _ = rules.warm_start_steps(random_init=True, train_size=len(train_tasks),
                                     answered=sum(t.answer is not None for t in train_tasks))
    lengths = rules.answer_tokens([t.answer for t in train_tasks], lambda s: list(s.encode()))  # byte tokens
    cap, _ = rules.generation_cap(taskset_cap=taskset.max_tokens, answer_lengths=lengths,
                                  whole_answer=rules.whole_answer("exact", warm),
                                  method_cap=method("flash_reinforce").run_spec().max_tokens)
    rate, _ = rules.learning_rate(random_init=True, warm_start_steps=warm, lora_rank=0, parameters=None)
    assert (warm, cap, rate) == (2000, 6, 1e-3)
    run = train(taskset=path, seed=0, warm_start_steps=warm, max_tokens=cap, learning_rate=rate,
                run_dir=str(tmp_path / "run"), export=False, progress=False)
    compare = run.summary["compare"]
    assert compare["excludes_zero"] and compare["delta"] > 0.03, compare["text"]
