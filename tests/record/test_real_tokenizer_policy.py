"""`wai policy` on a real model folder (tests/fixtures/qwen.py: Qwen2's tokenizer, a tiny random body): stop strings
on the text, every EOS id, the stop text cut from the content, and logprob text fields that are each token's own.

The fast tests drive ``record.policy`` in-process (the routes' code, without HTTP); the slow one runs a real
`wai policy` subprocess and the official ``openai`` client.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.fixtures.qwen import EOS, IM_END, mid_token_stop, qwen_model_folder
from whileai.record.launch import Started
from whileai.record.policy import Policy, answer, load, stream
from whileai.record.requests import parse_ask

# "𝔘" (F0 9D 94 98) is two Qwen tokens, neither whole UTF-8: 124026 = F0 9D 94, 246 = 98
PARTS = {124026: b"\xf0\x9d\x94", 246: b"\x98"}


def policy_of(folder) -> Policy:
    return Policy(load(str(folder)))


def ask(policy: Policy, body: dict, chat: bool = False):
    return parse_ask(body, chat, policy.served.name, ())


def streamed(policy: Policy, request) -> list[dict]:
    _, _, lines = stream(policy, request)
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


@pytest.fixture(scope="module")
def plain(qwen_folder):
    return policy_of(qwen_folder)


@pytest.fixture(scope="module")
def ends_with_endoftext(qwen_tokenizer_dir, tmp_path_factory):
    return policy_of(qwen_model_folder(tmp_path_factory.mktemp("eot"), favour=[EOS]))


@pytest.fixture(scope="module")
def splits_characters(qwen_tokenizer_dir, tmp_path_factory):
    """A model that writes only the two halves of "𝔘", about equally likely."""
    return policy_of(qwen_model_folder(tmp_path_factory.mktemp("parts"), favour=list(PARTS)))


def test_a_stop_string_stops_on_the_text_and_is_cut_from_the_content(plain):
    tok = plain.tokenizer
    body = {"prompt": "Count: one,", "max_tokens": 24, "seed": 3, "return_token_ids": True}
    free = answer(plain, ask(plain, body))["choices"][0]
    stop, k = mid_token_stop(tok, free["token_ids"])
    for chat in (False, True):
        request = {**body, "stop": [stop]}
        if chat:
            request = {"messages": [{"role": "user", "content": "Count: one,"}], "max_tokens": 24, "seed": 3,
                       "return_token_ids": True, "stop": stop}
            free = answer(plain, ask(plain, {k_: v for k_, v in request.items() if k_ != "stop"}, True))["choices"][0]
            stop, k = mid_token_stop(tok, free["token_ids"])
            request["stop"] = stop
        got = answer(plain, ask(plain, request, chat))["choices"][0]
        text = got["message"]["content"] if chat else got["text"]
        whole = tok.decode(free["token_ids"][:k + 1])
        assert got["finish_reason"] == "stop"
        assert got["token_ids"] == free["token_ids"][:k + 1]          # the ids keep the token that holds the stop
        assert text == whole[:whole.index(stop)] and stop not in text   # the content is cut before it
        pieces = streamed(plain, ask(plain, {**request, "stream": True}, chat))
        deltas = [c["choices"][0]["delta"].get("content", "") if chat else c["choices"][0]["text"]
                  for c in pieces if c["choices"]]
        assert "".join(deltas) == text


def test_every_eos_id_ends_a_reply_and_special_tokens_show_their_text(ends_with_endoftext):
    """<|endoftext|> is not the tokenizer's EOS (<|im_end|>) but generation_config.json's: the reply stops there
    (before: 'length' after 5 hidden tokens), and its logprob shows '<|endoftext|>' (before: '')."""
    policy = ends_with_endoftext
    body = {"prompt": "Hello", "max_tokens": 5, "seed": 0, "logprobs": 1, "return_token_ids": True}
    got = answer(policy, ask(policy, body))["choices"][0]
    assert (got["finish_reason"], got["token_ids"], got["text"]) == ("stop", [EOS], "")
    assert got["logprobs"]["tokens"] == ["<|endoftext|>"] and got["logprobs"]["text_offset"] == [0]
    chat = answer(policy, ask(policy, {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5,
                                       "logprobs": True, "seed": 0}, True))["choices"][0]
    assert chat["finish_reason"] == "stop" and chat["message"]["content"] == ""
    assert chat["logprobs"]["content"][0]["token"] == "<|endoftext|>"
    assert chat["logprobs"]["content"][0]["bytes"] == list(b"<|endoftext|>")
    assert policy.end_ids(ask(policy, body)) == (IM_END, EOS)


def test_tokens_inside_a_character_show_their_own_bytes_and_alternatives_do_not_collide(splits_characters):
    policy = splits_characters
    body = {"prompt": "x", "max_tokens": 12, "seed": 1, "logprobs": 2, "return_token_ids": True}
    got = answer(policy, ask(policy, body))["choices"][0]
    ids, lp = got["token_ids"], got["logprobs"]
    assert set(ids) <= set(PARTS) and len(ids) == 12
    names = {t: "bytes:" + "".join(f"\\x{b:02x}" for b in raw) for t, raw in PARTS.items()}
    assert lp["tokens"] == [names[t] for t in ids]
    assert all(set(top) == set(names.values()) for top in lp["top_logprobs"])   # before: one '\ufffd' entry
    chosen = [top[names[t]] for top, t in zip(lp["top_logprobs"], ids)]
    assert chosen == pytest.approx(lp["token_logprobs"], abs=1e-4)
    text = got["text"]
    assert text == policy.tokenizer.decode(ids)
    # a token starts where its text does in the returned text: a character's halves share the offset where it
    # starts (a half that never completes shows as U+FFFD once the next token proves it)
    offsets = lp["text_offset"]
    assert offsets == sorted(offsets) and all(0 <= o <= len(text) for o in offsets)
    pairs = [j for j in range(len(ids) - 1) if ids[j:j + 2] == [124026, 246] and (j == 0 or ids[j - 1] == 246)]
    assert pairs, ids
    for j in pairs:
        assert offsets[j] == offsets[j + 1] and text[offsets[j]] == "𝔘"
    chat = answer(policy, ask(policy, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 12, "seed": 1,
                                       "logprobs": True, "top_logprobs": 2}, True))["choices"][0]
    for entry in chat["logprobs"]["content"]:
        token = next(t for t, name in names.items() if name == entry["token"])
        assert entry["bytes"] == list(PARTS[token])
        assert sorted(bytes(a["bytes"]) for a in entry["top_logprobs"]) == sorted(PARTS.values())


def test_text_offsets_index_the_returned_text(plain):
    body = {"prompt": "Count: one,", "max_tokens": 16, "seed": 5, "logprobs": 0, "return_token_ids": True}
    got = answer(plain, ask(plain, body))["choices"][0]
    text, lp = got["text"], got["logprobs"]
    for piece, offset in zip(lp["tokens"], lp["text_offset"]):
        if not piece.startswith("bytes:"):
            assert text[offset:offset + len(piece)] == piece
    chunks = streamed(plain, ask(plain, {**body, "stream": True}))
    assert [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]] == lp["text_offset"]


@pytest.mark.slow
def test_the_openai_client_on_a_real_folder(qwen_folder, tmp_path):
    """A real `wai policy` subprocess on the folder and the official client: chat with multi-byte text, a stop
    string inside a token cut from the content (streamed and not), exact logprob bytes."""
    tok = policy_of(qwen_folder).tokenizer
    with Started(["policy", str(qwen_folder), "--threads", "1"], tmp_path) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=server.token, max_retries=0)
        messages = [{"role": "user", "content": "Zähle bis drei: 一, 二, 三 🤗"}]
        free = client.chat.completions.create(model=str(qwen_folder), messages=messages, max_tokens=20, seed=2,
                                              logprobs=True, top_logprobs=3, extra_body={"return_token_ids": True})
        ids = free.choices[0].model_extra["token_ids"]
        for entry, token in zip(free.choices[0].logprobs.content, ids):
            assert bytes(entry.bytes) == tok.convert_tokens_to_string([tok.convert_ids_to_tokens(token)]).encode(
                errors="surrogatepass") or entry.token.startswith("bytes:")
            assert len({a.token for a in entry.top_logprobs}) == 3
        stop, k = mid_token_stop(tok, ids)
        cut = client.chat.completions.create(model=str(qwen_folder), messages=messages, max_tokens=20, seed=2,
                                             stop=[stop], extra_body={"return_token_ids": True})
        whole = tok.decode(ids[:k + 1])
        assert cut.choices[0].finish_reason == "stop" and cut.choices[0].model_extra["token_ids"] == ids[:k + 1]
        assert cut.choices[0].message.content == whole[:whole.index(stop)]
        streamed_text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=str(qwen_folder), messages=messages, max_tokens=20, seed=2, stop=[stop], stream=True) if c.choices)
        assert streamed_text == cut.choices[0].message.content


def test_one_tokenization_and_one_distribution_from_training_to_wai_policy(plain, qwen_folder):
    """The chat prompt `wai policy` samples from is the prompt training renders (the folder's template, no BOS),
    and the reply's behaviour log-probabilities are what the trainer scores the same tokens at (drift ~0)."""
    import numpy as np

    from whileai.prompts import prompt_ids

    messages = [{"role": "user", "content": "Zähle bis drei: 一, 二, 三 🤗"}]
    body = {"messages": messages, "max_tokens": 12, "seed": 4, "temperature": 0.7, "logprobs": True,
            "return_token_ids": True}
    got = answer(plain, ask(plain, body, True))
    prompt, tokens = got["prompt_token_ids"], got["choices"][0]["token_ids"]
    assert prompt == prompt_ids(plain.tokenizer, messages) and prompt[0] == 151644  # <|im_start|>, no BOS
    behaviour = [e["logprob"] for e in got["choices"][0]["logprobs"]["content"]]
    scored = plain.served.engine.compute_logprobs(prompt + tokens, sampling_params={"temperature": 0.7})
    trained = np.asarray(scored["logprobs"][len(prompt):])
    assert np.abs(trained - np.asarray(behaviour)).max() < 1e-4


@pytest.mark.slow
def test_the_trainers_server_sampler_sends_stop_strings_that_stop_as_in_process(qwen_folder, tmp_path):
    """`wai train --sampler-url`: an environment's stop string goes to the server as `stop` (before: refused, or
    sent as the ids of the string alone) and stops the sample on the same token as in-process sampling."""
    from whileai.engine import SamplingParams, TrainingEngine
    from whileai.loop.sources.sampler import HTTPSampler
    from whileai.loop.sources.server_sampler import ServerSampler

    engine = TrainingEngine(str(qwen_folder))
    prompt = engine.tokenizer.encode("Count: one,")
    (free,) = engine.sample(prompt, 1, {"max_tokens": 24, "seed": 3})
    stop, k = mid_token_stop(engine.tokenizer, free.tokens)
    params = SamplingParams(max_tokens=24, seed=3, stop=[stop])
    (here,) = engine.sample(prompt, 1, params)
    with Started(["policy", str(qwen_folder), "--threads", "1"], tmp_path) as server:
        sampler = HTTPSampler(ServerSampler(server.url, str(qwen_folder), api_key=server.token), engine.tokenizer,
                              engine.max_context)
        ((there,),) = sampler.sample([prompt], 1, params)
    assert (there.tokens, there.stop_reason) == (here.tokens, "stop") == (free.tokens[:k + 1], "stop")


def test_wai_policys_answers_read_as_traces_in_each_format_on_the_real_folder(plain, qwen_folder, tmp_path):
    """A `wai policy` chat answer logged as it came (return_token_ids; its logprob text is the token's own), a
    completions answer with return_tokens_as_token_ids (vLLM's log), and the library row: one trace, read with
    the folder's tokenizer."""
    from whileai.loop.sources.traces import load_vocab, scan

    messages = [{"role": "user", "content": "Zähle: 一, 二 🤗"}]
    chat_body = {"messages": messages, "max_tokens": 10, "seed": 6, "logprobs": True, "return_token_ids": True}
    chat = answer(plain, ask(plain, chat_body, True))
    prompt, tokens = chat["prompt_token_ids"], chat["choices"][0]["token_ids"]
    behaviour = [e["logprob"] for e in chat["choices"][0]["logprobs"]["content"]]
    comp_body = {"prompt": prompt, "max_tokens": 10, "seed": 6, "logprobs": 0, "return_tokens_as_token_ids": True}
    comp = answer(plain, ask(plain, comp_body))
    assert comp["choices"][0]["logprobs"]["tokens"] == [f"token_id:{t}" for t in tokens]
    lines = {"chat": {"request": chat_body, "response": chat, "reward": 1.0, "task_id": "t"},
             "comp": {"request": comp_body, "response": comp, "reward": 1.0, "task_id": "t"},
             "mine": {"task_id": "t", "prompt_tokens": prompt, "tokens": tokens, "behavior_logprobs": behaviour,
                      "reward": 1.0}}
    vocab = load_vocab(str(qwen_folder))
    read = {}
    for name, line in lines.items():
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(line) + "\n")
        (read[name],) = scan(tmp_path / f"{name}.jsonl", vocab, trace=True).read([0])
    for trace in read.values():
        assert (trace["prompt_tokens"], trace["tokens"]) == (prompt, tokens)
        assert trace["behavior_logprobs"] == pytest.approx(behaviour, abs=1e-6)
