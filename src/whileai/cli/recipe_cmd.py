"""`wai recipe NAME`: a paper recipe, its baseline arm against the recipe arm on one budget over seeds.

Prints the lesson's table row per recipe arm (both arms' held-out pass@1, the paired delta with its 95%
interval, ``compare``'s verdict) and the drift each arm reached; writes RUN_DIR/recipe.json and recipe.txt.
``wai recipe --list`` names the recipes and their arms (``wai recipe NAME --list --set ...``: one recipe's arms as
they would run). ``--set [ARM:]KEY=VALUE`` changes a knob of every arm, of ``baseline``, of every ``recipe`` arm,
or of one arm by its slug (the name in brackets in the list). See docs/evidence.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from typing import Any


def register(subparsers: Any) -> None:
    from whileai.evidence import RECIPES

    p = subparsers.add_parser(
        "recipe", help="run a paper recipe: baseline arm against the recipe arm over seeds, with compare's verdict",
        description="Train the recipe's baseline arm and its recipe arm(s) at every seed on one budget (same model, "
                    "taskset, seeds, lag, steps and learning rate; only the method differs), then print held-out "
                    "pass@1 of each arm, the paired delta with its 95% interval and verdict, and the drift reached.")
    p.add_argument("name", nargs="?", metavar="NAME", help=f"the recipe: one of {', '.join(RECIPES)}")
    p.add_argument("--list", action="store_true", help="list the recipes, their claims and their arms (with NAME: "
                   "that recipe's arms as they would run, --set applied); nothing trains")
    p.add_argument("--set", action="append", default=[], metavar="[ARM:]KEY=VALUE", dest="knobs",
                   help="change a method knob (value read as JSON when it parses, as `wai train --set`): of every "
                   "arm, or of ARM = baseline, recipe (every recipe arm) or an arm's slug, e.g. --set "
                   "recipe:trust=0.01, --set dr-grpo:max_tokens=8; repeatable")
    add_seed_flags(p, 5, "per arm (default 5; compare needs >= 2)", "; the arms run seeds SEED .. SEED+N-1")
    p.add_argument("--repeats", type=int, default=None, help="run the recipe R times on disjoint seeds (repeat k: "
                   "seeds SEED+k*N ..) and report how often each verdict came out, with its 95%% interval (the null "
                   "control's false-shown rate, a positive control's power); default: once")
    p.add_argument("--lag", type=int, default=None, help="sampler lag in optimizer steps (default: the paper recipes' "
                   "16; the controls' the loop's, 2)")
    add_budget_flags(p)
    add_output_flags(p, "recipe.json", "runs/recipe-NAME-TIME", "the report")
    p.set_defaults(func=cmd_recipe)


def cmd_recipe(args: argparse.Namespace) -> int:
    from whileai.cli.train_cmd import _pairs
    from whileai.errors import ConfigError
    from whileai.evidence import RECIPES, recipe, run_recipe

    knobs = _pairs(args.knobs, "--set")
    if args.list:
        return _list(args, knobs)
    if not args.name:
        raise ConfigError(f"give a recipe NAME, one of {', '.join(RECIPES)} (`wai recipe --list` shows their arms)")
    chosen = recipe(args.name)
    run_dir = args.run_dir or f"runs/recipe-{chosen.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout), \
            stopped_kept("wai recipe", run_dir):  # --json: stdout is the JSON only
        if args.repeats is not None:
            from whileai.evidence.repeats import repeat_recipe

            result: Any = repeat_recipe(chosen, args.repeats, seeds=args.seeds, progress=args.progress, knobs=knobs,
                                        run_dir=run_dir, seed=args.seed, **_shared(args))
        else:
            result = run_recipe(chosen, seeds=args.seeds, progress=args.progress, knobs=knobs, run_dir=run_dir,
                                seed=args.seed, **_shared(args))
    print(json.dumps(result.to_dict(), indent=2) if args.json else result)
    return 0


@contextlib.contextmanager
def stopped_kept(command: str, run_dir: str) -> Iterator[None]:
    """Ctrl-C during a sweep of runs: one line saying what is kept and the command that continues, not a
    traceback nor the single run's `wai train --resume` hint (the sweep resumes its stopped run itself)."""
    from whileai.errors import WhileaiError
    from whileai.loop.run import Interrupted

    try:
        yield
    except (KeyboardInterrupt, Interrupted):
        raise WhileaiError(f"interrupted; the finished runs and the stopped run's checkpoint are kept in {run_dir}: "
                           f"run the same {command} command with --run-dir {run_dir} to continue from them") from None


