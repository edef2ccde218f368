"""Rung 1 of the recipes ladder: real RL on a real (tiny) transformers model, in one file, on a CPU.

    python recipes/rl_loop.py --method flash_reinforce --steps 40 --seed 0 --lag 2
    python recipes/rl_loop.py --method grpo --steps 40 --seed 0 --lag 2

The loop is the whole of RL post-training in miniature: sample from weights `lag` steps old (so the
sampler's log-probabilities differ from the learner's and the method's off-policy correction has work
to do), grade each completion with a program, hand the graded rows to the loop's one step, `whileai.loop.train_step(engine, method, ...)`,
repeat. The method object is the only thing that changes between runs: the loop reads its group size
and sampling temperature from `method.run_spec()` and never looks at its name.

The task ("match the case"): a prompt is BOS plus a few letters, all lower case or all upper case; the
reward is the share of the first `completion_len` completion tokens that are letters of the prompt's
case. A random-init model writes such a letter about 1 time in 10 (26 of 259 byte tokens), so the
reward starts near 0.1 and the pass rate (reward 1: every token right) near 0. See recipes/README.md.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import random
import sys
import textwrap
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import whileai as wai
from whileai.engine import AdamParams, SamplingParams, TrainingEngine
from whileai.loop import train_step

LOWER = "abcdefghijklmnopqrstuvwxyz"
UPPER = LOWER.upper()


@dataclass
class Config:
    method: str = "flash_reinforce"
    """registry name of the method (`wai.method_names()`); the one thing that differs between runs"""
    knobs: dict[str, Any] = field(default_factory=dict)
    """overrides of the method's knobs, e.g. {"trust": 0.05} (`--set trust=0.05`)"""
    steps: int = 40
    """optimizer steps (one batch of fresh rollouts each)"""
    seed: int = 0
    """seeds the model's initial weights, the prompts and the sampler"""
    lag: int = 2
    """sample from the weights of `lag` steps ago (0 = on-policy); the sampler keeps lag + 1 versions"""
    rollouts_per_step: int = 32
    """trajectories per step; prompts per step = rollouts_per_step // group size, so methods compare at equal cost"""
    model: str = "builtin:tiny"
    """engine model name: builtin:tiny (107k parameters) or builtin:mini (855k)"""
    lora_rank: int = 0
    """0 trains every weight; > 0 trains LoRA adapters of that rank"""
    learning_rate: float = 1e-2
    """AdamW learning rate (high on purpose: a random-init 107k-parameter model, tens of steps)"""
    critic_learning_rate: float = 1e-2
    """value head's learning rate; a critic is attached only when the method requires `values`"""
    prompt_len: int = 3
    """letters per prompt (after BOS)"""
    completion_len: int = 4
    """tokens sampled per completion; the reward is the share of them in the prompt's case"""
    eval_prompts: int = 32
    """held-out prompts (never trained on) for the pass-rate evaluation at the start and the end"""
    eval_samples: int = 4
    """sampled completions per held-out prompt (plus one greedy completion)"""


def check(cfg: Config) -> None:
    """Every bad setting at once, as one ConfigError."""
    least = {"steps": 1, "lag": 0, "rollouts_per_step": 1, "prompt_len": 1, "completion_len": 1,
             "eval_prompts": 2, "eval_samples": 1}
    bad = [f"{k}={getattr(cfg, k)} must be >= {v}" for k, v in least.items() if getattr(cfg, k) < v]
    bad += [f"{k}={getattr(cfg, k)} must be > 0" for k in ("learning_rate", "critic_learning_rate")
            if not getattr(cfg, k) > 0]
    if bad:
        raise wai.ConfigError("rl_loop: " + "; ".join(bad) + " (fix the flags; --help lists them)")


