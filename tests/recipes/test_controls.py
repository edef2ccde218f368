"""The controls: the null recipe's arms differ only in their seed, the positive controls in one knob; repeats run
on disjoint seeds and count each verdict."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import whileai as wai
from whileai.errors import ConfigError
from whileai.evidence import RECIPES, recipe
from whileai.evidence.controls import NO_BASELINE_DECAY, NULL_OFFSET
from whileai.evidence.repeats import Repeats, repeat_recipe
from whileai.evidence.runner import ArmContext, _paired, _same_arms
from whileai.rows.stats import Comparison


def test_null_arms_are_one_method_at_two_seeds():
    base, other = recipe("null").arms(ArmContext(2, 4))
    assert (base.method, dict(base.knobs)) == (other.method, dict(other.knobs))
    assert (base.seed_offset, other.seed_offset) == (0, NULL_OFFSET)
    assert _same_arms([base, other]) == []  # not "identical by construction": the seeds differ
    assert len(_same_arms([base, base])) == 1


def test_positive_controls_differ_in_one_knob():
    none, mean = recipe("baseline").arms(ArmContext(2, 4))
    assert (none.method, mean.method) == ("rae", "rae") and dict(none.knobs) == {"decay": NO_BASELINE_DECAY}
    assert wai.method("rae", decay=NO_BASELINE_DECAY) != wai.method("rae") and not mean.knobs
    unclipped, clipped = recipe("clip").arms(ArmContext(16, 4))
    assert wai.method(unclipped.method, **unclipped.knobs).clip == 1e300 and wai.method(clipped.method).clip == 0.2
    assert {"null", "baseline", "clip"} <= set(RECIPES)


def test_rows_pair_by_the_recipes_seed_whatever_the_arms_offset(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "heldout.jsonl").write_text(json.dumps({"task_id": "t0", "reward": 1.0}) + "\n")
    run = SimpleNamespace(dir=folder, config=SimpleNamespace(seed=1003))
    assert _paired([run], [3]) == [{"task_id": "t0", "reward": 1.0, "seed": "3"}]


def _comparison(verdict: str) -> Comparison:
    return Comparison("null", "a", "b", 0.5, 0.5, 0.0, (-0.1, 0.1), 0.1, 32, 0, 0, 5, 5, verdict, "why",
                      seed_delta=0.0, seed_ci95=(-0.1, 0.1), paired_seeds=5)


def test_repeats_count_each_verdict_with_its_interval(tmp_path):
    """19 of 20 unresolved: 95%, Wilson [76%, 99%]; 1 gain shown: 5% [1%, 24%]."""
    results = [SimpleNamespace(seeds=tuple(range(5 * k, 5 * k + 5)), comparisons=[_comparison(v)], dir=tmp_path / f"r{k}",
                               settings={"lag": 2, "steps": 10, "model": "builtin:tiny", "taskset": "builtin:case"})
               for k, v in enumerate(["unresolved"] * 19 + ["gain shown"])]
    out = Repeats(Path(tmp_path), "null", results, 1.0)  # type: ignore[arg-type]
    assert out.verdicts()["b"] == {"unresolved": 19, "gain shown": 1}
    text = str(out)
    assert "b: unresolved 19 of 20 (95% [76%, 99%]), gain shown 1 of 20 (5% [1%, 24%]), loss shown 0 of 20" in text
    assert "19 (95-99)" in text and "20 repeats of 5 seeds" in text
    assert out.to_dict()["verdicts"]["b"] == {"gain shown": 1, "loss shown": 0, "unresolved": 19}


@pytest.mark.parametrize("bad,match", [({"repeats": 0}, "repeats=0 must be an integer >= 1"),
                                       ({"repeats": 2, "seeds": [0, 1]}, "give how many seeds per arm")])
def test_bad_repeats_are_refused(bad, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        repeat_recipe(recipe("null"), **{"run_dir": str(tmp_path / "r"), **bad})


@pytest.mark.slow
def test_null_recipe_trains_the_offset_seeds_and_pairs_them_with_the_baselines(tmp_path):
    """2 seeds x 2 arms on the tiny budget: the recipe arm's runs are seeds 1000 and 1001, its rows pair with
    the baseline's seeds 0 and 1, and the seed-paired delta is the difference of the runs' pass@1."""
    result = repeat_recipe(recipe("null"), 1, seeds=2, run_dir=str(tmp_path / "r"), steps=4, eval_tasks=8,
                           eval_samples=2, rollouts_per_step=16)
    (one,) = result.results
    assert [run.config.seed for run in one.runs["FlashReinforce, another seed"]] == [1000, 1001]
    c = one.comparisons[0]
    deltas = [t - b for t, b in zip(one.scores("FlashReinforce, another seed"), one.scores("FlashReinforce"))]
    assert c.paired_seeds == 2 and c.seed_delta == pytest.approx(sum(deltas) / 2)
    assert (tmp_path / "r" / "repeat-0" / "flashreinforce--another-seed-seed1001" / "heldout.jsonl").is_file()
    assert json.loads((tmp_path / "r" / "repeats.json").read_text())["repeats"] == 1
