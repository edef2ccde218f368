"""`wai policy` tokenizes a prompt by the one rule: a completions text prompt as the served folder's own tokenizer
encodes it (what vLLM serving that folder does), which for a built-in is the context training used."""

from __future__ import annotations

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
