"""`wai train`: train a model (no arguments: the embedded default run on a built-in model and task)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from whileai.errors import ConfigError

EXAMPLES = """examples:
  wai train                                         the embedded default: builtin:tiny learns builtin:case on CPU
  wai train --method grpo --taskset builtin:add --steps 100
  wai train --config run.toml --lag 0               a TOML file, one field overridden by a flag
  wai train --method sft --rows passes.jsonl --model ./my-model --lora-rank 16
  wai train --rows traces.jsonl --method flash_reinforce --model ./my-model   logged traces (docs/traces.md)
  wai train --rows-from http://127.0.0.1:8400 --sampler-url http://127.0.0.1:8300 --lora-rank 8
                                                    train on a recorder's traces as they are scored, pushing
                                                    each step's adapter to the server (docs/record.md)
  wai train --taskset my_tasks.jsonl --no-progress   your own tasks: the rules fill the warm start, cap and rates
                                                    (a line every 25 warm-start steps; the plan says why each)
  wai train --taskset my_tasks.jsonl --threads 1    torch threads (default: $OMP_NUM_THREADS, else free cores)
  wai train --resume runs/flash_reinforce-20261201-120000   continue after Ctrl-C (a stopped warm start too)
  wai train --method grpo --dry-run                 print the run plan (every setting, its value, its source)
  wai train --url http://127.0.0.1:8321 --token T   train on a running `wai serve` (token also from $WAI_TOKEN)
  wai train --sampler-url http://127.0.0.1:8300 --lag 1   sample from an inference server (vLLM, SGLang, wai policy)
  wai train --url URL --api tinker --lora-rank 8   train on a Tinker-API server (key: --token or $TINKER_API_KEY)
"""
# argparse reads "-1e-3" as an option (its own pattern knows only -1 and -1.5), so --learning-rate -1e-3 would
# fail as "expected one argument" before the config's own check could say what is wrong with the value.
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _value(text: str) -> Any:
    """A flag value read as JSON when it parses (numbers, true/false, null, lists), else as a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _pairs(items: list[str], flag: str) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {item!r}: expected KEY=VALUE, e.g. {flag} trust=0.01")
        out[key] = _value(value)
    return out


def register(subparsers: Any) -> None:
    _add(subparsers, "train", "train a model: sample, grade, update, step (no arguments: a CPU demo)")
    # `wai loop`: what the loop over a server was called before `wai train --url` was it; the same command
    _add(subparsers, "loop", "another name of `wai train` (the same flags)")


def _add(subparsers: Any, name: str, summary: str) -> None:
    from whileai.loop.plan.config import TrainConfig, field_docs

    p = subparsers.add_parser(name, help=summary, description=__doc__, epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", help="a TOML file of settings (a [train] table or top-level keys); "
                   "flags override it")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint with its saved config (--steps, --threads "
                   "and --progress may change); a run still training is refused")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a method knob, e.g. "
                   "--set trust=0.01 (`wai methods NAME` lists them)")
    p.add_argument("--taskset-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a taskset option, e.g. --taskset-option grader=numeric (docs/tasksets.md)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON at the end")
    p.add_argument("--dry-run", action="store_true", help="resolve and check the run plan, print it (every setting, "
                   "its value and its source) and exit: nothing is loaded or written")
    p.add_argument("--token", metavar="T", help="with --url: the server's bearer token (default $WAI_TOKEN; with --api tinker "
                   "$TINKER_API_KEY); not saved with the run: give it again to --resume")
    p._negative_number_matcher = NEGATIVE_NUMBER  # type: ignore[attr-defined]
    _control_flags(p)
    docs = field_docs()
    for name, spec in TrainConfig.__dataclass_fields__.items():
        if name in ("knobs", "taskset_options"):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(spec.default, bool):
            p.add_argument(flag, dest=name, default=None, action=argparse.BooleanOptionalAction, help=docs[name])
        else:
            given = spec.default is not None and "(default" not in docs[name]  # a fixed default, said in --help
            text = f"{docs[name]} (default {spec.default})" if given else docs[name]
            p.add_argument(flag, dest=name, default=None, type=_value, metavar=name.upper(), help=text)
    p.set_defaults(func=run)


def _control_flags(p: Any) -> None:
    from whileai.loop.controls import CONTROL_SEEDS, CONTROLS

    p.add_argument("--control", action="append", default=[], choices=CONTROLS, help="also train this random "
                   "control on the same budget and compare it with the real arm on held-out pass@1 (repeatable; "
                   "docs/train.md, 'Controls')")
    p.add_argument("--control-seeds", type=int, default=CONTROL_SEEDS, metavar="N", help="with --control: seeds "
                   f"per arm, counted up from --seed (default {CONTROL_SEEDS}; at 2 seeds compare shows a gain only "
                   "when it is about 9x the seeds' spread)")
    p.add_argument("--select-from", metavar="POOL", help="with --control random-selection: the rows file that "
                   "--rows was selected from")


def run(args: argparse.Namespace) -> int:
    from whileai.loop import Interrupted, TrainConfig, dry_run, train

    if args.resume:
        given = [f for f in TrainConfig.__dataclass_fields__ if getattr(args, f, None) is not None
                 and f not in ("steps", "progress", "threads")]
        if given or args.config or args.set or args.taskset_option:
            raise ConfigError(f"--resume uses the run's saved config (only --steps, to train longer, --threads and "
                              f"--progress may change); drop {', '.join('--' + g.replace('_', '-') for g in given) or '--config/--set'}")
    overrides = {f: getattr(args, f) for f in TrainConfig.__dataclass_fields__ if getattr(args, f, None) is not None}
    for field_name in ("rows", "taskset", "eval_taskset", "teacher", "run_dir", "model", "method", "device", "url",
                       "sampler_url"):
        # paths and names stay strings
        if field_name in overrides and not isinstance(overrides[field_name], str):
            overrides[field_name] = str(overrides[field_name])
    if args.set:
        overrides["knobs"] = _pairs(args.set, "--set")
    if args.taskset_option:
        overrides["taskset_options"] = _pairs(args.taskset_option, "--taskset-option")
    if args.control or args.select_from:
        return _controlled(args, overrides)
    if args.dry_run:
        if args.resume:
            raise ConfigError("--dry-run prints a new run's plan; a resumed run's is in RUN_DIR/config.toml ([plan])")
        print(dry_run(config_file=args.config, **overrides).table())
        return 0
    try:
        result = train(resume=args.resume, config_file=args.config, token=args.token, **overrides)
    except Interrupted as stop:
        print(f"wai train: {stop}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # before the run's own Ctrl-C handling began (loading), or a second Ctrl-C
        print("wai train: interrupted; no checkpoint was written by this stop (a run directory with an earlier "
              "checkpoint can still be resumed)", file=sys.stderr)
        return 130
    print(json.dumps(result.summary, indent=2) if args.json else str(result))
    return 0


def _controlled(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    from whileai.loop.controls import train_with_controls

    if args.resume:
        raise ConfigError("--resume cannot take --control: a controlled run is started again, not resumed")
    report = train_with_controls(args.control, seeds=args.control_seeds, select_from=args.select_from,
                                 config_file=args.config, **overrides)
    print(json.dumps(report.to_dict(), indent=2) if args.json else str(report))
    return 0
