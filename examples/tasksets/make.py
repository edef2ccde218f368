"""Writes the three user tasksets of docs/tasksets.md ("Your own taskset"): run from the repository root,
`python examples/tasksets/make.py`; the output is fixed (seeded), so the files in git are what it writes."""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
LETTERS = "abcdefgh"


def parity(rng: random.Random) -> list[dict[str, str]]:
    """Is the 4-digit number even? y/n (the issue's task; a one-letter answer)."""
    return [{"prompt": f"{n}?", "answer": "y" if n % 2 == 0 else "n"} for n in rng.sample(range(1000, 10000), 1000)]


def upper(rng: random.Random) -> list[dict[str, str]]:
    """A 2-4 letter word over a-h, upper-cased: "bad>" -> "BAD"."""
    words: dict[str, None] = {}
    while len(words) < 1000:
        words["".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 4)))] = None
    return [{"prompt": f"{w}>", "answer": w.upper()} for w in words]


def successor(rng: random.Random) -> list[dict[str, str]]:
    """The next whole number: "47+1=" -> "48" (answers of 1 to 4 digits)."""
    return [{"prompt": f"{n}+1=", "answer": str(n + 1)} for n in rng.sample(range(0, 1000), 1000)]


def main() -> None:
    for make in (parity, upper, successor):
        rows = make(random.Random(0))
        (HERE / f"{make.__name__}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
