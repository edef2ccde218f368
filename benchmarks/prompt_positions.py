"""What a long prompt costs an RL step with a real vocabulary: 512-token prompts against 16-token prompts.

    python benchmarks/prompt_positions.py                 # 16 rows x (512 or 16 prompt + 8 reply), 5 rounds
    python benchmarks/prompt_positions.py --rows 16 --repeats 7 --json

The model: a 2-layer Qwen2 body (width 64, MLP 128, 4 heads, 2 key/value heads) with the real Qwen2
vocabulary of 151,936 ids, random weights, random token ids (no tokenizer is needed), float32, full
fine-tuning, CPU. One RL step is what ``wai train`` runs with a scoring forward:
``whileai.loop.step.policy_step(engine, GRPO(), rows)``: score the replies (``forward``) -> ``GRPO.update``
-> ``forward_backward`` (cross-entropy weighted by the coefficients) -> ``optim_step``.

Arms, alternating in one process round by round (medians over rounds):

- **long**: prompts of 512 tokens, replies of 8;
- **short**: prompts of 16 tokens, replies of 8 (goal: long <= 1.5x short);
- **long, every position**: the long step with the engine's every-position outputs (``logprobs_for="every"``,
  Tinker's contract and the engine's default: every prompt position through the 151,936-wide output layer,
  twice a step), what the step cost before it asked for the replies only.

Peak memory of each arm: the process's resident high-water mark (VmHWM, reset through /proc/self/clear_refs
before the arm's step) minus its resident memory at the reset, Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import numpy as np
import torch

VOCAB = 151_936


def engine(seed: int = 0) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from whileai.engine import TrainingEngine
    from whileai.engine.models import LoadedModel, byte_tokenizer

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config)
    loaded = LoadedModel(model, byte_tokenizer(), "qwen2-2-layer-real-vocab", torch.device("cpu"),
                         torch.float32)
    return TrainingEngine(loaded)


def make_rows(count: int, prompt: int, reply: int, seed: int) -> list[dict[str, Any]]:
    generator = np.random.default_rng(seed)
    return [{"task_id": f"t{i // 4}", "prompt_tokens": generator.integers(3, VOCAB, prompt).tolist(),
             "tokens": generator.integers(3, VOCAB, reply).tolist(), "reward": float(generator.random() < 0.5),
             "behavior_logprobs": [-12.0] * reply} for i in range(count)]


def every_position(trainer: Any) -> Any:
    """The trainer with every forward returning (and projecting) every position, as before."""
    class Every:
        def __getattr__(self, name: str) -> Any:
            return getattr(trainer, name)

        def forward(self, *args: Any, logprobs_for: Any = None, **kwargs: Any) -> Any:
            return trainer.forward(*args, **kwargs)

        def forward_backward(self, *args: Any, logprobs_for: Any = None, **kwargs: Any) -> Any:
            return trainer.forward_backward(*args, **kwargs)

    return Every()


def _resident_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def step(trainer: Any, rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(seconds, peak MiB above the start) of one policy_step."""
    import whileai as wai
    from whileai.loop.step import policy_step

    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset VmHWM to the current resident size
    base = _resident_kb("VmRSS")
    start = time.perf_counter()
    policy_step(trainer, wai.GRPO(), rows, adam=wai.engine.AdamParams(learning_rate=1e-4))
    seconds = time.perf_counter() - start
    return seconds, (_resident_kb("VmHWM") - base) / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--long", type=int, default=512, help="tokens per long prompt (default 512)")
    parser.add_argument("--short", type=int, default=16, help="tokens per short prompt (default 16)")
    parser.add_argument("--reply", type=int, default=8, help="tokens per reply (default 8)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    trainer = engine()
    arms = {"long": (trainer, args.long), "short": (trainer, args.short),
            "long_every_position": (every_position(trainer), args.long)}
    print(f"{os.cpu_count()}-core CPU, {torch.get_num_threads()} threads, torch {torch.__version__}, 2-layer Qwen2 "
          f"body, vocabulary {VOCAB:,}, {args.rows} rows x (prompt + {args.reply}), load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    for t, prompt in arms.values():  # warm-up (AdamW's state, allocator)
        step(t, make_rows(args.rows, prompt, args.reply, 0))
    times: dict[str, list[float]] = {name: [] for name in arms}
    peaks: dict[str, list[float]] = {name: [] for name in arms}
    for round_index in range(args.repeats):
        order = list(arms) if round_index % 2 == 0 else list(arms)[::-1]
        for name in order:
            t, prompt = arms[name]
            seconds, peak = step(t, make_rows(args.rows, prompt, args.reply, round_index + 1))
            times[name].append(seconds)
            peaks[name].append(peak)
    result: dict[str, Any] = {"rows": args.rows, "reply": args.reply, "load_average_end": os.getloadavg()[0]}
    for name in arms:
        result[name] = {"seconds": times[name], "median_s": statistics.median(times[name]),
                        "peak_mib": max(peaks[name])}
        print(f"  {name:20s} median {result[name]['median_s']:.3f} s (rounds "
              f"{', '.join(f'{x:.2f}' for x in times[name])}), peak {result[name]['peak_mib']:.0f} MiB above the start")
    result["ratio_long_short"] = result["long"]["median_s"] / result["short"]["median_s"]
    result["ratio_every_short"] = result["long_every_position"]["median_s"] / result["short"]["median_s"]
    print(f"  long / short: {result['ratio_long_short']:.2f}x (goal <= 1.5x: "
          f"{'met' if result['ratio_long_short'] <= 1.5 else 'NOT met'}); every position / short: "
          f"{result['ratio_every_short']:.2f}x; load average at the end {result['load_average_end']:.1f}")
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
