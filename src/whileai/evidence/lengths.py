"""The length of a recipe's wrong replies: what GRPO's length bias acts on, which pass@1 does not read.

    python -m whileai.evidence.lengths RUN_DIR      # RUN_DIR: a finished `wai recipe` folder (recipe.json)

Per run, the mean length in characters of its held-out replies that did not pass (reward below 1), after RL
(``heldout.jsonl``) and before it (``heldout-before.jsonl``); per recipe arm, its per-seed difference from the
baseline's run at the same seed, with the Student-t 95% interval over those differences (``mean_interval``,
as ``compare``'s seed-paired interval, bounded by the longest reply instead of by 1). Dr. GRPO (Liu et al. 2025) reports GRPO's per-sequence ``1/T`` weight lengthening wrong
replies against a constant normaliser; docs/evidence.md has the measured rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from whileai.errors import ConfigError
from whileai.loop.types import PASS
from whileai.rows.stats import mean_interval


def failed_length(path: Path) -> float:
    """Mean character length of the completions in a held-out file whose reward is below a pass (NaN if none)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lengths = [len(r["completion"]) for r in rows if float(r["reward"]) < PASS]
    return float(np.mean(lengths)) if lengths else float("nan")


def _longest(path: Path) -> int:
    return max((len(json.loads(line)["completion"]) for line in path.read_text().splitlines() if line.strip()),
               default=0)


def recipe_lengths(run_dir: str | Path) -> str:
    """The report: each arm's failed-reply length per seed (after RL; before RL for the baseline, whose warm
    start every arm shares), and each recipe arm's seed-paired difference from the baseline."""
    base = Path(run_dir)
    if not (base / "recipe.json").is_file():
        raise ConfigError(f"{base} holds no recipe.json; give the --run-dir of a finished `wai recipe`")
    runs: dict[str, list[str]] = json.loads((base / "recipe.json").read_text())["runs"]
    after = {label: np.array([failed_length(Path(r) / "heldout.jsonl") for r in dirs]) for label, dirs in runs.items()}
    first = next(iter(runs))
    before = np.array([failed_length(Path(r) / "heldout-before.jsonl") for r in runs[first]])
    longest = float(max(_longest(Path(r) / "heldout.jsonl") for dirs in runs.values() for r in dirs))
    lines = [f"mean length (characters) of held-out replies below a pass, per seed; {len(before)} seeds",
             f"  before RL: {before.mean():.3f} (" + " ".join(f"{x:.2f}" for x in before) + ")"]
    lines += [f"  {label}: {v.mean():.3f} (" + " ".join(f"{x:.2f}" for x in v) + ")" for label, v in after.items()]
    for label, v in list(after.items())[1:]:
        delta = v - after[first]
        low, high = mean_interval(delta, (-longest, longest))
        lines.append(f"  {label} minus {first}: {delta.mean():+.3f} [{low:+.3f}, {high:+.3f}] (95%, seeds paired)")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m whileai.evidence.lengths RUN_DIR")
    print(recipe_lengths(sys.argv[1]))
