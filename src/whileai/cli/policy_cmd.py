"""`wai policy MODEL|RUN_DIR`: serve a model over the OpenAI API (completions and chat, streaming and not) with
token ids and the sampler's own log-probabilities, bound to 127.0.0.1 unless told otherwise; new weights load while it runs
(vLLM's runtime LoRA routes, SGLang's full reload: record.weights). docs/record.md."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from whileai.cli.options import (
    add_address,
    add_body_limit,
    add_threads,
    add_token,
    check_port,
    positive,
    serving_token,
    set_threads,
)
from whileai.record.requests import Limits

DEFAULT_PORT = 8300


def register(subparsers: Any) -> None:
    policy = subparsers.add_parser(
        "policy", help="serve a model (built-in, folder, or a run's final weights) over the OpenAI API",
        description="An OpenAI-compatible server (/v1/completions, /v1/chat/completions, streaming and not) for "
                    "the model being trained: token ids on request (return_token_ids) and log-probabilities of "
                    "the distribution each token was sampled from. Put `wai record` in front of it to record traces. "
                    "New weights load while it runs: POST /v1/load_lora_adapter (then model=<lora_name>), "
                    "/v1/unload_lora_adapter, /update_weights_from_disk (docs/record.md, Weight sync).")
    policy.add_argument("model", metavar="MODEL", help="builtin:tiny, builtin:mini, a model folder, or a run folder "
                                                       "from `wai train` (its final/ weights)")
    add_address(policy, DEFAULT_PORT)
    policy.add_argument("--seed", type=int, default=0, help="seed of a built-in model's weights (default 0)")
    add_token(policy, "policy")
    add_body_limit(policy, Limits.max_body_mb)
    policy.add_argument("--max-n", type=int, default=Limits.max_n,
                        help=f"most samples per prompt, n (default {Limits.max_n})")
    policy.add_argument("--max-tokens", type=int, default=Limits.max_tokens,
                        help=f"most tokens one sample may ask for, max_tokens (default {Limits.max_tokens})")
    policy.add_argument("--max-batch", type=int, default=Limits.max_batch,
                        help=f"most prompts in one completions request (default {Limits.max_batch})")
    add_threads(policy)
    policy.set_defaults(func=cmd_policy)


def cmd_policy(args: argparse.Namespace) -> int:
    import uvicorn

    from whileai.cli.serve_cmd import _check_free
    from whileai.record.policy import load
    from whileai.record.policy_app import create_policy_app

    check_port(args.port)
    positive(max_body_mb=args.max_body_mb, max_n=args.max_n, max_tokens=args.max_tokens, max_batch=args.max_batch)
    limits = Limits(args.max_body_mb, args.max_n, args.max_tokens, args.max_batch)
    token = serving_token(args, "policy")
    _check_free(args.host, args.port)
    set_threads(args.threads, "policy")
    served = load(args.model, seed=args.seed)
    print(f"wai policy: http://{args.host}:{args.port}/v1, model {served.name}, weights {served.version}", flush=True)
    uvicorn.run(create_policy_app(served, token, limits), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    from whileai.cli import main

    sys.exit(main(["policy", *sys.argv[1:]]))