# ------------------------------------------------------------------ PLUMBING: the task
def make_prompt(rng: random.Random, tokenizer: Any, length: int) -> list[int]:
    """BOS + `length` letters, all of one case."""
    letters = rng.choice([LOWER, UPPER])
    return tokenizer.encode("".join(rng.choice(letters) for _ in range(length)))  # the tokenizer adds BOS


def grade(prompt: list[int], completion: list[int], tokenizer: Any, completion_len: int) -> float:
    """Share of the first `completion_len` completion tokens that are letters of the prompt's case.

    The program grader: case of the prompt's last letter decides the target set; an early EOS counts
    as a miss on every token it did not write.
    """
    last = tokenizer.decode([prompt[-1]])
    target = set(tokenizer.encode(LOWER if last in LOWER else UPPER, add_special_tokens=False))
    return sum(t in target for t in completion[:completion_len]) / completion_len


def split_prompts(cfg: Config, tokenizer: Any) -> tuple[random.Random, list[list[int]]]:
    """The random stream for training prompts, and the held-out prompts (drawn first from the same seed)."""
    rng = random.Random(cfg.seed)
    held_out: list[list[int]] = []
    while len(held_out) < cfg.eval_prompts:
        p = make_prompt(rng, tokenizer, cfg.prompt_len)
        if p not in held_out:
            held_out.append(p)
    return rng, held_out


def training_prompts(rng: random.Random, held_out: list[list[int]], n: int, cfg: Config,
                     tokenizer: Any) -> list[list[int]]:
    """`n` fresh training prompts, none of them a held-out one."""
    prompts: list[list[int]] = []
    while len(prompts) < n:
        p = make_prompt(rng, tokenizer, cfg.prompt_len)
        if p not in held_out:
            prompts.append(p)
    return prompts


def evaluate(engine: TrainingEngine, prompts: list[list[int]], cfg: Config, temperature: float) -> dict:
    """Greedy and sampled pass@1 on held-out prompts, with the library's task-clustered 95% interval."""
    out = {}
    for name, n, temp in (("greedy", 1, 0.0), ("sampled", cfg.eval_samples, temperature)):
        params = SamplingParams(max_tokens=cfg.completion_len, temperature=temp, seed=cfg.seed + 10_000)
        rows = [{"task_id": i, "reward": grade(p, s.tokens, engine.tokenizer, cfg.completion_len)}
                for i, (p, seqs) in enumerate(zip(prompts, engine.sample(prompts, n, params))) for s in seqs]
        result = wai.pass_at(rows, threshold=1.0)  # a pass: every token in the prompt's case (partial credit below)
        out[name] = {"pass_at_1": result.pass_at_1, "ci95": list(result.ci95),
                     "mean_reward": float(np.mean([r["reward"] for r in rows]))}
    return out


def build(cfg: Config) -> tuple[Any, TrainingEngine]:
    """The method object and an engine for it. The engine keeps a reference policy (a frozen copy, 107k
    parameters on tiny) so `--set beta=0.04` works; a critic is attached only if the method needs values."""
    method = wai.method(cfg.method, **cfg.knobs)
    engine = TrainingEngine(cfg.model, lora_rank=cfg.lora_rank, seed=cfg.seed, reference=True,
                            keep_sampler_versions=cfg.lag + 1)
    critic = method.run_spec().critic  # read from the method's run spec, not its name
    if critic is not None:
        engine.add_critic(cfg.critic_learning_rate, reward_range=critic.reward_range)
    return method, engine


