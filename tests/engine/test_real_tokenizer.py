"""The engine on a real model folder: Qwen2's tokenizer (a 151,643-rank byte-level BPE, no BOS, ChatML, two EOS
ids) rebuilt from a published vocabulary (tests/fixtures/qwen.py), and a tiny random body with its vocabulary.

Fast: the tokenizer is built once and cached; the model has 2 layers of width 64.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.fixtures.qwen import EOS, IM_END, IM_START, mid_token_stop, qwen_model_folder

# transformers' own Qwen2 tokenization integration test (tests/models/qwen2/test_tokenization_qwen2.py,
# test_tokenizer_integration): its sequences and the ids it expects, without the padding
SEQUENCES = [
    "Transformers (formerly known as pytorch-transformers and pytorch-pretrained-bert) provides "
    "general-purpose architectures (BERT, GPT-2, RoBERTa, XLM, DistilBert, XLNet...) for Natural "
    "Language Understanding (NLU) and Natural Language Generation (NLG) with over 32+ pretrained "
    "models in 100+ languages and deep interoperability between Jax, PyTorch and TensorFlow.",
    "🤗 Transformers 提供了可以轻松地下载并且训练先进的预训练模型的 API 和工具。使用预训练模型可以减少计算消耗和碳排放，并且节省从头训练所需要的时间和资源。",
    """```python\ntokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen-tokenizer")\n"""
    """tokenizer("世界，你好！")```""",
]
EXPECTED = [
    [8963, 388, 320, 69514, 3881, 438, 4510, 27414, 32852, 388, 323, 4510, 27414, 21334, 35722, 1455, 529, 8, 5707,
     4586, 58238, 77235, 320, 61437, 11, 479, 2828, 12, 17, 11, 11830, 61437, 64, 11, 1599, 10994, 11, 27604, 321,
     33, 529, 11, 29881, 6954, 32574, 369, 18448, 11434, 45451, 320, 45, 23236, 8, 323, 18448, 11434, 23470, 320,
     30042, 38, 8, 448, 916, 220, 18, 17, 10, 80669, 4119, 304, 220, 16, 15, 15, 10, 15459, 323, 5538, 94130, 2897,
     1948, 619, 706, 11, 5355, 51, 21584, 323, 94986, 13],
    [144834, 80532, 93685, 83744, 34187, 73670, 104261, 29490, 62189, 103937, 104034, 102830, 98841, 104034, 104949,
     9370, 5333, 58143, 102011, 1773, 37029, 98841, 104034, 104949, 73670, 101940, 100768, 104997, 33108, 100912,
     105054, 90395, 100136, 106831, 45181, 64355, 104034, 113521, 101975, 33108, 85329, 1773],
    [73594, 12669, 198, 85593, 284, 8979, 37434, 6387, 10442, 35722, 445, 48, 16948, 45274, 16948, 34841, 3135, 1138,
     85593, 445, 99489, 3837, 108386, 6313, 899, 73594],
]


@pytest.fixture(scope="module")
def tokenizer(qwen_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir))


@pytest.fixture(scope="module")
def engine(qwen_folder):
    from whileai.engine import TrainingEngine

    return TrainingEngine(str(qwen_folder))


@pytest.fixture(scope="module")
def ends_with_endoftext(qwen_tokenizer_dir, tmp_path_factory):
    """A folder whose model writes <|endoftext|> (151643) at every position: the tokenizer's EOS is <|im_end|>."""
    return qwen_model_folder(tmp_path_factory.mktemp("eot"), favour=[EOS])


def test_the_fixture_tokenizes_as_transformers_qwen2_test_expects(tokenizer):
    assert [tokenizer(s)["input_ids"] for s in SEQUENCES] == EXPECTED
    assert [tokenizer.decode(ids) for ids in EXPECTED] == SEQUENCES
    assert tokenizer.bos_token_id is None and tokenizer("hi")["input_ids"] == [6023]       # no BOS
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (IM_END, EOS)
    assert tokenizer.encode("<|im_start|>hello<|im_end|>") == [IM_START, 14990, IM_END]
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) else ids
    assert tokenizer.decode(ids) == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                                     "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_the_folder_is_what_a_user_brings(qwen_folder, engine):
    config = json.loads((qwen_folder / "config.json").read_text())
    assert config["vocab_size"] == 151936 and config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    assert json.loads((qwen_folder / "generation_config.json").read_text())["eos_token_id"] == [IM_END, EOS]
    assert engine.vocab_size == 151936 and engine.tokenizer.bos_token_id is None


def test_eos_ids_are_the_tokenizers_and_the_generation_configs(engine):
    from whileai.engine.stops import eos_ids

    assert eos_ids(engine.tokenizer, engine.model) == (IM_END, EOS)
    assert eos_ids(engine.tokenizer) == (IM_END,)


def test_every_generation_config_eos_id_ends_a_sample(ends_with_endoftext):
    """The model ends with <|endoftext|>, which is not the tokenizer's EOS but is in generation_config.json: the
    sample stops there, as transformers' generate does (before: it ran to the cap, 'length', 6 x 151643)."""
    from transformers import AutoModelForCausalLM

    from whileai.engine import TrainingEngine

    engine = TrainingEngine(str(ends_with_endoftext))
    prompt = engine.tokenizer.encode("Hello")
    (sample,) = engine.sample(prompt, 1, {"max_tokens": 6, "seed": 0})
    assert (sample.tokens, sample.stop_reason) == ([EOS], "stop")
    (ignored,) = engine.sample(prompt, 1, {"max_tokens": 6, "seed": 0, "ignore_eos": True})
    assert (ignored.tokens, ignored.stop_reason) == ([EOS] * 6, "length")
    reference = AutoModelForCausalLM.from_pretrained(str(ends_with_endoftext))
    out = reference.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
    assert out[0, len(prompt):].tolist() == [EOS]


