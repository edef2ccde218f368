"""The paper recipes: each baseline is its method with the correction off; the table row is `compare`'s
arithmetic on every seed's held-out rows; identical arms give a delta of exactly 0; the drift reported is the
runs' recorded metrics (the methods' Update stats).

The fast tests need no model; the ones marked slow train builtin:tiny (2 seeds x 2 arms, 4 steps, 8 held-out
tasks x 2 samples: about 20 s on the 2-core machine).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import whileai as wai
from whileai.cli import main
from whileai.errors import ConfigError
from whileai.evidence import PAPERS, Arm, Recipe, drift_reached, recipe, run_recipe
from whileai.evidence.papers import NEVER
from whileai.evidence.runner import ArmContext, _resolved, recipe_arms, with_knobs

# a tiny budget on the loop's defaults (builtin:case, lag 2: 14 warm-up steps), not the paper recipes' REGIME
TINY = {"steps": 4, "eval_tasks": 8, "eval_samples": 2, "rollouts_per_step": 16, "taskset": "builtin:case", "lag": 2}

# a stale batch: row 1's first token moved from p = 0.5 under the sampler to 0.05 under the policy
STALE = [
    {"reward": 1.0, "logprobs": [math.log(0.5), math.log(0.5)], "behavior_logprobs": [math.log(0.5), math.log(0.5)],
     "values": [0.5, 0.5]},
    {"reward": 0.0, "logprobs": [math.log(0.05), math.log(0.5)], "behavior_logprobs": [math.log(0.5), math.log(0.5)],
     "values": [0.5, 0.5]},
]


def method_of(arm: Arm):
    return wai.method(arm.method, **arm.knobs)


def at(lag: int, max_tokens: int | None = 4) -> ArmContext:
    return ArmContext(lag, max_tokens)


# ----------------------------------------------------------------------------- the arms, no model needed
def test_every_recipe_has_a_baseline_and_at_least_one_recipe_arm_with_distinct_labels():
    for name, item in PAPERS.items():
        arms = item.arms(at(4))
        assert len(arms) >= 2, name
        assert len({a.label for a in arms}) == len(arms), name
        for arm in arms:
            method_of(arm)  # every arm builds


def test_flash_reinforce_baseline_is_the_same_estimator_with_the_gate_off():
    """Row 1's mean Bernoulli KL is (0.5 ln(0.5/0.05) + 0.5 ln(0.5/0.95)) / 2 = (1.1513 - 0.3209) / 2 = 0.415,
    over trust 0.003: the recipe arm drops it, the baseline keeps it; where both admit, c is the same."""
    baseline, flash = (method_of(a) for a in recipe("flash_reinforce").arms(at(2)))
    gated, open_ = flash.update(STALE), baseline.update(STALE)
    assert gated.admitted.tolist() == [True, False] and open_.admitted.tolist() == [True, True]
    assert gated.stats["mean_sequence_kl"] == pytest.approx((0.5 * math.log(10) + 0.5 * math.log(0.5 / 0.95)) / 4)
    np.testing.assert_array_equal(gated.coefficients[0], open_.coefficients[0])
    # c = A rho / (T B) on the kept row: A = 0 - 0.5, rho = (0.1, 1), T = 2, B = 2
    np.testing.assert_allclose(open_.coefficients[1], [-0.5 * 0.1 / 4, -0.5 / 4])


def test_flash_reinforce_arms_follow_a_lag_past_the_default_bound():
    assert all(method_of(a).off_policy_steps == 16 for a in recipe("flash_reinforce").arms(at(16)))
    assert all(method_of(a).off_policy_steps == 8 for a in recipe("flash_reinforce").arms(at(2)))


def test_sao_baseline_never_masks_and_otherwise_equals_sao():
    """Row 1's first token has ratio 0.1, below SAO's band (0.7, 6.0): SAO masks it, the baseline does not; every
    other token's c is the same in both."""
    baseline, sao = (method_of(a) for a in recipe("sao").arms(at(2)))
    masked, kept = sao.update(STALE), baseline.update(STALE)
    assert masked.stats["masked_token_share"] == 0.25 and kept.stats["masked_token_share"] == 0.0
    assert masked.coefficients[1][0] == 0.0 and kept.coefficients[1][0] != 0.0
    np.testing.assert_array_equal(masked.coefficients[0], kept.coefficients[0])
    assert masked.coefficients[1][1] == kept.coefficients[1][1]


