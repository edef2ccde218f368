"""`wai recipe NAME`: a paper recipe, its baseline arm against the recipe arm on one budget over seeds.

Prints the lesson's table row per recipe arm (both arms' held-out pass@1, the paired delta with its 95%
interval, ``compare``'s verdict) and the drift each arm reached; writes RUN_DIR/recipe.json and recipe.txt.
``wai recipe --list`` names the recipes and their arms. See docs/evidence.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any


def register(subparsers: Any) -> None:
    from whileai.evidence import PAPERS

    p = subparsers.add_parser(
        "recipe", help="run a paper recipe: baseline arm against the recipe arm over seeds, with compare's verdict",
        description="Train the recipe's baseline arm and its recipe arm(s) at every seed on one budget (same model, "
                    "taskset, seeds, lag, steps and learning rate; only the method differs), then print held-out "
                    "pass@1 of each arm, the paired delta with its 95% interval and verdict, and the drift reached.")
    p.add_argument("name", nargs="?", metavar="NAME", help=f"the recipe: one of {', '.join(PAPERS)}")
    p.add_argument("--list", action="store_true", help="list the recipes, their claims and their arms")
    p.add_argument("--seeds", type=int, default=5, help="training seeds per arm (default 5; compare needs >= 2)")
    p.add_argument("--seed", type=int, default=0, help="the first seed; the arms run seeds SEED .. SEED+N-1 "
                   "(default 0)")
    p.add_argument("--lag", type=int, default=None, help="sampler lag in optimizer steps (default: the loop's, 2)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: the taskset's "
                   "recommendation on a built-in model, else 40)")
    p.add_argument("--learning-rate", type=float, default=None, help="the policy's learning rate, the same for "
                   "every arm (default: the loop's rule for the model, without any method's declared rate)")
    p.add_argument("--critic-learning-rate", type=float, default=None, help="the critic's rate for critic arms "
                   "(default: 1e-2 on a built-in model, else each method's own)")
    p.add_argument("--model", default="builtin:tiny", help="builtin:NAME or a local model directory "
                   "(default builtin:tiny)")
    p.add_argument("--taskset", default="builtin:case", help="the taskset to train on and evaluate on its test "
                   "split (default builtin:case)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where to train (default cpu)")
    p.add_argument("--lora-rank", type=int, default=0, help="0 trains every weight; > 0 LoRA adapters (default 0)")
    p.add_argument("--rollouts-per-step", type=int, default=32, help="trajectories per step (default 32)")
    p.add_argument("--eval-tasks", type=int, default=64, help="held-out tasks the arms are compared on (default 64)")
    p.add_argument("--eval-samples", type=int, default=4, help="samples per held-out task (default 4)")
    p.add_argument("--run-dir", default=None, help="where the runs and recipe.json go (default "
                   "runs/recipe-NAME-TIME)")
    p.add_argument("--progress", action="store_true", help="show each run's progress bar (default off)")
    p.add_argument("--json", action="store_true", help="print recipe.json's content instead of the report (the runs' logs go to stderr)")
    p.set_defaults(func=cmd_recipe)


def cmd_recipe(args: argparse.Namespace) -> int:
    from whileai.errors import ConfigError
    from whileai.evidence import PAPERS, recipe, run_recipe

    if args.list:
        for item in PAPERS.values():
            arms = item.arms(2)
            print(f"{item.name}: {item.claim}")
            print(f"  baseline: {arms[0].label} ({arms[0].method} {json.dumps(dict(arms[0].knobs))})")
            for arm in arms[1:]:
                print(f"  recipe arm: {arm.label} ({arm.method} {json.dumps(dict(arm.knobs))})")
        return 0
    if not args.name:
        raise ConfigError(f"give a recipe NAME, one of {', '.join(PAPERS)} (`wai recipe --list` shows their arms)")
    chosen = recipe(args.name)
    train: dict[str, Any] = {"lag": args.lag, "steps": args.steps, "learning_rate": args.learning_rate,
                             "model": args.model, "taskset": args.taskset, "device": args.device,
                             "lora_rank": args.lora_rank, "rollouts_per_step": args.rollouts_per_step,
                             "eval_tasks": args.eval_tasks, "eval_samples": args.eval_samples,
                             "run_dir": args.run_dir, "seed": args.seed}
    if args.critic_learning_rate is not None:
        train["critic_learning_rate"] = args.critic_learning_rate
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):  # --json: stdout is the JSON only
        result = run_recipe(chosen, seeds=args.seeds, progress=args.progress,
                            **{k: v for k, v in train.items() if v is not None})
    print(json.dumps(result.to_dict(), indent=2) if args.json else result)
    return 0


def script_main(name: str, argv: list[str] | None = None) -> int:
    """What recipes/papers/NAME.py runs: ``wai recipe NAME`` with the script's own arguments."""
    from whileai.cli import main

    return main(["recipe", name, *(sys.argv[1:] if argv is None else argv)])
