"""render_prompt: the chat template when the tokenizer has one, else the text as the tokenizer encodes it (the
built-in byte tokenizer: BOS + the text's bytes; its chat messages: the byte chat format of wai policy)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import whileai as wai
from whileai.envs import Task, load_taskset, render_prompt

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def byte_tok():
    from whileai.engine.models import byte_tokenizer

    return byte_tokenizer()


@pytest.fixture()
def chat_tok():
    from whileai.engine.models import byte_tokenizer

    tok = byte_tokenizer()   # a PreTrainedTokenizerFast; give it a template of its own
    tok.chat_template = TEMPLATE
    return tok


def test_byte_tokenizer_gets_bos_and_bytes(byte_tok):
    # ids 0-2 are pad/bos/eos and byte b is id 3 + b: "abq" = 97, 98, 113 -> 100, 101, 116
    assert render_prompt(byte_tok, Task("1", "abq")) == [1, 100, 101, 116]
    assert render_prompt(byte_tok, Task("2", "3+4=")) == [1, 3 + ord("3"), 3 + ord("+"), 3 + ord("4"), 3 + ord("=")]
    task = load_taskset("builtin:case").split("test")[0]
    assert byte_tok.decode(render_prompt(byte_tok, task)[1:]) == task.prompt


def test_chat_messages_on_the_byte_tokenizer_take_the_format_wai_policy_serves(byte_tok):
    from whileai.record import chat

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    ids = render_prompt(byte_tok, Task("c", messages))
    assert ids == chat.render(byte_tok, messages)                    # one format: training, traces, wai policy
    assert ids[0] == 1 and byte_tok.decode(ids[1:]) == "system: be brief\nuser: hi\nassistant: "


def test_chat_messages_on_another_tokenizer_without_template_refused(byte_tok):
    """A loaded model's tokenizer without a chat template gets no format of ours (vLLM has none either)."""
    from transformers import PreTrainedTokenizerFast

    other = PreTrainedTokenizerFast(tokenizer_object=byte_tok.backend_tokenizer, bos_token="<|bos|>",
                                    eos_token="<|eos|>", unk_token=None)
    other.add_tokens(["<|tool|>"])                                     # 260 ids: not the built-in's tokenizer
    with pytest.raises(wai.ConfigError, match="task_id='c'.*no chat template"):
        render_prompt(other, Task("c", [{"role": "user", "content": "hi"}]))


def test_chat_template_on_text_and_messages(chat_tok):
    ids = render_prompt(chat_tok, Task("1", "abq"))        # text becomes one user message
    assert ids == chat_tok.encode("<user>abq\n<assistant>", add_special_tokens=False)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    ids = render_prompt(chat_tok, Task("2", messages))
    assert chat_tok.decode(ids) == "<system>be brief\n<user>2+2?\n<assistant>"
    assert all(isinstance(i, int) for i in ids)


def test_import_pulls_no_torch_and_no_extras():
    code = ("import sys, whileai.envs; heavy = [m for m in ('torch', 'datasets', 'math_verify', 'reasoning_gym') "
            "if m in sys.modules]; print(heavy); sys.exit(bool(heavy))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
