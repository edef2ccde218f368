"""The run's default rules (whileai.loop.plan.rules), each with hand-worked values."""

import json
import math

import pytest

from whileai.loop.plan import rules


# ------------------------------------------------------------------------------------- warm start
def test_a_random_init_model_with_answers_gets_the_warm_start_budget():
    steps, source = rules.warm_start_steps(random_init=True, train_size=900, answered=900)
    assert steps == rules.WARM_START_STEPS == 2400
    assert source.startswith("2400: a random-init model with reference answers for all 900 train tasks")


def test_a_loaded_model_or_missing_answers_get_no_warm_start():
    steps, source = rules.warm_start_steps(random_init=False, train_size=900, answered=900)
    assert steps == 0 and "loaded" in source
    steps, source = rules.warm_start_steps(random_init=True, train_size=900, answered=899)
    assert steps == 0 and "1 of the 900 train tasks have no reference answer" in source
    assert rules.warm_start_steps(random_init=True, train_size=0, answered=0)[0] == 0


@pytest.mark.parametrize(("steps", "rate"), [(14, 1e-2), (60, 1e-2), (100, 1e-2), (101, 3e-3), (200, 3e-3),
                                             (800, 3e-3)])
def test_the_warm_start_rate_follows_its_length(steps, rate):
    got, source = rules.warm_start_learning_rate(steps)
    assert got == rate and f"{rate:g}: a warm start of {steps} steps" in source


def test_a_short_warm_start_given_on_a_taskset_of_ones_own_keeps_the_short_rate():
    """builtin:case's tasks passed as a Taskset object (no recommendation) with --warm-start-steps 14: 3e-3 (the
    long warm start's rate) left it at held-out 0.02-0.05 where 1e-2 reaches 0.23-0.53 (the noise control proof)."""
    from whileai.envs import Taskset, load_taskset
    from whileai.loop import dry_run

    case = load_taskset("builtin:case")
    mine = Taskset("mine", case.split("train"), case.split("test"), case.grade, case.max_tokens)
    plan = dry_run(taskset=mine, warm_start_steps=14)
    assert (plan.warm_start_learning_rate, plan.learning_rate) == (1e-2, 1e-3)
    assert "1e-2" not in plan.source("warm_start_learning_rate") and "14 steps" in plan.source("warm_start_learning_rate")


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
    # beside the plan's `cap_is_answer_length False [derived]`: the cap is past the answer, not its length
    assert source.endswith("a reply that reaches it is cut short, not a whole answer: cap_is_answer_length False)")


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


def test_model_parameters_reads_a_folders_config_outside_the_embeddings(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(n_embd=768, n_layer=12, vocab_size=50257, n_head=12)))
    assert rules.model_parameters(str(tmp_path)) == 12 * (4 * 768 * 768 + 2 * 768 * 3072)  # GPT-2's 85M body


def test_a_two_layer_body_with_a_real_vocabulary_is_small_and_gpt2_is_pretrained(tmp_path):
    """The size rule reads the layers, not the embedding (issue 29): a 2-layer Qwen2-shaped toy with the
    151,936 vocabulary (136M of embedding) gets the small-model rate; GPT-2 (85M of layers) stays pretrained."""
    toy = dict(hidden_size=896, num_hidden_layers=2, vocab_size=151936, intermediate_size=4864,
               num_attention_heads=14, num_key_value_heads=2)
    (tmp_path / "config.json").write_text(json.dumps(toy))
    assert rules.estimate_parameters(toy) > 100e6  # counted with the embedding it looked pretrained
    rate, why = rules.learning_rate(random_init=False, warm_start_steps=0, lora_rank=0,
                                    parameters=rules.model_parameters(str(tmp_path)))
    assert rate == rules.SMALL_MODEL_LEARNING_RATE and "outside the embeddings" in why
    gpt2 = dict(n_embd=768, n_layer=12, vocab_size=50257, n_head=12)
    rate, _ = rules.learning_rate(random_init=False, warm_start_steps=0, lora_rank=0,
                                  parameters=rules.estimate_parameters(gpt2, embeddings=False))
    assert rate == rules.FULL_LEARNING_RATE
    assert rules.model_parameters("builtin:tiny") is None
    assert rules.model_parameters(str(tmp_path / "absent")) is None
    (tmp_path / "config.json").write_text("{not json")
    assert rules.model_parameters(str(tmp_path)) is None


@pytest.mark.slow
def test_a_user_taskset_learns_under_the_rules(tmp_path):
    """examples/tasksets/successor.jsonl on builtin:tiny, seed 0, every setting left to the rules: the warm start
    (2400 steps at 3e-3) and RL end with held-out pass@1 above the old rule's 0.594
    (2000 warm-start steps at 1e-2, docs/tasksets.md); the defaults before any rule: 0.000."""
    from pathlib import Path

    from whileai.loop import train

    path = str(Path(__file__).resolve().parents[2] / "examples" / "tasksets" / "successor.jsonl")
    run = train(taskset=path, seed=0, run_dir=str(tmp_path / "run"), export=False, progress=False)
    assert run.summary["warm_start_steps_run"] == rules.WARM_START_STEPS
    assert run.summary["eval_after"]["pass_at_1"] > 0.6, run.summary["compare"]["text"]
