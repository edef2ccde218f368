"""One tokenization rule across the trace formats: the same exchanges, logged as library rows, as an OpenAI
completions log with a text prompt (no token ids), with token ids, and as text rows, read to the same prompt
and completion tokens, so they train the same way (drift within 1e-6 of each other).

Before, an OpenAI log's text prompt was tokenized without BOS and a text row's with it: the same 300 exchanges
read with drift 1.5e-8 as a vLLM log and 0.97 as text rows.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from whileai.loop.sources.traces import load_vocab, scan
from whileai.loop.step import _drift


@lru_cache(maxsize=1)
def _exchanges() -> tuple[Any, list[dict[str, Any]]]:
    """builtin:tiny (seed 0), taught the case task's answers for 10 supervised steps so that it writes letters,
    sampled on builtin:case prompts; kept: replies whose text maps back to their ids (most of them)."""
    from whileai.engine import SamplingParams, TrainingEngine, sft_datum
    from whileai.envs import load_taskset, render_prompt

    engine, taskset = TrainingEngine("builtin:tiny", seed=0), load_taskset("builtin:case")
    tok, out = engine.tokenizer, []
    data = [sft_datum(tok, t.prompt, str(t.answer)) for t in taskset.split("train")[:32]]
    for _ in range(10):
        engine.forward_backward(data, "cross_entropy")
        engine.optim_step({"learning_rate": 1e-2})
    for k, task in enumerate(taskset.split("train")[:64]):
        prompt = render_prompt(tok, task)
        sample = engine.sample(prompt, 1, SamplingParams(max_tokens=4, temperature=1.0, seed=k))[0]
        body = sample.tokens[:-1] if sample.tokens[-1] == tok.eos_token_id else sample.tokens
        text = tok.decode(body, skip_special_tokens=True)
        if body and tok.encode(text, add_special_tokens=False) == body:
            out.append({"task": task, "prompt_tokens": prompt, "tokens": sample.tokens, "text": text,
                        "behavior_logprobs": sample.logprobs, "reward": float(k % 2)})
    return engine, out


def _library(e: dict[str, Any]) -> dict[str, Any]:
    return {k: e[k] for k in ("prompt_tokens", "tokens", "behavior_logprobs", "reward")} | {"task_id": e["task"].task_id}


def _completions(e: dict[str, Any], ids: bool) -> dict[str, Any]:
    """vLLM's completions log: the request's text prompt, tokens as 'token_id:N' (and the prompt's ids, if asked)."""
    response = {"object": "text_completion", "model": "tiny",
                "choices": [{"index": 0, "text": e["text"], "finish_reason": "stop",
                             "logprobs": {"tokens": [f"token_id:{t}" for t in e["tokens"]],
                                          "token_logprobs": e["behavior_logprobs"]}}]}
    if ids:
        response["prompt_token_ids"] = e["prompt_tokens"]
    return {"request": {"model": "tiny", "prompt": e["task"].prompt, "logprobs": 1}, "response": response,
            "reward": e["reward"], "task_id": e["task"].task_id}


def _text(e: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": e["task"].prompt, "completion": e["text"], "token_logprobs": e["behavior_logprobs"],
            "reward": e["reward"], "task_id": e["task"].task_id}


def test_every_trace_format_reads_the_same_exchanges_to_the_same_tokens_and_drift(tmp_path: Path):
    engine, exchanges = _exchanges()
    assert len(exchanges) >= 20
    vocab = load_vocab("builtin:tiny")
    writers = {"whileai": _library, "openai (text prompt)": lambda e: _completions(e, ids=False),
               "openai (token ids)": lambda e: _completions(e, ids=True), "text": _text}
    read, drift = {}, {}
    for name, write in writers.items():
        path = tmp_path / f"{name.split()[0]}-{len(read)}.jsonl"
        path.write_text("".join(json.dumps(write(e)) + "\n" for e in exchanges))
        source = scan(path, vocab, trace=True)
        traces = source.read(list(range(source.n)))
        read[name] = [(t["prompt_tokens"], t["tokens"]) for t in traces]
        for t in traces:  # the trained model is the sampler: score each trace under it
            full = engine.compute_logprobs(t["prompt_tokens"] + t["tokens"])["logprobs"]
            t["logprobs"] = full[len(t["prompt_tokens"]):]
        drift[name] = _drift(traces)
    expected = [(e["prompt_tokens"], e["tokens"]) for e in exchanges]
    for name, got in read.items():
        assert got == expected, name
        assert got[0][0][0] == 1, name                                    # every prompt starts with BOS
    assert max(drift.values()) - min(drift.values()) < 1e-6, drift
    assert max(drift.values()) < 1e-6, drift                             # on-policy: ~0 in every format
    assert np.isfinite(list(drift.values())).all()