def add_seed_flags(p: argparse.ArgumentParser, seeds: int, per: str, first: str = "") -> None:
    """A sweep's seeds (`wai recipe`, `wai lags`): how many per cell or arm, from which first one."""
    p.add_argument("--seeds", type=int, default=seeds, help=f"training seeds {per}")
    p.add_argument("--seed", type=int, default=0, help=f"the first seed{first} (default 0)")


def add_output_flags(p: argparse.ArgumentParser, report: str, run_dir: str, shown: str, reuse: str = "") -> None:
    """Where a sweep's runs and ``report`` go, its progress bars, and ``--json`` for ``report`` instead of ``shown``."""
    p.add_argument("--run-dir", default=None, help=f"where the runs and {report} go (default {run_dir}){reuse}")
    p.add_argument("--progress", action="store_true", help="show each run's progress bar (default off)")
    p.add_argument("--json", action="store_true", help=f"print {report}'s content instead of {shown} (the runs' "
                   "logs go to stderr)")


def add_budget_flags(p: argparse.ArgumentParser) -> None:
    """The flags every run of a sweep shares (`wai recipe`, `wai lags`): one budget, model and taskset."""
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: the taskset's "
                   "recommendation on a built-in model, else 40)")
    p.add_argument("--learning-rate", type=float, default=None, help="the policy's learning rate, the same for "
                   "every run (default: the loop's rule for the model, without any method's declared rate)")
    p.add_argument("--critic-learning-rate", type=float, default=None, help="the critic's rate for critic methods "
                   "(default: 1e-2 on a built-in model, else each method's own)")
    p.add_argument("--model", default="builtin:tiny", help="builtin:NAME or a local model directory "
                   "(default builtin:tiny)")
    p.add_argument("--taskset", default=None, help="the taskset to train on and evaluate on its test split "
                   "(default: the paper recipes' and the lag table's builtin:count; the controls' builtin:case)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where to train (default cpu)")
    p.add_argument("--lora-rank", type=int, default=0, help="0 trains every weight; > 0 LoRA adapters (default 0)")
    p.add_argument("--rollouts-per-step", type=int, default=32, help="trajectories per step (default 32)")
    p.add_argument("--eval-tasks", type=int, default=64, help="held-out tasks every run is scored on (default 64)")
    p.add_argument("--eval-samples", type=int, default=4, help="samples per held-out task (default 4)")
    p.add_argument("--max-tokens", type=int, default=None, help="generation cap per rollout, the same for every "
                   "run (default: the taskset's, else the method's)")


def budget(args: argparse.Namespace) -> dict[str, Any]:
    """``add_budget_flags``' values as ``wai.train`` settings (those left unset are left out)."""
    train = {"steps": args.steps, "learning_rate": args.learning_rate, "model": args.model,
             "taskset": args.taskset, "device": args.device, "lora_rank": args.lora_rank,
             "rollouts_per_step": args.rollouts_per_step, "eval_tasks": args.eval_tasks,
             "eval_samples": args.eval_samples, "max_tokens": args.max_tokens,
             "critic_learning_rate": args.critic_learning_rate}
    return {k: v for k, v in train.items() if v is not None}


def _shared(args: argparse.Namespace) -> dict[str, Any]:
    """A recipe's shared settings: the budget and the lag."""
    return {**budget(args), **({} if args.lag is None else {"lag": args.lag})}


def _list(args: argparse.Namespace, knobs: dict[str, Any]) -> int:
    """Each recipe's claim and its arms as they would run under these flags (NAME: that recipe only)."""
    from whileai.errors import ConfigError
    from whileai.evidence import RECIPES, recipe
    from whileai.evidence.runner import check_recipe, describe_arms

    if knobs and not args.name:
        raise ConfigError("--list with --set needs a recipe NAME: an arm's knobs are checked against its recipe, "
                          "e.g. wai recipe grpo_loss_types --list --set dr-grpo:max_tokens=8")
    if args.json:
        raise ConfigError("--json prints a finished run's recipe.json; --list prints the arms as text (drop one)")
    for item in [recipe(args.name)] if args.name else RECIPES.values():
        _, context, arms, warnings = check_recipe(item, knobs, seed=args.seed, **_shared(args))
        cap = context.max_tokens or "each method's max_tokens"
        print(f"{item.name}: {item.claim}\n  at lag {context.lag}, generation cap {cap}:")
        print("\n".join(describe_arms(arms) + warnings))
    return 0


def script_main(name: str, argv: list[str] | None = None) -> int:
    """What recipes/papers/NAME.py runs: ``wai recipe NAME`` with the script's own arguments."""
    from whileai.cli import main

    return main(["recipe", name, *(sys.argv[1:] if argv is None else argv)])
