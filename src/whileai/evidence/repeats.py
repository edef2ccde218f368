"""A recipe run again on disjoint seeds: how often each verdict comes out (``wai recipe NAME --repeats R``).

    result = repeat_recipe(recipe("null"), repeats=20, seeds=5)
    print(result)      # each repeat's row, then per recipe arm the share of each verdict with its 95% interval

Repeat k trains seeds SEED + k*N .. SEED + k*N + N - 1 (N seeds per arm) in RUN_DIR/repeat-K/, so no run is
shared between repeats and the repeats are independent recipes. This is how the null control's false "shown"
rate and a positive control's power are measured on real runs.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whileai.errors import ConfigError
from whileai.evidence.plan import check_folder
from whileai.evidence.runner import RECIPE_SEEDS, Recipe, RecipeResult, run_recipe
from whileai.rows.stats import GAIN, LOSS, TABLE_HEADER, UNRESOLVED, format_table, wilson


@dataclass
class Repeats:
    """Every repeat's ``RecipeResult``, in order."""

    dir: Path
    recipe: str
    results: list[RecipeResult]
    seconds: float

    def verdicts(self) -> dict[str, Counter[str]]:
        """recipe arm label -> how many repeats gave each verdict."""
        out: dict[str, Counter[str]] = {}
        for result in self.results:
            for c in result.comparisons:
                out.setdefault(c.treatment_name, Counter())[c.verdict] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        n = len(self.results)
        return {"recipe": self.recipe, "repeats": n, "seconds": round(self.seconds, 1),
                "runs": [str(r.dir) for r in self.results],
                "verdicts": {arm: {v: counts[v] for v in (GAIN, LOSS, UNRESOLVED)}
                             for arm, counts in self.verdicts().items()},
                "rows": [[c.to_dict() for c in r.comparisons] for r in self.results], "report": str(self)}

    def __str__(self) -> str:
        n = len(self.results)
        first = self.results[0]
        lines = [f"recipe {self.recipe}: {n} repeats of {len(first.seeds)} seeds per arm on disjoint seeds; lag "
                 f"{first.settings['lag']}, {first.settings['steps']} steps, model {first.settings['model']}, "
                 f"taskset {first.settings['taskset']}",
                 format_table([("Repeat (seeds)", *TABLE_HEADER),
                               *((f"{k} ({r.seeds[0]}-{r.seeds[-1]})", *c.row())
                                 for k, r in enumerate(self.results) for c in r.comparisons)])]
        for arm, counts in self.verdicts().items():
            parts = []
            for verdict in (UNRESOLVED, GAIN, LOSS):
                lo, hi = wilson(counts[verdict] / n, n)
                parts.append(f"{verdict} {counts[verdict]} of {n} ({counts[verdict] / n:.0%} [{lo:.0%}, {hi:.0%}])")
            lines.append(f"{arm}: " + ", ".join(parts))
        lines.append(f"{self.seconds:.0f} s; runs and this report: {self.dir}")
        return "\n".join(lines)


def repeat_recipe(recipe: Recipe, repeats: int, *, seeds: int = RECIPE_SEEDS, seed: int = 0,
                  run_dir: str | None = None, **train: Any) -> Repeats:
    """``run_recipe`` ``repeats`` times on disjoint seeds (the module docstring); ``train`` as ``run_recipe``'s.
    Writes repeats.json and repeats.txt under ``run_dir``; a finished repeat is read back, as a recipe's runs are."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats={repeats!r} must be an integer >= 1 (how many times to run the recipe)")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ConfigError(f"seeds={seeds!r}: with repeats, give how many seeds per arm (an integer >= 1)")
    began = time.perf_counter()
    base = check_folder(Path(run_dir or f"runs/repeats-{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}"))
    results = [run_recipe(recipe, seeds=seeds, seed=seed + k * seeds, run_dir=str(base / f"repeat-{k}"), **train)
               for k in range(repeats)]
    out = Repeats(base, recipe.name, results, time.perf_counter() - began)
    (base / "repeats.json").write_text(json.dumps(out.to_dict(), indent=2) + "\n")
    (base / "repeats.txt").write_text(str(out) + "\n")
    return out
