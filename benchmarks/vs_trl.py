"""One GRPO step of whileai against one step of TRL's ``GRPOTrainer``, on the same model, same CPU, same run.

    pip install -e ".[bench]"                     # TRL (and datasets) for this benchmark only
    python benchmarks/vs_trl.py                   # builtin:small, 8 prompts x 8 samples x 32 tokens, 6 steps
    python benchmarks/vs_trl.py --steps 8 --threads 1 --json
    python benchmarks/vs_trl.py --device cuda --precision bf16 --model FOLDER --tokens 128   # on a GPU

Both sides start from the same weights: ``builtin:small`` (~25M parameters, seed 0) exported with
``TrainingEngine.export(path, merged=True)`` to a local Hugging Face directory, loaded by whileai's
``TrainingEngine(path)`` and by TRL (``GRPOTrainer(model=path)``), float32, full fine-tuning, AdamW at
the same learning rate (``--model FOLDER``: that folder, loaded by both; ``--device cuda --precision bf16``:
float32 weights under bfloat16 autocast on both sides). The same prompts (random lowercase strings of the byte tokenizer, one token per
character), k = 8 samples per prompt, temperature 1 with no top-k / top-p, the same length cap, both
stopping at the tokenizer's EOS as a real run does (the model is random, so EOS is about 1 in 259
tokens; the mean completion length of each side is printed), and the same reward (the share of vowels
in the completion's text).

- **whileai**: ``engine.sample`` (prompts x k) -> reward -> ``whileai.loop.step.policy_step(engine,
  GRPO(), rows, rescore=False)``: ``GRPO.update`` on the whole batch, one ``forward_backward`` with
  ``cross_entropy`` weighted by the coefficients, ``optim_step``. The scoring forward is skipped: at
  lag 0 the sampler's log-probabilities are the policy's (temperature 1, no truncation).
- **TRL**: ``GRPOTrainer`` with ``num_generations=8``, ``per_device_train_batch_size=64`` (8 prompts),
  ``beta=0`` (no reference model), ``num_iterations=1`` (so no separate old-policy forward either),
  generation by ``transformers``' ``generate``.

The two alternate step by step in one process: a TRL step, then (from TRL's ``on_step_end``
callback, outside TRL's timing) a whileai step, and so on; the first step of each is a warm-up. Each
side's phases are timed: generation (``engine.sample`` / the model's ``generate``), scoring (the rest of
TRL's ``_generate_and_score_completions``: rewards, advantages, tokenising; for whileai the reward and
the rows), and the update (the remainder of the step: loss, backward, optimizer). The compute floor of
a step is 2 N per sampled token plus 6 N per trained token (of our steps) at the float32 matmul peak
measured in the same run (N = parameters in matrix multiplies).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peak_memory  # noqa: E402
from train_step import matmul_parameters, matmul_peak  # noqa: E402

VOWELS = set("aeiou")


def vowel_share(text: str) -> float:
    return sum(ch in VOWELS for ch in text) / max(len(text), 1)


def make_prompts(count: int, length: int, seed: int = 0) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    letters = torch.randint(0, 26, (count, length), generator=generator).tolist()
    return ["".join(chr(ord("a") + c) for c in row) for row in letters]


class Timer:
    """Wraps a callable and adds the seconds spent inside it to ``seconds``."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


