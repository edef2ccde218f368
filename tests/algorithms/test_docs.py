"""docs/algorithms.md cannot drift: its table has every algorithm with the loss its module sends. (Its
rl_loop / `wai loop --algorithm` examples went with algorithms/loops.py: `wai train --url` runs every method.)"""

from __future__ import annotations

from pathlib import Path

from whileai.algorithms import ALGORITHMS

DOC = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"
TEXT = DOC.read_text(encoding="utf-8")


def test_table_lists_every_algorithm_with_its_loss():
    for name, algo in ALGORITHMS.items():
        row = next((line for line in TEXT.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"docs/algorithms.md has no row for {name}"
        assert row.split("|")[2].strip() == f"`{algo.loss}`", (name, row)