def test_bpco_baseline_shares_bpcos_critic_schedule():
    baseline, bpco = (method_of(a) for a in recipe("bpco").arms(at(2)))
    assert baseline.name == "sao" and bpco.name == "bpco"
    assert baseline.ratio == (0.8, 1.2) and baseline.gae_alpha == bpco.gae_alpha
    assert baseline.run_spec().critic.warmup == bpco.run_spec().critic.warmup
    assert baseline.run_spec().critic.steps == bpco.run_spec().critic.steps
    assert baseline.run_spec().critic.learning_rate == bpco.run_spec().critic.learning_rate


def test_grpo_recipe_differs_only_in_loss_type():
    arms = [method_of(a) for a in recipe("grpo_loss_types").arms(at(2))]
    assert [m.loss_type for m in arms] == ["grpo", "bnpo", "dr_grpo"]
    assert {m.replace(loss_type="grpo") == arms[0] for m in arms} == {True}


@pytest.mark.parametrize("train,cap", [({}, 4), ({"taskset_options": {"completion_len": 6}}, 6),
                                       ({"taskset": "builtin:add"}, 3), ({"max_tokens": 7}, 7)])
def test_dr_grpo_divides_by_the_runs_generation_cap(train, cap):
    """The cap the loop samples to (the config's max_tokens, else the taskset's: builtin:case's completion_len,
    4 by default; builtin:add's digits + 1 = 3) is dr_grpo's L_max; no arm keeps the method's 1024."""
    from whileai.envs import load_taskset

    shared, context = _resolved(recipe("grpo_loss_types"), {"taskset": "builtin:case", **train})
    if "max_tokens" not in train:
        assert load_taskset(shared["taskset"], **shared.get("taskset_options", {})).max_tokens == cap
    assert context.max_tokens == cap
    assert shared.get("max_tokens") == train.get("max_tokens")  # the arms' runs sample as the loop would anyway
    arms = [method_of(a) for a in recipe_arms(recipe("grpo_loss_types"), context, {})]
    assert [m.max_tokens for m in arms] == [cap, cap, cap]


def test_dr_grpo_weight_at_the_cap_equals_grpos_on_replies_at_the_cap():
    """Two groups of two 4-token replies, rewards (1, 0) each: mean 0.5 per group. dr_grpo's weight with L_max = 4
    is 1/(B 4) = grpo's 1/(B T_i), so the only difference left is grpo's division by the group's std: for every
    token, c_grpo = c_dr / (std + eps), the same factor everywhere. With the method's 1024 the dr_grpo c would be
    256 times smaller."""
    lp = [math.log(0.5)] * 4
    batch = [{"reward": r, "task_id": t, "logprobs": lp, "behavior_logprobs": lp} for t in "ab" for r in (1.0, 0.0)]
    grpo, _, dr = (method_of(a).update(batch).coefficients for a in recipe("grpo_loss_types").arms(at(2)))
    ratio = np.concatenate(grpo) / np.concatenate(dr)
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-12)
    np.testing.assert_allclose(np.concatenate(dr), np.repeat([0.5, -0.5, 0.5, -0.5], 4) / (4 * 4), rtol=1e-12)
    wide = wai.method("grpo", loss_type="dr_grpo").update(batch).coefficients
    np.testing.assert_allclose(np.concatenate(wide) * 256, np.concatenate(dr), rtol=1e-12)


def test_without_a_cap_every_arm_keeps_the_methods_own_which_is_also_what_it_samples_to():
    arms = [method_of(a) for a in recipe("grpo_loss_types").arms(at(2, None))]
    assert [m.max_tokens for m in arms] == [1024] * 3 == [m.run_spec().max_tokens for m in arms]