class Ours:
    """whileai's GRPO step on the engine's public operations (``policy_step`` from ``whileai.loop``)."""

    def __init__(self, path: str, args: argparse.Namespace, prompts: list[str]) -> None:
        import whileai as wai
        from whileai.engine import AdamParams, TrainingEngine

        autocast = "bfloat16" if args.precision == "bf16" else "off"
        self.engine = TrainingEngine(path, dtype="float32", autocast=autocast, device=args.device)
        self.method, self.args = wai.GRPO(), args
        self.adam = AdamParams(learning_rate=args.learning_rate)
        self.prompts = [self.engine.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        self.phases: list[dict[str, float]] = []
        self.trained_tokens: list[int] = []
        self.sampled_tokens: list[int] = []

    def step(self, index: int) -> None:
        from whileai.engine import SamplingParams
        from whileai.loop.step import policy_step

        peak_memory.reset(self.args.device)
        start = time.perf_counter()
        batch = self.prompts[(index * self.args.prompts) % len(self.prompts):][: self.args.prompts]
        params = SamplingParams(max_tokens=self.args.tokens, seed=index)
        samples = self.engine.sample(batch, self.args.k, params)
        generated = time.perf_counter()
        rows = [{"task_id": f"p{i}-{index}", "prompt_tokens": prompt, "tokens": s.tokens,
                 "behavior_logprobs": s.logprobs,
                 "reward": vowel_share(self.engine.tokenizer.decode(s.tokens, skip_special_tokens=True))}
                for i, (prompt, per_prompt) in enumerate(zip(batch, samples)) for s in per_prompt]
        scored = time.perf_counter()
        policy_step(self.engine, self.method, rows, adam=self.adam, rescore=False)
        _sync(self.args.device)
        done = time.perf_counter()
        self.phases.append({"generate": generated - start, "score": scored - generated, "update": done - scored,
                            "step": done - start, "peak_memory_gb": peak_memory.peak_gb(self.args.device)})
        self.trained_tokens.append(sum(len(r["prompt_tokens"]) + len(r["tokens"]) for r in rows))
        self.sampled_tokens.append(sum(len(r["tokens"]) for r in rows))


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def prompt_dataset(prompts: list[str]) -> Any:
    """The prompts as a ``datasets.Dataset`` with a fixed fingerprint: ``Dataset.from_dict`` hashes its input
    with dill, which failed on Python 3.12 with the GPU machine's pyarrow (reference/gpu.md)."""
    import pyarrow
    from datasets import Dataset
    from datasets.table import InMemoryTable

    return Dataset(InMemoryTable(pyarrow.table({"prompt": prompts})), fingerprint="whileai-vs-trl-prompts")


def trl_trainer(path: str, args: argparse.Namespace, prompts: list[str], out_dir: str, callback: Any) -> Any:
    from trl import GRPOConfig, GRPOTrainer

    def reward(completions: list[str], **kwargs: Any) -> list[float]:
        return [vowel_share(c) for c in completions]

    config = GRPOConfig(
        output_dir=out_dir, max_steps=args.steps, per_device_train_batch_size=args.prompts * args.k,
        num_generations=args.k, gradient_accumulation_steps=1, max_completion_length=args.tokens,
        learning_rate=args.learning_rate, beta=0.0, num_iterations=1, temperature=1.0, top_p=1.0, top_k=0,
        use_cpu=args.device == "cpu", bf16=args.precision == "bf16", fp16=False, report_to="none", logging_steps=1, save_strategy="no",
        seed=0, dataloader_num_workers=0, lr_scheduler_type="constant", warmup_steps=0,
    )
    dataset = prompt_dataset(prompts)
    return GRPOTrainer(model=path, reward_funcs=reward, args=config, train_dataset=dataset, callbacks=[callback])


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import TrainerCallback

    from whileai.engine import TrainingEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    workdir = tempfile.mkdtemp(prefix="whileai-vs-trl-")
    path = args.model if os.path.isdir(args.model) else TrainingEngine(
        args.model, dtype="float32", autocast="off").export(os.path.join(workdir, "model"), merged=True)
    peak_dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    prompts = make_prompts(args.prompts * (args.steps + 1), args.prompt_length)
    ours = Ours(path, args, prompts)
    trl_steps: list[dict[str, float]] = []
    trl_lengths: list[float] = []
    peaks: list[float] = []

    class Alternate(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            gen_timer.seconds = score_timer.seconds = 0.0
            peak_memory.reset(args.device)
            self.start = time.perf_counter()

        def on_log(self, *a: Any, logs: dict[str, Any] | None = None, **k: Any) -> None:
            if logs and "completions/mean_length" in logs:
                trl_lengths.append(float(logs["completions/mean_length"]))

        def on_step_end(self, *a: Any, **k: Any) -> None:
            _sync(args.device)
            step = time.perf_counter() - self.start
            generate = gen_timer.seconds
            score = score_timer.seconds - generate
            trl_steps.append({"generate": generate, "score": score, "update": step - score - generate, "step": step,
                              "peak_memory_gb": peak_memory.peak_gb(args.device)})
            peaks.append(matmul_peak(1024 if args.device == "cpu" else 8192, args.matmul_seconds, args.device,
                                     peak_dtype))
            ours.step(len(trl_steps))

    trainer = trl_trainer(path, args, prompts, os.path.join(workdir, "trl"), Alternate())
    model = trainer.model
    gen_timer = Timer(model.generate)
    model.generate = gen_timer
    score_timer = Timer(trainer._generate_and_score_completions)
    trainer._generate_and_score_completions = score_timer
    trainer.train()
    return summarise(args, ours, trl_steps, trl_lengths, peaks, matmul_parameters(ours.engine.model))


def summarise(args: argparse.Namespace, ours: Ours, trl_steps: list[dict[str, float]], trl_lengths: list[float],
              peaks: list[float], n_matmul: int) -> dict[str, Any]:
    sides = {"whileai": ours.phases[1:], "trl": trl_steps[1:]}  # the first step of each is a warm-up
    peak = statistics.median(peaks)
    sampled = statistics.median(ours.sampled_tokens[1:])  # the floor of our steps' work
    trained = statistics.median(ours.trained_tokens[1:])
    floors = {"generate": 2 * n_matmul * sampled / peak, "update": 6 * n_matmul * trained / peak}
    floor = floors["generate"] + floors["update"]
    out: dict[str, Any] = {"model": args.model, "prompts": args.prompts, "k": args.k, "tokens": args.tokens,
                           "prompt_length": args.prompt_length, "threads": torch.get_num_threads(),
                           "matmul_parameters": n_matmul, "peak_flops_median": peak, "floor_s": floor,
                           "floor_generate_s": floors["generate"], "floor_update_s": floors["update"],
                           "sampled_tokens": sampled, "trained_tokens": trained,
                           "whileai_mean_completion": statistics.mean(ours.sampled_tokens[1:]) / args.prompts / args.k,
                           "trl_mean_completion": statistics.mean(trl_lengths[1:]) if len(trl_lengths) > 1 else None,
                           "load_average_1min": os.getloadavg()[0]}
    for name, steps in sides.items():
        median = {phase: statistics.median(s[phase] for s in steps) for phase in ("generate", "score", "update", "step")}
        out[name] = {"steps": steps, "median": median,
                     "share": {p: median[p] / median["step"] for p in ("generate", "score", "update")},
                     "floor_share": floor / median["step"],
                     "phase_floor_share": {p: floors[p] / median[p] for p in floors}}
    out["ratio"] = out["whileai"]["median"]["step"] / out["trl"]["median"]["step"]
    out["update_ratio"] = out["whileai"]["median"]["update"] / out["trl"]["median"]["update"]
    out["device"] = args.device
    cuda = args.device == "cuda"  # per side on CUDA (the peak is reset before each side's step); on a CPU, the process's
    out["peak_memory_gb"] = {name: max(s["peak_memory_gb"] for s in steps) if cuda else None
                             for name, steps in sides.items()}
    out["peak_memory"] = (", ".join(f"{name} {gb:.2f} GB" for name, gb in out["peak_memory_gb"].items())
                          if cuda else peak_memory.describe(args.device))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin:small", help="the model both sides train (default builtin:small)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    parser.add_argument("--k", type=int, default=8, help="samples per prompt (default 8)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per completion (default 32)")
    parser.add_argument("--prompt-length", type=int, default=16, help="characters = tokens per prompt (default 16)")
    parser.add_argument("--steps", type=int, default=6, help="steps per side, the first a warm-up (default 6)")
    parser.add_argument("--learning-rate", type=float, default=1e-5, help="AdamW learning rate (default 1e-5)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default 0: torch's default)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["float32", "bf16"], default="float32",
                        help="bf16: float32 weights under bfloat16 autocast, both sides (default float32)")
    parser.add_argument("--matmul-seconds", type=float, default=0.5, help="seconds per peak measurement")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['model']} ({result['matmul_parameters']:,} matmul parameters), {args.prompts} prompts x k = "
          f"{args.k} x {args.tokens} tokens, prompts of {args.prompt_length} tokens, {result['threads']} threads, "
          f"{os.cpu_count()} cores, load average {result['load_average_1min']:.1f}")
    for name in ("whileai", "trl"):
        side = result[name]
        m, share = side["median"], side["share"]
        print(f"  {name:8s} step median {m['step']:.2f} s  (generate {m['generate']:.2f} s = {share['generate']:.0%}, "
              f"score {m['score']:.2f} s = {share['score']:.0%}, update {m['update']:.2f} s = {share['update']:.0%}); "
              f"steps: " + ", ".join(f"{s['step']:.2f}" for s in side["steps"]))
        print(f"           compute floor / measured: step {side['floor_share']:.3f}, generate "
              f"{side['phase_floor_share']['generate']:.3f}, update {side['phase_floor_share']['update']:.3f}")
    print(f"  mean completion length: whileai {result['whileai_mean_completion']:.1f}, TRL "
          f"{result['trl_mean_completion'] or float('nan'):.1f} tokens (both stop at the tokenizer's EOS)")
    print(f"  compute floor: {result['floor_generate_s']:.2f} s to sample {result['sampled_tokens']:.0f} tokens (2N each) + "
          f"{result['floor_update_s']:.2f} s to train {result['trained_tokens']:.0f} tokens (6N each) at the median "
          f"matmul peak of {result['peak_flops_median'] / 1e9:.1f} GFLOP/s")
    goal = 0.6 if args.device == "cuda" else 0.8
    print(f"  whileai / TRL time per step: {result['ratio']:.2f}x  (goal <= {goal}x: "
          f"{'met' if result['ratio'] <= goal else 'NOT met'}); update phase whileai / TRL: "
          f"{result['update_ratio']:.2f}x (goal <= 1.0x: {'met' if result['update_ratio'] <= 1.0 else 'NOT met'})"
          + f"; {'peak GPU memory (torch.cuda.max_memory_allocated) ' if args.device == 'cuda' else ''}"
          f"{result['peak_memory']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
