"""`wai policy` tokenizes a prompt by the one rule: a completions text prompt as the served folder's own tokenizer
encodes it (what vLLM serving that folder does), which for a built-in is the context training used."""

from __future__ import annotations

import pytest

import whileai as wai
from whileai.engine.models import build_builtin, byte_tokenizer
from whileai.envs import Task, render_prompt
from whileai.record.policy import Policy, load
from whileai.record.requests import parse_ask


def test_a_completions_text_prompt_gets_the_training_context_on_a_built_in_and_on_its_export(tmp_path):
    from transformers import AutoTokenizer

    model, tokenizer = build_builtin("tiny", seed=0)
    model.save_pretrained(str(tmp_path / "final"))
    tokenizer.save_pretrained(str(tmp_path / "final"))
    served = {"builtin": Policy(load("builtin:tiny")), "export": Policy(load(str(tmp_path / "final")))}
    reloaded = AutoTokenizer.from_pretrained(str(tmp_path / "final"))
    for text in ("abq", "3+4=", "caf\u00e9"):
        trained = render_prompt(byte_tokenizer(), Task("t", text))
        assert trained[0] == 1 and trained == reloaded(text)["input_ids"]
        for name, policy in served.items():
            ask = parse_ask({"prompt": text}, False, policy.served.name)
            assert policy.prompt_ids(ask) == trained, (name, text)
    ask = parse_ask({"prompt": [1, 100, 101]}, False, "builtin:tiny")          # token ids are taken as given
    assert served["builtin"].prompt_ids(ask) == [1, 100, 101]


def test_chat_messages_read_the_same_in_wai_policy_a_taskset_and_a_chat_log_without_ids(tmp_path):
    import json

    from whileai.loop.sources.traces import load_vocab, scan

    policy = Policy(load("builtin:tiny"))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "abq"}]
    served = policy.prompt_ids(parse_ask({"messages": messages}, True, "builtin:tiny"))
    assert served == render_prompt(byte_tokenizer(), Task("t", messages))
    line = {"request": {"model": "builtin:tiny", "messages": messages, "logprobs": True}, "reward": 1.0,
            "response": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "rst"},
                                      "logprobs": {"content": [{"token": "token_id:117", "logprob": -0.3}]},
                                      "finish_reason": "stop"}]}}
    (tmp_path / "chat.jsonl").write_text(json.dumps(line) + "\n")
    trace = scan(tmp_path / "chat.jsonl", load_vocab("builtin:tiny"), trace=True).read([0])[0]
    assert trace["prompt_tokens"] == served


def test_a_loaded_tokenizer_without_a_chat_template_gets_no_chat_format_of_ours():
    from transformers import PreTrainedTokenizerFast

    from whileai.record import chat

    other = PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer().backend_tokenizer, bos_token="<|bos|>",
                                    eos_token="<|eos|>", unk_token=None)
    other.add_tokens(["<|tool|>"])                                     # not the built-in's tokenizer
    with pytest.raises(wai.ConfigError, match="no chat template.*send the prompt as text to /v1/completions"):
        chat.render(other, [{"role": "user", "content": "hi"}])