# ----------------------------------------------------------------------------- --set: per-arm knobs
def test_a_knob_reaches_only_the_arms_it_targets():
    """flash_reinforce's arms: the baseline (trust 1e300) and the recipe arm (trust 0.003 by default)."""
    flash = recipe("flash_reinforce")
    baseline, gated = (method_of(a) for a in recipe_arms(flash, at(4), {"recipe:trust": 0.01}))
    assert (baseline.trust, gated.trust) == (NEVER, 0.01)
    baseline, gated = (method_of(a) for a in recipe_arms(flash, at(4), {"stale-reinforce--gate-off:trust": 0.5}))
    assert (baseline.trust, gated.trust) == (0.5, 0.003)
    baseline, gated = (method_of(a) for a in recipe_arms(flash, at(4), {"off_policy_steps": 12}))
    assert (baseline.off_policy_steps, gated.off_policy_steps, baseline.trust) == (12, 12, NEVER)
    grpo, bnpo, dr = recipe_arms(recipe("grpo_loss_types"), at(4), {"dr-grpo:max_tokens": 64, "recipe:beta": 0.1})
    assert [method_of(a).max_tokens for a in (grpo, bnpo, dr)] == [4, 4, 64]  # the user's value wins over the cap
    assert [method_of(a).beta for a in (grpo, bnpo, dr)] == [0.0, 0.1, 0.1]


def test_the_most_specific_target_wins_whatever_the_order():
    arms = recipe("flash_reinforce").arms(at(2))
    for knobs in ({"trust": 0.1, "recipe:trust": 0.2, "flashreinforce:trust": 0.3},
                  {"flashreinforce:trust": 0.3, "recipe:trust": 0.2, "trust": 0.1}):
        assert [a.knobs["trust"] for a in with_knobs(arms, knobs)] == [0.1, 0.3]
    assert [a.knobs["trust"] for a in with_knobs(arms, {"baseline:trust": 0.2, "trust": 0.1})] == [0.2, 0.1]