# ------------------------------------------------------------------ the loop
def train(cfg: Config, log: Any = print) -> dict[str, Any]:
    """Run `cfg.steps` steps; returns per-step mean rewards, stats and the before/after evaluation."""
    check(cfg)
    start = time.perf_counter()
    method, engine = build(cfg)
    spec = method.run_spec()  # how the method must be run: group size, temperature, ...
    group, temperature = spec.rollouts_per_prompt, spec.temperature
    if cfg.rollouts_per_step < group:
        raise wai.ConfigError(f"rollouts_per_step={cfg.rollouts_per_step} is below the method's group size "
                              f"{group}; raise rollouts_per_step or set a smaller generations")
    rng, held_out = split_prompts(cfg, engine.tokenizer)
    history: dict[str, Any] = {"config": asdict(cfg), "method": repr(method), "group": group,
                               "eval_before": evaluate(engine, held_out, cfg, temperature),
                               "rewards": [], "stats": [], "notes": []}
    log(f"{method}\nbefore: {json.dumps(history['eval_before'])}")
    for step in range(cfg.steps):
        # ALGO LOGIC: sample from the weights of `lag` steps ago, keeping the sampler's logprobs
        engine.save_weights_for_sampler()  # version = engine.step
        version = max(0, engine.step - cfg.lag)
        prompts = training_prompts(rng, held_out, cfg.rollouts_per_step // group, cfg, engine.tokenizer)
        params = SamplingParams(max_tokens=cfg.completion_len, temperature=temperature,
                                seed=cfg.seed * 1_000_003 + step)
        samples = engine.sample(prompts, group, params, version=version)

        # ALGO LOGIC: grade with a program; a fixed-length answer that hits max_tokens is not "truncated"
        rows = [{"prompt_tokens": p, "tokens": s.tokens, "behavior_logprobs": s.logprobs, "task_id": i,
                 "reward": grade(p, s.tokens, engine.tokenizer, cfg.completion_len)}
                for i, (p, seqs) in enumerate(zip(prompts, samples)) for s in seqs]

        # ALGO LOGIC: the one step `wai train` runs: score (as the sampler drew), method.update, -sum c log p, Adam
        out = train_step(engine, method, rows, adam=AdamParams(learning_rate=cfg.learning_rate),
                         sampling_params={"temperature": temperature})

        # PLUMBING: logging
        reward = float(np.mean([r["reward"] for r in rows]))
        history["rewards"].append(reward)
        history["stats"].append(out.update.stats)
        history["notes"].append(out.update.notes)
        stats = " ".join(f"{k}={v:.3g}" for k, v in out.update.stats.items())
        log(f"step {step:3d}  sampler v{version:<3d} reward {reward:.3f}  {stats}"
            + "".join(f"\n    note: {n}" for n in out.update.notes))
    history["eval_after"] = evaluate(engine, held_out, cfg, temperature)
    history["seconds"] = time.perf_counter() - start
    log(f"after:  {json.dumps(history['eval_after'])}\nwall time {history['seconds']:.1f} s")
    return history


# ------------------------------------------------------------------ PLUMBING: command line
def field_docs(cls: type) -> dict[str, str]:
    """The string under each field of a dataclass (the one-line docs above), for --help."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
    return {a.target.id: b.value.value for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}


def parse_args(argv: list[str] | None = None) -> tuple[Config, bool]:
    docs, defaults = field_docs(Config), Config()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default=defaults.method, choices=wai.method_names(), help=docs["method"])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a method knob, e.g. --set trust=0.05 (the value is read as JSON when it parses)")
    for name, value in asdict(defaults).items():
        if name not in ("method", "knobs"):
            p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value, help=docs[name])
    p.add_argument("--json", action="store_true", help="print the whole history as one JSON object at the end")
    args = p.parse_args(argv)
    knobs: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--set {item!r}: expected KEY=VALUE, e.g. --set trust=0.05")
        try:
            knobs[key] = json.loads(value)
        except json.JSONDecodeError:
            knobs[key] = value
    fields = {k: v for k, v in vars(args).items() if k in Config.__dataclass_fields__}
    return Config(**fields, knobs=knobs), args.json


def main(argv: list[str] | None = None) -> int:
    cfg, as_json = parse_args(argv)
    try:
        history = train(cfg, log=(lambda *_: None) if as_json else print)
    except wai.WhileaiError as error:  # a bad flag or knob: say which, exit 2 like argparse
        print(f"rl_loop.py: error: {error}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(history))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
