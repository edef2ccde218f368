"""`wai prime-rl`: write a prime-rl config for a method, or say why prime-rl cannot run it.

    wai prime-rl --env reverse-text --method rae --model Qwen/Qwen3-0.6B --set orchestrator.group_size=1 --out rl.toml

Prints what prime-rl will not read (and why), the warnings, and the launch command. Without
``--out`` it prints the TOML itself. A refusal exits with status 2 and the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from whileai.errors import ConfigError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

def methods_help() -> str:
    """The --method help, read from the registry and the writer: what is written, what is refused with the reason,
    what has no mapping (a new method lands in one of these without an edit here)."""
    from whileai.errors import ConfigError
    from whileai.methods.registry import method, method_names
    from whileai.prime_rl.refusals import WHOLE_METHODS
    from whileai.prime_rl.writer import WRITERS

    written: list[str] = []
    unmapped: list[str] = []
    refused = list(WHOLE_METHODS)
    for name in method_names():
        try:
            built = type(method(name)).name
        except ConfigError:  # a name whose defaults are not a method by themselves (async, groupwise_grading)
            built = name
        if name in WHOLE_METHODS:
            continue
        (written if built in WRITERS else unmapped).append(name if built == name else f"{name} (as {built})")
    return (f"method registry name: written: {', '.join(written)}; refused with the reason: {', '.join(refused)}, "
            f"and {', '.join(unmapped)} (no mapping)")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "prime-rl", help="write a prime-rl config (TOML + launch command) for a method, or refuse with the reason",
        description="Write a config for the prime-rl trainer (pinned to one commit) that trains METHOD on a "
                    "taskset, or refuse when prime-rl cannot run that method.")
    parser.add_argument("--env", required=True, help="taskset id, e.g. reverse-text (an installed taskset package)")
    parser.add_argument("--env-field", action="append", default=[], metavar="FIELD=VALUE",
                        help="a field of the taskset's own config, e.g. split=train (repeatable)")
    parser.add_argument("--method", required=True, help=methods_help())
    parser.add_argument("--knob", action="append", default=[], metavar="FIELD=VALUE",
                        help="a field of the method object, e.g. rollouts_per_prompt=16 (repeatable; see `wai methods`)")
    parser.add_argument("--model", required=True, help="the model id or path to train, e.g. Qwen/Qwen3-0.6B")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                        help="a prime-rl key, dotted, e.g. orchestrator.group_size=1 or trainer.optim.lr=3e-6; "
                             "values are read as TOML (strings may go unquoted) (repeatable)")
    parser.add_argument("--teacher-url", default=None,
                        help="base URL of the OpenAI-compatible server of OPD's teacher or SFT's frozen sampler")
    parser.add_argument("--teacher-model", default="", help="the model name that server serves")
    parser.add_argument("--teacher-vocab", type=int, default=None, help="the teacher tokenizer's len(tokenizer)")
    parser.add_argument("--model-vocab", type=int, default=None,
                        help="the student tokenizer's len(tokenizer); with --teacher-vocab a mismatch is refused")
    parser.add_argument("--strict", action="store_true",
                        help="refuse instead of listing a knob prime-rl cannot honour as ignored")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the TOML here (atomically); without it the TOML is printed")
    parser.add_argument("--json", action="store_true", help="print JSON (method, algorithm, command, path, pinned, config, ignored, mapped, warnings, toml)")
    parser.set_defaults(func=cmd_prime_rl)


def parse_value(text: str) -> Any:
    """A TOML value ('1', '3e-6', 'true', '[0.5, 5.0]', '"x"'), or the text itself as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_pairs(pairs: list[str], flag: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"{flag} {pair!r} is invalid: write NAME=VALUE, e.g. {flag} group_size=8")
        out[name.strip()] = parse_value(text.strip())
    return out


def build(args: argparse.Namespace) -> Any:
    """The PrimeRLConfig the arguments describe (raises ConfigError on a refusal)."""
    from whileai.endpoints import Endpoint
    from whileai.prime_rl import prime_rl_config

    fields = parse_pairs(args.env_field, "--env-field")
    env: Any = {"id": args.env, **fields} if fields else args.env
    knobs = parse_pairs(args.knob, "--knob")
    # a bare name goes to the writer, which also names (and refuses) methods whileai has no class for, e.g. ppo
    method: Any = _method(args.method, knobs)
    teacher = None
    if args.teacher_url:
        teacher = Endpoint(base_url=args.teacher_url, model=args.teacher_model, vocab_size=args.teacher_vocab)
    return prime_rl_config(env, method, model=args.model, teacher=teacher, model_vocab_size=args.model_vocab,
                           strict=args.strict, **parse_pairs(args.overrides, "--set"))


def _method(name: str, knobs: dict[str, Any]) -> Any:
    """The method object the knobs describe, or the bare name (the writer refuses it with the reason)."""
    from whileai.methods.registry import method as build_method
    from whileai.prime_rl.refusals import WHOLE_METHODS

    if not knobs or not _known(name):
        return name
    try:
        return build_method(name, **knobs)
    except ConfigError:
        if name.strip().lower().replace("-", "_") in WHOLE_METHODS:  # refused whatever its knobs
            return name
        raise


def _known(name: str) -> bool:
    from whileai.methods.registry import method_names

    return name.strip().lower().replace("-", "_") in method_names()


def cmd_prime_rl(args: argparse.Namespace) -> int:
    try:
        cfg = build(args)
    except ConfigError as err:  # a refusal (prime-rl cannot run the method) or a bad argument
        kind = "refused" if "What you can do:" in str(err) else "error"
        if args.json:
            print(json.dumps({kind: str(err)}))
        else:
            print(f"wai prime-rl: {kind}: {err}", file=sys.stderr)
        return 2
    if args.out is not None:
        cfg.write(args.out)
    if args.json:
        print(json.dumps({**cfg.to_dict(), "toml": cfg.toml}, indent=2))
    elif args.out is None:
        print(cfg.toml, end="")
    else:
        print(f"wrote {args.out}")
        print(cfg)
    return 0