@pytest.mark.parametrize("knobs,match", [
    ({"nope:trust": 1.0}, "no arm 'nope' in recipe flash_reinforce; ARM is one of baseline, recipe, "
                          "stale-reinforce--gate-off, flashreinforce"),
    ({"recipe:ratio": [0.5, 2.0]}, "arm 'flashreinforce' \\(FlashReinforce\\) of recipe flash_reinforce: flash_reinforce "
                                   "has no knob 'ratio'; its knobs are trust, off_policy_steps"),
    ({"baseline:trust": -1.0}, "arm 'stale-reinforce--gate-off'.*trust"),
    ({"recipe:": 1.0}, "no knob name after the arm"),
    ({"recipe": {"trust": 0.01}}, "knobs\\['recipe'\\] is a mapping; knobs are flat: write \\{'recipe:KEY': value\\}"),
    (["trust"], "give a mapping of '\\[ARM:\\]KEY' strings"),
])
def test_a_bad_arm_or_knob_is_refused_before_training(knobs, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        run_recipe(recipe("flash_reinforce"), seeds=2, knobs=knobs, run_dir=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()


def test_arms_made_identical_by_a_knob_are_warned_about_not_refused():
    from whileai.evidence.runner import _same_arms

    arms = recipe_arms(recipe("sao"), at(2), {"baseline:ratio": [0.7, 6.0]})  # SAO's own band on the baseline
    (line,) = _same_arms(arms)
    assert line.startswith("warning: arms 'same critic, ratio never masked' and 'SAO' run the same method")
    assert _same_arms(recipe("sao").arms(at(2))) == []


def test_cli_list_shows_each_arms_knobs_after_set(capsys):
    """builtin:count's cap is max_len + 3 = 8 (the regime's taskset); --set moves dr_grpo's to 12."""
    assert main(["recipe", "grpo_loss_types", "--list", "--set", "dr-grpo:max_tokens=12", "--set", "recipe:beta=0.1",
                 "--lag", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == ["  at lag 3, generation cap 8:",
                       '  baseline: grpo [grpo] (grpo {"loss_type": "grpo", "max_tokens": 8})',
                       '  recipe arm: bnpo [bnpo] (grpo {"loss_type": "bnpo", "max_tokens": 8, "beta": 0.1})',
                       '  recipe arm: dr_grpo [dr-grpo] (grpo {"loss_type": "dr_grpo", "max_tokens": 12, "beta": 0.1})']


@pytest.mark.parametrize("name", [*PAPERS])
def test_paper_recipes_default_to_the_regime_and_flags_override_it(name):
    """Unless told otherwise a paper recipe runs builtin:count at lag 16 at the taskset's declared settings on a
    built-in model (60 warm-up steps, RL at 1e-3); --taskset and --lag win; the controls keep the loop's
    defaults (builtin:case, lag 2, 1e-2), where their rows were measured."""
    from whileai.evidence.papers import REGIME

    assert REGIME == {"taskset": "builtin:count", "lag": 16}
    shared, context = _resolved(recipe(name), {})
    assert (shared["taskset"], shared["lag"], context.lag, context.max_tokens) == ("builtin:count", 16, 16, 8)
    assert (shared["warm_start_steps"], shared["learning_rate"]) == (60, 1e-3)
    shared, context = _resolved(recipe(name), {"taskset": "builtin:case", "lag": 4})
    assert (shared["taskset"], context.lag, context.max_tokens, shared["learning_rate"]) == ("builtin:case", 4, 4, 1e-2)
    for control in ("null", "baseline", "clip"):
        shared, context = _resolved(recipe(control), {})
        assert (shared["taskset"], context.lag, shared["learning_rate"]) == ("builtin:case", 2, 1e-2)


def test_cli_refuses_set_on_a_missing_arm_and_list_set_without_a_name(capsys):
    assert main(["recipe", "sao", "--set", "dr-grpo:max_tokens=8", "--run-dir", "/nonexistent/never"]) == 2
    assert "no arm 'dr-grpo' in recipe sao; ARM is one of baseline, recipe, same-critic" in capsys.readouterr().err
    assert main(["recipe", "--list", "--set", "trust=1"]) == 2
    assert "--list with --set needs a recipe NAME" in capsys.readouterr().err
    assert main(["recipe", "sao", "--set", "ratio"]) == 2
    assert "--set 'ratio': expected KEY=VALUE" in capsys.readouterr().err


def test_never_is_beyond_any_drift():
    assert NEVER > 1e299 and math.isfinite(NEVER)


# ----------------------------------------------------------------------------- refusals, no model needed
def test_unknown_recipe_lists_the_names():
    with pytest.raises(ConfigError, match="flash_reinforce, sao, bpco, grpo_loss_types"):
        recipe("flash")


@pytest.mark.parametrize("bad,match", [({"method": "grpo"}, "method"), ({"eval_tasks": 0}, "eval_tasks"),
                                       ({"resume": "runs/x"}, "resume")])
def test_bad_settings_are_refused_before_training(bad, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        run_recipe(recipe("flash_reinforce"), seeds=2, run_dir=str(tmp_path / "r"), **bad)
    assert not (tmp_path / "r").exists()


def test_zero_seeds_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="seeds"):
        run_recipe(recipe("flash_reinforce"), seeds=0, run_dir=str(tmp_path / "r"))


def test_a_bad_knob_in_an_arm_is_refused_before_training(tmp_path):
    bad = Recipe("bad", "a knob out of range", lambda run: (Arm("a", "flash_reinforce"),
                                                            Arm("b", "flash_reinforce", {"trust": -1.0})))
    with pytest.raises(ConfigError, match="trust"):
        run_recipe(bad, seeds=2, run_dir=str(tmp_path / "r"))
    assert not list((tmp_path / "r").glob("*/metrics.jsonl"))


def test_cli_refuses_an_unknown_recipe(capsys):
    assert main(["recipe", "nope"]) == 2
    assert "unknown recipe 'nope'; the recipes are flash_reinforce" in capsys.readouterr().err


def test_every_recipe_has_its_script_and_a_readme_row():
    """recipes/papers/NAME.py runs `wai recipe NAME`; the README names every recipe."""
    folder = Path(__file__).resolve().parents[2] / "recipes" / "papers"
    readme = (folder / "README.md").read_text()
    for name in PAPERS:
        source = (folder / f"{name}.py").read_text()
        assert f'script_main("{name}")' in source, name
        assert f"| `{name}` |" in readme, name
    assert sorted(p.stem for p in folder.glob("*.py")) == sorted([*PAPERS, "lag_table"])  # + `wai lags`


def test_script_main_passes_its_arguments_to_wai_recipe(capsys):
    from whileai.cli.recipe_cmd import script_main

    assert script_main("sao", ["--seeds", "0"]) == 2
    assert "seeds=0: need at least one seed" in capsys.readouterr().err


# ----------------------------------------------------------------------------- drift, hand-worked
def test_drift_reached_pools_policy_steps_of_every_run():
    """Run a: a warm-up step (left out) and steps with drift 0.1, 0.3; run b: drift 0.2. Mean 0.2, max 0.3;
    admitted 1, 0.5, 0.75 -> 0.75; masked share only where recorded: (0.1 + 0.3) / 2."""
    a = [{"policy_trained": False, "drift": 9.0, "admitted_share": 0.0, "mean_ratio": 5.0},
         {"policy_trained": True, "drift": 0.1, "admitted_share": 1.0, "mean_ratio": 1.0,
          "method/masked_token_share": 0.1},
         {"policy_trained": True, "drift": 0.3, "admitted_share": 0.5, "mean_ratio": 1.2,
          "method/masked_token_share": 0.3}]
    b = [{"policy_trained": True, "drift": 0.2, "admitted_share": 0.75, "mean_ratio": 0.8}]
    runs = [SimpleNamespace(metrics=lambda rows=rows: rows) for rows in (a, b)]
    assert drift_reached(runs) == pytest.approx({"drift": 0.2, "drift max": 0.3, "mean ratio": 1.0,
                                                 "admitted share": 0.75, "tokens masked": 0.2})


# ----------------------------------------------------------------------------- real runs on builtin:tiny
@pytest.fixture(scope="module")
def flash_result(tmp_path_factory):
    return run_recipe(recipe("flash_reinforce"), seeds=2, run_dir=str(tmp_path_factory.mktemp("flash") / "r"), **TINY)


def held_out(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "heldout.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_table_row_is_compare_on_every_seeds_held_out_rows(flash_result):
    """Read each run's heldout.jsonl again, tag it by seed, and compare; then the delta by hand: the mean over
    tasks of (recipe arm's pass share - baseline's), each task's share pooled over seeds and samples."""
    (row,) = flash_result.comparisons
    base_dirs, arm_dirs = (sorted(flash_result.dir.glob(f"{p}-seed*")) for p in ("stale-reinforce--gate-off",
                                                                                 "flashreinforce"))
    assert len(base_dirs) == len(arm_dirs) == 2

    def pooled(dirs):
        return [{**r, "seed": d.name.rsplit("seed", 1)[1]} for d in dirs for r in held_out(d)]

    again = wai.compare(pooled(base_dirs), pooled(arm_dirs), threshold=1.0)
    assert (row.baseline, row.treatment, row.delta, row.ci95, row.verdict) == \
        (again.baseline, again.treatment, again.delta, again.ci95, again.verdict)
    assert row.n_tasks == 8 and row.baseline_seeds == row.treatment_seeds == 2

    def shares(dirs):
        passes, counts = defaultdict(float), defaultdict(int)
        for r in pooled(dirs):
            passes[r["task_id"]] += r["reward"] >= 1.0
            counts[r["task_id"]] += 1
        return {t: passes[t] / counts[t] for t in counts}

    b, t = shares(base_dirs), shares(arm_dirs)
    assert all(n == 4 for n in [len(held_out(d)) // 8 * 2 for d in base_dirs])  # 8 tasks x 2 samples x 2 seeds
    assert row.delta == pytest.approx(float(np.mean([t[k] - b[k] for k in b])), abs=1e-12)
    assert row.baseline == pytest.approx(float(np.mean(list(b.values()))), abs=1e-12)
    saved = json.loads((flash_result.dir / "recipe.json").read_text())
    assert saved["rows"][0]["delta"] == row.delta and saved["rows"][0]["ci95"] == list(row.ci95)


@pytest.mark.slow
def test_reported_drift_is_the_runs_recorded_metrics(flash_result):
    """The metrics' `drift` is FlashReinforce's mean_sequence_kl stat (the Update's), step by step."""
    for label, runs in flash_result.runs.items():
        records = [json.loads(line) for run in runs for line in (run.dir / "metrics.jsonl").read_text().splitlines()]
        assert all(r["drift"] == r["method/mean_sequence_kl"] for r in records)
        reached = flash_result.drift[label]
        assert reached["drift"] == pytest.approx(np.mean([r["drift"] for r in records]), abs=0)
        assert reached["drift max"] == max(r["drift"] for r in records)
        assert reached["admitted share"] == pytest.approx(np.mean([r["admitted_share"] for r in records]), abs=0)
        assert reached["drift max"] > 0  # lag 2 really made the rollouts stale
    assert flash_result.drift["stale REINFORCE, gate off"]["admitted share"] == 1.0  # the gate never closed


@pytest.mark.slow
def test_identical_arms_report_a_delta_of_exactly_zero(tmp_path):
    same = Recipe("same", "both arms FlashReinforce", lambda run: (Arm("first", "flash_reinforce"),
                                                                   Arm("second", "flash_reinforce")))
    result = run_recipe(same, seeds=2, run_dir=str(tmp_path / "r"), **TINY)
    warning = "warning: arms 'first' and 'second' run the same method with the same knobs"
    assert result.warnings[0].startswith(warning) and warning in str(result)
    (row,) = result.comparisons
    assert row.delta == 0.0 and row.sd == 0.0 and row.baseline == row.treatment
    # every task's difference is 0, so compare's zero-spread interval: +/- (1 - 0.025 ** (1 / 8)) = +/- 0.3694
    share = 1.0 - 0.025 ** (1.0 / 8)
    assert row.ci95 == pytest.approx((-share, share)) and share == pytest.approx(0.3694, abs=1e-4)
    assert row.verdict == "unresolved"
    assert result.drift["first"] == result.drift["second"]
    for seed in (0, 1):
        assert held_out(tmp_path / "r" / f"first-seed{seed}") == held_out(tmp_path / "r" / f"second-seed{seed}")


@pytest.mark.slow
def test_cli_json_is_the_recipe_json(tmp_path, capsys):
    argv = ["recipe", "flash_reinforce", "--seeds", "2", "--steps", "3", "--eval-tasks", "4", "--eval-samples", "2",
            "--rollouts-per-step", "8", "--lag", "1", "--taskset", "builtin:case", "--run-dir", str(tmp_path / "r"), "--json",
            "--set", "recipe:trust=0.01"]
    assert main(argv) == 0
    saved = json.loads((tmp_path / "r" / "recipe.json").read_text())
    assert json.loads(capsys.readouterr().out) == saved  # stdout is the JSON only: the runs' logs go to stderr
    assert saved["settings"]["lag"] == 1 and saved["settings"]["steps"] == 3 and saved["seeds"] == [0, 1]
    assert [a["knobs"] for a in saved["arms"]] == [{"off_policy_steps": 8, "trust": NEVER},
                                                   {"off_policy_steps": 8, "trust": 0.01}]
    assert saved["knobs_set"] == {"recipe:trust": 0.01} and saved["warnings"] == []
    assert '  recipe arm: FlashReinforce [flashreinforce] (flash_reinforce {"off_policy_steps": 8, "trust": 0.01})' \
        in saved["report"].splitlines()
    for seed in (0, 1):  # what each arm's run was really given: summary.json's method, with its knobs
        gated, open_ = (json.loads((tmp_path / "r" / f"{slug}-seed{seed}" / "summary.json").read_text())["method"]
                        for slug in ("flashreinforce", "stale-reinforce--gate-off"))
        assert "trust=0.01," in gated and "trust=1e+300," in open_


@pytest.mark.slow
def test_both_arms_draw_the_same_first_lag_batches(flash_result):
    """Same seed, same sampler seeds: the first `lag` (2) batches come from the same starting weights in both arms,
    so their rewards are equal step for step; afterwards each arm samples from its own policy."""
    gate_off, gated = flash_result.runs.values()
    for a, b in zip(gate_off, gated):
        first, second = a.metrics(), b.metrics()
        assert [r["reward"] for r in first[:2]] == [r["reward"] for r in second[:2]]
        assert [r["sampled_at_step"] for r in first] == [r["sampled_at_step"] for r in second]
    assert [r.config.seed for r in gate_off] == [r.config.seed for r in gated] == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sao", "bpco", "grpo_loss_types"])
def test_every_other_recipe_s_rows_are_compare_on_its_runs_and_its_drift_their_metrics(name, tmp_path):
    """Each recipe at a tiny size (critic recipes past their warm-up): every recipe arm's row is `compare` of its
    runs' held-out rows against the baseline's, seeds pooled; the drift is the runs' metrics; masked (SAO) and
    clipped (BPCO, GRPO) shares are the methods' own Update stats as the loop recorded them."""
    steps = {"sao": 12, "bpco": 17, "grpo_loss_types": 4}[name]
    result = run_recipe(recipe(name), seeds=2, run_dir=str(tmp_path / "r"), **{**TINY, "steps": steps})
    baseline = result.arms[0]

    def pooled(label):
        return [{**r, "seed": str(run.config.seed)} for run in result.runs[label] for r in held_out(run.dir)]

    assert len(result.comparisons) == len(result.arms) - 1
    for arm, row in zip(result.arms[1:], result.comparisons):
        again = wai.compare(pooled(baseline.label), pooled(arm.label), threshold=1.0)
        assert (row.baseline, row.treatment, row.delta, row.ci95, row.verdict) == \
            (again.baseline, again.treatment, again.delta, again.ci95, again.verdict)
    for arm in result.arms:
        label, runs = arm.label, result.runs[arm.label]
        stat = "masked_token_share" if arm.method == "sao" else "clipped_token_share"
        records = [r for run in runs for r in run.metrics() if r.get("policy_trained", True)]
        assert records and all(f"method/{stat}" in r for r in records), label
        key = "tokens masked" if stat == "masked_token_share" else "tokens clipped"
        assert result.drift[label][key] == pytest.approx(np.mean([r[f"method/{stat}"] for r in records]), abs=0)
        assert result.drift[label]["drift max"] == max(r["drift"] for r in records)


def test_knobs_that_would_change_more_than_the_method_are_refused_before_training(tmp_path):
    """Another temperature in one arm (the arms would not sample the same distribution), or an arm's own critic
    rate under the run's shared critic_learning_rate (shown but not used): refused, nothing written."""
    with pytest.raises(ConfigError, match="different temperatures"):
        run_recipe(recipe("flash_reinforce"), seeds=2, knobs={"recipe:temperature": 0.5}, run_dir=str(tmp_path / "a"))
    with pytest.raises(ConfigError, match="critic rate of 'same critic, ratio never masked', 'SAO'.*shared"):
        run_recipe(recipe("sao"), seeds=2, knobs={"critic_learning_rate": 1e-3}, run_dir=str(tmp_path / "b"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    from whileai.evidence.runner import (
        check_recipe,  # one temperature for every arm is accepted (checked only)
    )

    arms = check_recipe(recipe("flash_reinforce"), {"temperature": 0.5})[2]
    assert [arm.knobs["temperature"] for arm in arms] == [0.5, 0.5]


def test_the_loop_s_checks_run_for_every_arm_before_the_first_trains(tmp_path):
    """A lag beyond the recipe arm's bound is the loop's refusal; it comes before the baseline trains."""
    with pytest.raises(ConfigError, match="arm 'flashreinforce': lag = 4 is beyond the 1 steps"):
        run_recipe(recipe("flash_reinforce"), seeds=2, lag=4, knobs={"recipe:off_policy_steps": 1},
                   run_dir=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()
