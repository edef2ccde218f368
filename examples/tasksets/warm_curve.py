"""The warm start's learning curve on a taskset, step by step, exactly as `wai train` runs it (same engine seed,
same task order, same loss): the per-token loss, the pass estimate exp(-loss x answer tokens) that the previous
rule stopped at (0.7 over 20 steps, at 1e-2; the loop's warm start now measures a held-out slice instead:
whileai.loop.plan.rules.warm_start_stop), and every `--every` steps the sampled pass rate on 64 train tasks, to
check the estimate against. docs/tasksets.md ("Your own taskset", the previous rule) quotes its output.

    python examples/tasksets/warm_curve.py examples/tasksets/parity.jsonl --steps 2000 --seed 0
"""

from __future__ import annotations

import argparse
import json
import math

from whileai.engine import TrainingEngine
from whileai.engine.datums import make_datum
from whileai.envs import load_taskset, render_prompt
from whileai.envs.episode import reference_episode
from whileai.loop.sources.rollouts import Sampling, rollouts, step_tasks

PREVIOUS_RATE, PREVIOUS_TARGET, WINDOW, MIN_STEPS = 1e-2, 0.7, 20, 60  # the previous rule's constants


def warm_start_reached(losses: list[float], tokens: list[float]) -> bool:
    """The previous rule: the pass estimate over the last 20 steps reached 0.7, at least 60 steps in."""
    if len(losses) < MIN_STEPS:
        return False
    return math.exp(-sum(losses[-WINDOW:]) / WINDOW * sum(tokens[-WINDOW:]) / WINDOW) >= PREVIOUS_TARGET


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("taskset")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--stop", action="store_true", help="stop where warm_start_reached first says so")
    args = parser.parse_args()
    taskset = load_taskset(args.taskset)
    engine = TrainingEngine("builtin:tiny", seed=args.seed, keep_sampler_versions=1)
    train = taskset.split("train")
    probe = train[:64]
    sampling = Sampling(1.0, args.max_tokens, cap_is_answer_length=False)
    losses: list[float] = []
    tokens: list[float] = []
    reached = None
    for k in range(args.steps):
        tasks = step_tasks(train, min(16, len(train)), args.seed, 10_000_000 + k)
        data = [(render_prompt(engine.tokenizer, t), *reference_episode(taskset, t, engine.tokenizer)) for t in tasks]
        count = sum(sum(mask) for _, _, mask in data)
        out = engine.forward_backward([make_datum(p, a, weights=[float(m) / count for m in mask])
                                       for p, a, mask in data], "cross_entropy")
        engine.optim_step({"learning_rate": PREVIOUS_RATE})
        losses.append(float(out.metrics["loss:sum"]))
        tokens.append(count / len(data))
        if reached is None and warm_start_reached(losses, tokens):
            reached = k + 1
            if args.stop:
                break
        if (k + 1) % args.every == 0:
            rows = rollouts(engine, taskset, probe, [render_prompt(engine.tokenizer, t) for t in probe],
                            [1] * len(probe), sampling, seed=k, sampler_step=k)
            passed = sum(r["reward"] >= 1.0 for r in rows) / len(rows)
            window = losses[-20:]
            estimate = math.exp(-sum(window) / len(window) * sum(tokens[-20:]) / len(window))
            print(json.dumps({"step": k + 1, "loss": round(sum(window) / len(window), 4),
                              "estimate": round(estimate, 3), "sampled_pass": round(passed, 3),
                              "reached_at": reached}), flush=True)
    print(json.dumps({"steps": args.steps, "first_loss": round(losses[0], 3), "last_loss": round(losses[-1], 3),
                      "reached_at": reached}), flush=True)


if __name__ == "__main__":
    main()
