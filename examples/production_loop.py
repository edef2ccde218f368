"""Traffic and a late grader for the production loop (docs/record.md, "The production loop, closed").

    python examples/production_loop.py traffic --recorder http://127.0.0.1:8400 --model policy \
        --tokenizer ./warm/final --taskset builtin:case --asks 2000 --score-after 1
    python examples/production_loop.py eval --server http://127.0.0.1:8300 --model policy \
        --tokenizer ./warm/final --taskset builtin:case --tasks 64 --samples 4

``traffic`` plays the users: it asks the taskset's train prompts (as token ids, rendered with the model's
tokenizer) through the recorder with the official ``openai`` client, and a grader scores each reply through
the recorder's reward endpoint ``--score-after`` seconds later, as a user's thumbs-up or a test run would.
``eval`` measures served pass@1 on the test split, asking the server itself (not through the recorder, so
the held-out asks are never trained on). Both wait until the server lists ``--model`` (the trainer's first
push loads the adapter ``policy``). Both send the servers' token from ``$WAI_TOKEN`` (docs/record.md, Auth).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai

from whileai.envs import load_taskset, render_prompt
from whileai.loop.sources.traces import load_vocab
from whileai.record.rewards import score


def wait_for_model(url: str, model: str, timeout: float = 300.0) -> None:
    """Until ``GET /v1/models`` at ``url`` lists ``model`` (a LoRA adapter appears at the trainer's first push)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            listed = httpx.get(url.rstrip("/") + "/v1/models", timeout=10, headers=_auth()).json().get("data", [])
            if any(m.get("id") == model for m in listed):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not list model {model!r} within {timeout:g} s (is the trainer running?)")


def _auth() -> dict[str, str]:
    token = os.environ.get("WAI_TOKEN")
    return {"authorization": f"Bearer {token}"} if token else {}


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key=os.environ.get("WAI_TOKEN") or "none",
                         max_retries=2)


def traffic(recorder: str, model: str, tokenizer: Any, taskset: Any, asks: int, score_after: float, seed: int = 0,
            stop: Callable[[], bool] = lambda: False, max_tokens: int = 4) -> dict[str, int]:
    """Ask ``asks`` train prompts (cycling through the split) one after another; each reply is graded and its
    score posted ``score_after`` seconds later. Returns the asks sent and the rewards posted."""
    tasks = taskset.split("train")
    raw = client(recorder).completions.with_raw_response
    counts = {"asks": 0, "scored": 0}
    timers: list[threading.Timer] = []

    def grade(trace_id: str, reward: float) -> None:
        score(recorder, trace_id, reward)
        counts["scored"] += 1

    for k in range(asks):
        if stop():
            break
        task = tasks[(seed * 7919 + k) % len(tasks)]
        answer = raw.create(model=model, prompt=render_prompt(tokenizer, task), max_tokens=max_tokens, seed=seed + k)
        trace_id, text = answer.headers["x-whileai-trace-id"], answer.parse().choices[0].text
        timer = threading.Timer(score_after, grade, (trace_id, taskset.grade(task, text)))
        timer.start()
        timers.append(timer)
        counts["asks"] += 1
    for timer in timers:
        timer.join()
    return counts


def served_pass(server: str, model: str, tokenizer: Any, taskset: Any, tasks: int, samples: int,
                seed: int = 10_000, max_tokens: int = 4) -> list[dict[str, Any]]:
    """Graded rows (``task_id``, ``reward``) of ``samples`` replies to each of the first ``tasks`` test tasks."""
    ask = client(server).completions.create

    def one(item: tuple[int, Any]) -> list[dict[str, Any]]:
        k, task = item
        reply = ask(model=model, prompt=render_prompt(tokenizer, task), max_tokens=max_tokens, n=samples, seed=seed + k)
        return [{"task_id": task.task_id, "reward": taskset.grade(task, c.text)} for c in reply.choices]

    with ThreadPoolExecutor(max_workers=2) as pool:
        return [row for rows in pool.map(one, enumerate(taskset.split("test")[:tasks])) for row in rows]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("traffic", "eval"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True, help="the model the clients ask for (policy: the trained adapter)")
        p.add_argument("--tokenizer", required=True, help="the served base model (a folder or builtin:NAME), whose "
                                                          "tokenizer renders the prompts")
        p.add_argument("--taskset", default="builtin:case")
        p.add_argument("--seed", type=int, default=0)
    sub.choices["traffic"].add_argument("--recorder", required=True)
    sub.choices["traffic"].add_argument("--asks", type=int, default=1000)
    sub.choices["traffic"].add_argument("--score-after", type=float, default=1.0, help="seconds before the grade")
    sub.choices["eval"].add_argument("--server", required=True)
    sub.choices["eval"].add_argument("--tasks", type=int, default=64)
    sub.choices["eval"].add_argument("--samples", type=int, default=4)
    args = parser.parse_args(argv)
    taskset, tokenizer = load_taskset(args.taskset), load_vocab(args.tokenizer).tokenizer
    if args.command == "traffic":
        wait_for_model(args.recorder, args.model)
        print(json.dumps(traffic(args.recorder, args.model, tokenizer, taskset, args.asks, args.score_after,
                                 args.seed)))
    else:
        wait_for_model(args.server, args.model)
        rows = served_pass(args.server, args.model, tokenizer, taskset, args.tasks, args.samples)
        print(json.dumps({"pass_at_1": sum(r["reward"] >= 1.0 for r in rows) / len(rows), "rows": len(rows)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
