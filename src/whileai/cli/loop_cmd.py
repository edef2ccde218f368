"""`wai loop`: run one method of ``whileai.methods`` end to end, cycle by cycle.

``wai loop --algorithm NAME --taskset SPEC`` runs against an in-process engine; ``--url U --token T``
against a running ``wai serve``; ``--serve`` starts a ``wai serve`` of its own (in a temporary folder,
stopped at the end) and runs against it over HTTP. The first line says which. ``wai loop --list`` lists
the methods that sample rollouts. See docs/algorithms.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from whileai.errors import ConfigError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "loop", help="run one algorithm (build_loss) for a few cycles against the engine or a wai serve",
        description="Per cycle: save_weights_for_sampler -> sample -> grade -> [teacher logprobs] -> build_loss "
                    "-> forward_backward -> optim_step, with the cycle's reward and loss printed.")
    p.add_argument("--list", action="store_true", help="list the methods (name, loss, second run, summary)")
    p.add_argument("--algorithm", "--method", metavar="NAME", dest="algorithm",
                   help="the method to run (`wai loop --list` shows them)")
    p.add_argument("--taskset", default="builtin:case", metavar="SPEC",
                   help="builtin:NAME, a JSONL file, hf:NAME or reasoning_gym:NAME (default builtin:case)")
    p.add_argument("--model", default="builtin:tiny", help="the student's base model (default builtin:tiny)")
    p.add_argument("--lora-rank", type=int, default=0, help="0 trains every weight; > 0 LoRA adapters of that rank")
    p.add_argument("--cycles", type=int, default=3, help="cycles (optimizer steps) to run (default 3)")
    p.add_argument("--tasks-per-cycle", type=int, default=4, help="prompts per cycle (default 4)")
    p.add_argument("--rollouts-per-prompt", type=int, default=None,
                   help="completions per prompt (default: the method's)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="generation cap (default: the taskset's, else the method's, else 256)")
    p.add_argument("--learning-rate", type=float, default=None,
                   help="AdamW step (default 1e-2 for a built-in model, 1e-5 otherwise)")
    p.add_argument("--seed", type=int, default=0, help="seeds the model, the task draw and the sampler (default 0)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                   help="a knob of the method, e.g. --set clip_high=0.28; the "
                        "value is read as JSON when it parses, else as a string (repeatable)")
    p.add_argument("--teacher-model", default=None,
                   help="the frozen teacher's model for methods with a second run (default: the student's)")
    p.add_argument("--teacher-seed", type=int, default=None,
                   help="the frozen teacher's seed (default: the student's; a built-in teacher with another seed "
                        "is a differently initialised model)")
    p.add_argument("--url", default=None, help="a running wai serve, e.g. http://127.0.0.1:8321 (default: none, "
                   "run in-process)")
    p.add_argument("--token", default=None, help="its bearer token (default $WAI_TOKEN)")
    p.add_argument("--serve", action="store_true",
                   help="start a wai serve of its own (temporary folder, stopped at the end) and run over HTTP")
    p.add_argument("--json", action="store_true", help="also print every cycle's metrics as one JSON list at the end")
    p.set_defaults(func=cmd_loop)


def cmd_loop(args: argparse.Namespace) -> int:
    from whileai.algorithms.loops import resolve, rl_loop, second_run, teacher_loop

    if args.list:
        print_list()
        return 0
    if not args.algorithm:
        raise ConfigError("give --method NAME (`wai loop --list` shows them)")
    if args.url and args.serve:
        raise ConfigError("--url and --serve both say where to run; give one (or neither, to run in-process)")
    algo = resolve(args.algorithm, parse_settings(args.settings))
    second = second_run(algo)
    settings = {"cycles": args.cycles, "tasks_per_cycle": args.tasks_per_cycle, "seed": args.seed,
                "rollouts_per_prompt": args.rollouts_per_prompt, "max_tokens": args.max_tokens,
                "learning_rate": args.learning_rate}
    with ExitStack() as stack:
        target = connect(args, stack)
        common = {"model": args.model, "lora_rank": args.lora_rank, **settings}
        if second is None:
            result = rl_loop(target, algo, args.taskset, **common)
        else:
            result = teacher_loop(target, algo, args.taskset, teacher_model=args.teacher_model,
                                  teacher_seed=args.teacher_seed, **common)
        stack.callback(result.close)
        first, last = result.history[0], result.history[-1]
        rewards = f"{first['reward']:.3f}" if first is last else \
            f"{first['reward']:.3f} (cycle 0) -> {last['reward']:.3f} (cycle {last['cycle']})"
        print(f"done: {len(result.history)} cycle{'s' if len(result.history) > 1 else ''} on {result.where}; "
              f"reward {rewards}")
        if args.json:
            print(json.dumps(result.history))
    return 0


def connect(args: argparse.Namespace, stack: ExitStack) -> Any:
    """None (in-process), a Client of the server at --url, or of a server started here (--serve)."""
    if not args.url and not args.serve:
        return None
    from whileai.service import Client

    if args.serve:
        from whileai.service.launch import start_server

        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wai-loop-")))
        models = [args.model] + ([args.teacher_model] if args.teacher_model else [])
        server = stack.enter_context(start_server(folder / "data",
                                                  args=[a for m in dict.fromkeys(models) for a in ("--model", m)]))
        print(f"started wai serve at {server.url} (data in {folder}, stopped at the end)")
        return stack.enter_context(Client(server.url, server.token))
    token = args.token or os.environ.get("WAI_TOKEN")
    if not token:
        raise ConfigError("--url needs a bearer token: give --token T or set WAI_TOKEN (wai serve printed it)")
    return stack.enter_context(Client(args.url, token))


def parse_settings(settings: list[str]) -> dict[str, Any]:
    """['clip_high=1.28', 'estimator=beat_the_best'] -> {'clip_high': 1.28, 'estimator': 'beat_the_best'}."""
    out: dict[str, Any] = {}
    for item in settings:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set clip_high=1.28")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out


def print_list() -> None:
    from whileai.algorithms.loops import resolve, second_run
    from whileai.methods import method, method_names

    for name in method_names():
        try:
            chosen = resolve(method(name))
        except ConfigError:  # needs an option first (async, custom_loss), or trains on rows as pushed
            continue
        tag = {"teacher": "  [+ frozen teacher run]", "reference": "  [+ frozen reference run]"}.get(
            second_run(chosen) or "", "")
        doc = (type(chosen).__doc__ or "").strip().splitlines() or [""]
        print(f"{name:26s} {chosen.run_spec().loss:20s} {doc[0]}{tag}")
