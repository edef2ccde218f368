"""Run tinker-cookbook's own training loops, unmodified, against a Tinker-compatible server (`wai serve`).

Runs in the cookbook's venv (scripts/cookbook_venv.sh), never imports whileai. The server and the key come from
TINKER_BASE_URL / TINKER_API_KEY, as for any cookbook recipe.

    python cookbook_run.py sft --model DIR --log-path OUT [--steps 12]
    python cookbook_run.py rl  --model DIR --log-path OUT [--steps 10] [--seed 0]

``sft``: ``tinker_cookbook.supervised.train.main`` on a JSONL of conversations (renderer ``role_colon``,
``FromConversationFileBuilder``, an NLL evaluator on a held-out split, checkpoints on the way). Run again on the
same ``--log-path`` with more ``--steps``, it resumes from its last checkpoint (the cookbook's own resume).
``rl``: ``tinker_cookbook.rl.train.main`` with a ``ProblemEnv`` of ours, ``LetterEnv``: the reward is the share of
lowercase letters in the reply (dense, so a random-init model can climb it in a few steps). Both print one JSON line:
the per-step metrics the cookbook wrote to its ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
from functools import partial
from pathlib import Path
from typing import Any

import chz
from tinker_cookbook import renderers
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.types import RLDataset, RLDatasetBuilder
from tinker_cookbook.supervised import train as sft_train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tinker_cookbook.tokenizer_utils import get_tokenizer

RENDERER = "role_colon"


class LetterEnv(ProblemEnv):
    """Say something; the reward is the share of lowercase letters among the reply's characters."""

    def __init__(self, renderer: Any, word: str) -> None:
        super().__init__(renderer, format_coef=0.0)
        self.word = word

    def get_question(self) -> str:
        return f"Say {self.word}"

    def check_answer(self, sample_str: str) -> bool:
        return sum("a" <= c <= "z" for c in sample_str) / max(len(sample_str), 1)  # type: ignore[return-value]

    def check_format(self, sample_str: str) -> bool:
        return True

    def get_reference_answer(self) -> str:
        return "a" * len(self.word)


class LetterDataset(RLDataset):
    def __init__(self, renderer: Any, batches: int, groups: int, group_size: int, seed: int) -> None:
        rng = random.Random(seed)
        words = ["".join(rng.choice("bcdfg") for _ in range(3)) for _ in range(batches * groups)]
        self.batches = [[ProblemGroupBuilder(env_thunk=partial(LetterEnv, renderer, w), num_envs=group_size)
                         for w in words[b * groups:(b + 1) * groups]] for b in range(batches)]

    def get_batch(self, index: int) -> Any:
        return self.batches[index]

    def __len__(self) -> int:
        return len(self.batches)


@chz.chz
class LetterDatasetBuilder(RLDatasetBuilder):
    model_name: str
    batches: int
    groups: int = 4
    group_size: int = 8
    seed: int = 0

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        renderer = renderers.get_renderer(RENDERER, get_tokenizer(self.model_name))
        return LetterDataset(renderer, self.batches, self.groups, self.group_size, self.seed), None


def conversations(path: Path, count: int) -> None:
    """Pairs "Copy: X" -> "X" over short letter strings: a task whose NLL a tiny model lowers in a few steps."""
    rng = random.Random(0)
    with path.open("w") as out:
        for _ in range(count):
            word = "".join(rng.choice("abcd") for _ in range(4))
            out.write(json.dumps({"messages": [{"role": "user", "content": f"Copy: {word}"},
                                               {"role": "assistant", "content": word}]}) + "\n")


def run_sft(args: argparse.Namespace) -> None:
    data = Path(args.log_path) / "conversations.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    conversations(data, 16 * 24 + 32)  # the same file for every --steps, so a second run resumes the first
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=args.model, renderer_name=RENDERER,
                                            max_length=64, batch_size=16)
    config = sft_train.Config(
        log_path=str(Path(args.log_path) / "run"), model_name=args.model, recipe_name="whileai_cookbook_check",
        renderer_name=RENDERER, dataset_builder=FromConversationFileBuilder(
            file_path=str(data), test_size=32, common_config=common),
        learning_rate=args.learning_rate, lr_schedule="constant", lora_rank=8, eval_every=args.steps // 2,
        save_every=args.steps // 2, max_steps=args.steps)
    asyncio.run(sft_train.main(config))


def run_rl(args: argparse.Namespace) -> None:
    config = rl_train.Config(
        learning_rate=args.learning_rate, model_name=args.model, recipe_name="whileai_cookbook_check",
        dataset_builder=LetterDatasetBuilder(model_name=args.model, batches=args.steps, seed=args.seed),
        max_tokens=8, log_path=str(Path(args.log_path) / "run"), renderer_name=RENDERER, lora_rank=8,
        eval_every=0, save_every=args.steps // 2, max_steps=args.steps)
    asyncio.run(rl_train.main(config))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["sft", "rl"])
    parser.add_argument("--model", required=True, help="the model folder (the same path wai serve --model got)")
    parser.add_argument("--log-path", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rate", type=float, default=None)
    args = parser.parse_args()
    assert os.environ.get("TINKER_BASE_URL"), "set TINKER_BASE_URL to the server (and TINKER_API_KEY)"
    if args.learning_rate is None:
        args.learning_rate = 1e-2 if args.mode == "sft" else 2e-2
    (run_sft if args.mode == "sft" else run_rl)(args)
    lines = (Path(args.log_path) / "run" / "metrics.jsonl").read_text().splitlines()
    print(json.dumps([json.loads(line) for line in lines]))


if __name__ == "__main__":
    main()