def test_a_stop_string_inside_a_token_stops_the_engine_on_text(engine):
    tok = engine.tokenizer
    prompt = tok.encode("Count: one,")
    (free,) = engine.sample(prompt, 1, {"max_tokens": 24, "seed": 3, "ignore_eos": True})
    stop, k = mid_token_stop(tok, free.tokens)
    (stopped,) = engine.sample(prompt, 1, {"max_tokens": 24, "seed": 3, "ignore_eos": True, "stop": [stop]})
    assert (stopped.tokens, stopped.stop_reason) == (free.tokens[:k + 1], "stop")


def test_cut_at_stop_and_reply_ids():
    from whileai.engine.stops import cut_at_stop, reply_ids

    assert cut_at_stop("one two three", ["three", "two"]) == ("one ", True)
    assert cut_at_stop("one two", ["six"]) == ("one two", False)
    assert reply_ids([5, 6, IM_END], True, (IM_END, EOS)) == [5, 6]
    assert reply_ids([5, 6, IM_END], False, (IM_END, EOS)) == [5, 6, IM_END]


def test_an_environments_stop_string_ends_a_turn_on_the_text_in_training_rollouts(engine):
    """`wai train`'s rollouts: an environment's stop string that the model writes inside a token ends the turn
    there (before: its ids encoded alone were matched, and the turn ran on to the cap)."""
    from whileai.engine.sampling import SamplingParams
    from whileai.envs import Env, EnvTaskset, Task
    from whileai.loop.sources.rollouts import rollouts

    seen: list[str] = []

    def taskset_with(stop: tuple[str, ...]) -> EnvTaskset:
        class OneShot(Env):
            max_turns = 1

            def __init__(self, task):
                self.stop = stop

            def step(self, text):
                seen.append(text)

            def reward(self):
                return 0.0

        return EnvTaskset("oneshot", [Task("a", "Count: one,")], [Task("b", "x")], OneShot, max_tokens=24)

    def play(stop: tuple[str, ...]) -> dict:
        taskset = taskset_with(stop)
        tasks = taskset.split("train")
        prompt = engine.tokenizer.encode(tasks[0].prompt)
        (row,) = rollouts(engine, taskset, tasks, [prompt], [1], SamplingParams(max_tokens=24, temperature=1.0),
                          seed=4, sampler_step=0, cap_is_answer_length=False)
        return row

    free = play(())
    stop, k = mid_token_stop(engine.tokenizer, free["tokens"])
    row = play((stop,))
    assert row["tokens"] == free["tokens"][:k + 1] and row["truncated"] is False
    assert stop in seen[-1]


@pytest.mark.parametrize("lora_rank", [0, pytest.param(4, marks=pytest.mark.slow)])  # about 12 s each
def test_the_export_keeps_the_folders_dtype_and_tokenizer_files(qwen_folder, tmp_path, lora_rank):
    """RUN_DIR/final of a bfloat16 folder trained in float32 is bfloat16 again (before: float32, twice the size),
    and its tokenizer files are the folder's, with no session flag (before: local_files_only: true)."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from whileai.engine import TrainingEngine

    engine = TrainingEngine(str(qwen_folder), lora_rank=lora_rank)
    out = tmp_path / "final"
    engine.export(str(out), merged=True)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    config = json.loads((out / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    size = (out / "model.safetensors").stat().st_size / (qwen_folder / "model.safetensors").stat().st_size
    assert size < (1.01 if lora_rank == 0 else 2.02)  # LoRA on the tied head unties it at the merge (state.py)
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert not {"local_files_only", "is_local"} & set(saved)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [IM_END, EOS]
    reloaded, original = AutoTokenizer.from_pretrained(str(out)), AutoTokenizer.from_pretrained(str(qwen_folder))
    messages = [{"role": "user", "content": "Zähle: 一, 二 🤗"}]
    assert reloaded.apply_chat_template(messages) == original.apply_chat_template(messages)
    assert (reloaded.eos_token_id, reloaded.bos_token_id) == (IM_END, None)
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model.dtype == torch.bfloat16
    if lora_rank == 0:  # untrained: the same weights as the folder's
        source = AutoModelForCausalLM.from_pretrained(str(qwen_folder))
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), source.state_dict().values()))
    asked = engine.export(str(tmp_path / "f32"), merged=True, dtype="float32")
    assert json.loads((tmp_path / "f32" / "config.json").read_text()).get("dtype") == "float32" and asked


def test_a_stop_string_of_a_character_split_across_tokens_stops_on_the_token_that_completes_it(
        qwen_tokenizer_dir, tmp_path):
    """"𝔘" is two tokens here, neither whole UTF-8 (124026 = F0 9D 94, 246 = 98); a model writing only those
    halves stops on the first 246 that completes a "𝔘", never on a half."""
    from whileai.engine import TrainingEngine

    first, second = 124026, 246
    engine = TrainingEngine(str(qwen_model_folder(tmp_path / "halves", favour=[first, second])))
    prompt = engine.tokenizer.encode("x")
    (free,) = engine.sample(prompt, 1, {"max_tokens": 16, "seed": 2})
    (stopped,) = engine.sample(prompt, 1, {"max_tokens": 16, "seed": 2, "stop": ["𝔘"]})
    end = next(j for j in range(1, 16) if "𝔘" in engine.tokenizer.decode(free.tokens[:j + 1]))
    assert free.tokens[end - 1:end + 1] == [first, second]
    assert (stopped.tokens, stopped.stop_reason) == (free.tokens[:end + 1], "stop")
