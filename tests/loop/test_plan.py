"""The run plan: resolved once, printed with sources, written whole to config.toml, read back on resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import whileai as wai
from whileai.cli import main
from whileai.loop.plan.run_plan import saved_plan

QUICK = dict(rollouts_per_step=8, warm_start_steps=0, eval_tasks=0, export=False, progress=False, save_every=1)


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in TensorBoard event files, read with the record format's own framing."""
    from tensorboardX.proto import event_pb2

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset + 12 <= len(data):
            length = int.from_bytes(data[offset:offset + 8], "little")
            event = event_pb2.Event.FromString(data[offset + 12: offset + 12 + length])
            for v in event.summary.value:
                found.setdefault(v.tag, []).append((event.step, v.simple_value))
            offset += 12 + length + 4
    return found


def test_config_toml_holds_every_resolved_value_with_its_source(tmp_path: Path):
    run = wai.train(steps=2, run_dir=str(tmp_path / "r"), **QUICK)
    plan = saved_plan(tmp_path / "r" / "config.toml")
    assert (plan.steps, plan.learning_rate, plan.lag, plan.max_tokens, plan.temperature) == (2, 1e-2, 2, 4, 1.0)
    assert (plan.source("steps"), plan.source("learning_rate"), plan.source("lag"), plan.source("max_tokens")) == \
        ("user", "model rule", "default", "taskset")
    text = (tmp_path / "r" / "config.toml").read_text()
    assert "[plan]" in text and "learning_rate = 0.01" in text and 'learning_rate = "model rule"' in text
    assert run.summary["plan"]["values"] == plan.values()


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path: Path, capsys):
    code = main(["train", "--method", "grpo", "--learning-rate", "3e-3", "--dry-run", "--run-dir", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("run plan (value [source]):")
    assert "learning_rate 0.003 [user]" in out and "rollouts_per_prompt 8 [method]" in out
    assert "warm_start_steps 14 [taskset]" in out and "steps 40 [default]" in out
    assert not (tmp_path / "r").exists()


def test_a_negative_learning_rate_reaches_the_configs_own_message(capsys):
    """argparse alone takes '-1e-3' for an option and says 'expected one argument'."""
    assert main(["train", "--learning-rate", "-1e-3", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "learning_rate = -0.001 must be a finite number > 0" in err and "expected one argument" not in err


def test_resume_with_more_steps_continues_the_longer_runs_schedule(tmp_path: Path, capsys):
    """A 4-step run resumed to 6 trains steps 5 and 6 at the rates a 6-step run has there (linear decay over 6),
    and its plan says the step count came from the resume; the resume prints where it starts and its plan, and
    the summary counts this session's steps apart (a newcomer saw no header and "6 steps in 1 s")."""
    wai.train(steps=4, run_dir=str(tmp_path / "r"), **QUICK)
    capsys.readouterr()
    resumed = wai.train(resume=str(tmp_path / "r"), steps=6, progress=False)
    said = capsys.readouterr().out
    assert f"resuming {tmp_path / 'r'} at step 4 of 6 with its saved plan" in said and "steps 6 [resume]" in said
    assert "6 steps (2 this session, resumed at step 4) in" in resumed.summary["report"]
    fresh = wai.train(steps=6, run_dir=str(tmp_path / "f"), **QUICK)
    rates = [m["learning_rate"] for m in resumed.metrics()]
    assert rates[:4] == pytest.approx([1e-2 * (1 - t / 4) for t in range(4)])
    assert rates[4:] == pytest.approx([m["learning_rate"] for m in fresh.metrics()][4:]) == [1e-2 / 3, 1e-2 / 6]
    assert saved_plan(tmp_path / "r" / "config.toml").source("steps") == "resume"


def test_held_out_pass_at_1_is_a_tensorboard_scalar_before_during_and_after(tmp_path: Path):
    run = wai.train(steps=2, run_dir=str(tmp_path / "r"), **{**QUICK, "eval_tasks": 4, "eval_samples": 1,
                                                              "eval_every": 1})
    points = _scalars(tmp_path / "r" / "tensorboard")["eval/pass_at_1"]
    evals = json.loads((tmp_path / "r" / "evals.json").read_text())
    assert [step for step, _ in points] == [0, 1, 2] == [e["step"] for e in evals]
    assert [v for _, v in points] == pytest.approx([e["pass_at_1"] for e in evals])
    assert run.summary["eval_after"]["pass_at_1"] == pytest.approx(points[-1][1])


def _own_taskset(path: Path, answer: str = "y") -> str:
    path.write_text("".join(json.dumps({"prompt": f"{1000 + i}?", "answer": answer}) + "\n" for i in range(60)))
    return str(path)


def test_a_taskset_of_your_own_gets_the_rules_each_with_its_sentence(tmp_path: Path, capsys):
    """No Recommended: the warm start runs the rule's 2400 steps at 3e-3, the cap comes from the answers
    (1 token + a margin of 1 + EOS = 3, not FlashReinforce's 8192), and RL after a warm start runs at 1e-3."""
    tasks = _own_taskset(tmp_path / "tasks.jsonl")
    assert main(["train", "--taskset", tasks, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "warm_start_steps 2400 [rule]" in out and "warm_start_learning_rate 0.003 [rule]" in out
    assert "max_tokens 3 [rule]" in out and "learning_rate 0.001 [rule]" in out
    assert "max_tokens: 3: the longest reference answer (1 token) + a margin of 1 + EOS" in out
    built_in = wai.loop.dry_run()  # a built-in taskset keeps its measured settings and the loop's rate
    assert (built_in.warm_start_steps, built_in.learning_rate, built_in.warm_start_learning_rate) == (14, 1e-2, 1e-2)


def test_the_preflight_stops_a_run_with_no_signal_before_the_first_rl_step(tmp_path: Path):
    """An answer a random-init model never writes, no warm start: every probe rollout earns 0, so the run
    stops with the reason and the fixes (and leaves no run behind); --force trains anyway and records why."""
    tasks = _own_taskset(tmp_path / "tasks.jsonl", answer="qqqq")
    settings = dict(taskset=tasks, steps=1, rollouts_per_step=8, warm_start_steps=0, eval_tasks=0, progress=False,
                    export=False)
    with pytest.raises(wai.ConfigError, match="(?s)NO SIGNAL.*no rollout passed.*warm start.*--force"):
        wai.train(**settings, run_dir=str(tmp_path / "stopped"))
    assert not (tmp_path / "stopped").exists()
    run = wai.train(**settings, run_dir=str(tmp_path / "forced"), force=True)
    assert run.summary["preflight"]["ok"] is False and run.summary["preflight"]["pass_rate"] == 0.0
    assert len(run.metrics()) == 1



def test_dr_grpo_divides_by_the_plans_cap_unless_the_knob_is_set():
    """Dr. GRPO's L_max is the replies' generation budget: with the cap resolved from the taskset (4 on
    builtin:case) the method the loop updates with reads 4, not the paper's 1024, so its coefficients are
    1024/4 times the uncapped ones; a user's --set max_tokens stays theirs; a wrapped method's inner one too."""
    from tests.methods.test_grouped import HAND_ROWS
    from whileai.envs import load_taskset
    from whileai.loop.plan.config import build
    from whileai.loop.plan.run_plan import make_plan, with_cap

    taskset = load_taskset("builtin:case")
    for method, knobs, expected in ((wai.DrGRPO(), {}, 4), (wai.GRPO(loss_type="dr_grpo"), {}, 4),
                                    (wai.DrGRPO(max_tokens=64), {"max_tokens": 64}, 64)):
        config = build(None, taskset="builtin:case", knobs=knobs)
        plan = make_plan(config, {}, method, taskset)
        assert plan.max_tokens == 4
        capped = with_cap(method, config, plan)
        assert capped.max_tokens == expected
        ratio = method.max_tokens / expected
        for got, before in zip(capped.update(HAND_ROWS).coefficients, method.update(HAND_ROWS).coefficients):
            assert got == pytest.approx(before * ratio, rel=1e-12)
    wrapped = wai.Async(wai.DrGRPO())
    config = build(None, taskset="builtin:case")
    assert with_cap(wrapped, config, make_plan(config, {}, wrapped, taskset)).method.max_tokens == 4


def test_a_dr_grpo_object_divides_by_the_runs_cap_as_its_name_does(tmp_path: Path, quick, capsys):
    """``wai.train(method=wai.DrGRPO())`` and ``--method dr_grpo`` are one run: the object's max_tokens was left at
    its default, so the plan's cap (4 on builtin:case) is its L_max too, and the first step's loss (the same
    rollouts, sum c log p) is the same number; with the paper's 1024 kept the object's would be 256 times smaller.
    The plan says the cap came from the taskset, and no note calls the method's 1024 a --set."""
    losses, texts = {}, {}
    for label, method in (("name", "dr_grpo"), ("object", wai.DrGRPO())):
        run = wai.train(method=method, **{**quick, "steps": 1}, run_dir=str(tmp_path / label))
        losses[label] = run.metrics()[0]["loss"]
        texts[label] = (tmp_path / label / "config.toml").read_text()
        assert run.summary["resolved"]["max_tokens"] == 4
    assert losses["name"] != 0.0
    assert losses["object"] == pytest.approx(losses["name"], rel=1e-9)
    assert "max_tokens" not in texts["object"].split("[plan]")[0]  # the knob was not the user's
    assert "(--set)" not in capsys.readouterr().out


@pytest.mark.parametrize("name", ["grpo", "rloo", "opd", "opsd", "dapo"])
def test_the_loops_rollouts_message_names_a_knob_the_method_has(name):
    """A group method at one rollout per prompt is refused with `--set rollouts_per_prompt=2`; that --set builds
    every sampling method (OPD's count was once `samples`, and the message said `generations`)."""
    import re
    import warnings

    from whileai.loop.plan.checks import check
    from whileai.loop.plan.config import build

    config = build(None, method="grpo", knobs={"rollouts_per_prompt": 1})
    problems = check(config, wai.method("grpo", rollouts_per_prompt=1))
    key, value = re.search(r"--set (\w+)=(\d+)", " ".join(problems)).groups()
    assert (key, value) == ("rollouts_per_prompt", "2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert wai.method(name, **{key: int(value)}).run_spec().rollouts_per_prompt == 2
