"""What each method needs from the loop, and where the loop gets it: a teacher (OPD), the student's own weights
behind an anchor with privileged context (OPSD), a reference policy (beta > 0), a critic's settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import whileai as wai
from whileai.cli import main
from whileai.engine import SamplingParams, TrainingEngine
from whileai.engine.models import load_model
from whileai.engine.teacher import model_teacher, policy_teacher
from whileai.envs import load_taskset, render_prompt
from whileai.loop.hooks.teacher import PRIVILEGED, RunTeacher, teacher_prompt
from whileai.loop.step import policy_step
from whileai.methods.run_spec import TeacherSpec

SAMPLING = {"max_tokens": 4, "temperature": 1.0}


def _rows(engine: TrainingEngine, n: int = 4, seed: int = 3) -> list[dict]:
    """Rollouts of builtin:case tasks, as the loop makes them (task_id, prompt_tokens, reward, ...)."""
    taskset = load_taskset("builtin:case")
    tasks = taskset.split("train")[:n]
    prompts = [render_prompt(engine.tokenizer, t) for t in tasks]
    samples = engine.sample(prompts, 1, SamplingParams(max_tokens=4, temperature=1.0, seed=seed))
    return [{"task_id": t.task_id, "prompt_tokens": p, "tokens": s[0].tokens, "behavior_logprobs": s[0].logprobs,
             "completion": engine.tokenizer.decode(s[0].tokens), "reward": float(i % 2)}
            for i, (t, p, s) in enumerate(zip(tasks, prompts, samples))]


def _weights(engine: TrainingEngine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.named_params.items()}


# ----------------------------------------------------------------------------- anchors
def test_the_ema_anchor_moves_by_its_rate_after_a_step():
    """theta_bar starts at theta_0; after a step to theta_1 it is (1 - 0.25) theta_0 + 0.25 theta_1, exactly."""
    engine = TrainingEngine("builtin:tiny", seed=1)
    teacher = policy_teacher(engine, "ema", 0.25)
    theta_0 = _weights(engine)
    policy_step(engine, wai.OPSD(anchor="ema:0.25"), _with_teacher(engine, _rows(engine)),
                adam={"learning_rate": 0.05}, sampling_params=SAMPLING)
    theta_1 = _weights(engine)
    assert any(not torch.equal(theta_0[n], theta_1[n]) for n in theta_0)
    teacher.after_step(engine.named_params)
    for name in theta_0:
        torch.testing.assert_close(teacher.ema.shadow[name], 0.75 * theta_0[name] + 0.25 * theta_1[name])
    # the teacher's forward runs on the average and leaves the student's weights as they were
    rows = _rows(engine)
    sequences = [(r["prompt_tokens"], r["tokens"]) for r in rows]
    from whileai.engine.logprobs import scoring

    scores = teacher.score(sequences, scoring(SAMPLING))
    live = policy_teacher(engine, "live").score(sequences, scoring(SAMPLING))
    assert all(not np.allclose(a.logprobs, b.logprobs) for a, b in zip(scores, live))
    for name, param in engine.named_params.items():
        assert torch.equal(param, theta_1[name]), name


def _with_teacher(engine: TrainingEngine, rows: list[dict]) -> list[dict]:
    """Rows scored by another model (builtin:tiny of seed 9), so the student has something to learn."""
    scorer = model_teacher(load_model("builtin:tiny", seed=9))
    RunTeacher(TeacherSpec("model", top_k=8), scorer, engine.tokenizer, []).fill(rows, SAMPLING)
    return rows


def test_the_initial_anchor_does_not_move_and_live_does():
    engine = TrainingEngine("builtin:tiny", seed=2, reference=True)
    rows = _rows(engine)
    sequences = [(r["prompt_tokens"], r["tokens"]) for r in rows]
    from whileai.engine.logprobs import scoring

    initial, live = policy_teacher(engine, "initial"), policy_teacher(engine, "live")
    before = [s.logprobs for s in initial.score(sequences, scoring(SAMPLING))]
    np.testing.assert_allclose(before, [s.logprobs for s in live.score(sequences, scoring(SAMPLING))], atol=1e-6)
    for _ in range(2):
        policy_step(engine, wai.OPSD(anchor="initial"), _with_teacher(engine, _rows(engine)),
                    adam={"learning_rate": 0.05}, sampling_params=SAMPLING)
        initial.after_step(engine.named_params)
    after = [s.logprobs for s in initial.score(sequences, scoring(SAMPLING))]
    moved = [s.logprobs for s in live.score(sequences, scoring(SAMPLING))]
    np.testing.assert_array_equal(after, before)
    assert max(np.max(np.abs(a - b)) for a, b in zip(moved, before)) > 1e-3


# ----------------------------------------------------------------------------- privileged context
class _Recording(TrainingEngine):
    """The real engine; it also keeps every student input it ran."""

    seen: list[list[int]]

    def forward(self, data, *args, **kwargs):  # type: ignore[override]
        self.seen = getattr(self, "seen", []) + [list(d["model_input"]) for d in data]
        return super().forward(data, *args, **kwargs)

    def forward_backward(self, data, *args, **kwargs):  # type: ignore[override]
        self.seen = getattr(self, "seen", []) + [list(d["model_input"]) for d in data]
        return super().forward_backward(data, *args, **kwargs)

    def forward_backward_custom(self, data, *args, **kwargs):  # type: ignore[override]
        self.seen = getattr(self, "seen", []) + [list(d["model_input"]) for d in data]
        return super().forward_backward_custom(data, *args, **kwargs)


def _contains(sequence: list[int], part: list[int]) -> bool:
    return any(sequence[i:i + len(part)] == part for i in range(len(sequence) - len(part) + 1))


@pytest.mark.parametrize("kind", ["reference", "feedback"])
def test_the_privileged_context_reaches_the_teacher_and_never_the_student(kind: str):
    engine = _Recording("builtin:tiny", seed=4)
    taskset = load_taskset("builtin:case")
    rows = _rows(engine)
    spec = TeacherSpec("live", privileged=kind, top_k=8)
    teacher = RunTeacher(spec, policy_teacher(engine, "live"), engine.tokenizer, taskset.split("train"))
    plain = RunTeacher(TeacherSpec("live", top_k=8), policy_teacher(engine, "live"), engine.tokenizer, [])
    with_text = [dict(r) for r in rows]
    teacher.fill(with_text, SAMPLING)
    without = [dict(r) for r in rows]
    plain.fill(without, SAMPLING)
    for a, b in zip(with_text, without):  # the text changes what the teacher predicts
        assert np.max(np.abs(np.subtract(a["teacher_logprobs"], b["teacher_logprobs"]))) > 1e-3
    task = taskset.split("train")[0]
    text = PRIVILEGED[kind].split(":")[0]  # "Reference answer" / "An earlier attempt"
    secret = engine.tokenizer.encode(text, add_special_tokens=False)
    assert _contains(teacher.context(rows[0]), secret)
    if kind == "reference":  # the answer on a line before the prompt, which the completion continues
        text = f"Reference answer: {task.answer}\n{task.prompt}"
        assert teacher.context(rows[0]) == [engine.tokenizer.bos_token_id] + engine.tokenizer.encode(
            text, add_special_tokens=False)
        assert teacher_prompt(engine.tokenizer, task, "x") != render_prompt(engine.tokenizer, task)
    engine.seen = []
    policy_step(engine, wai.OPSD(privileged=kind, anchor="live"), with_text, adam={"learning_rate": 0.01},
                sampling_params=SAMPLING)
    assert engine.seen and not any(_contains(s, secret) for s in engine.seen)
    assert all(s[:len(r["prompt_tokens"])] == r["prompt_tokens"] for s, r in zip(engine.seen, rows))


def test_a_privileged_reference_without_answers_is_refused_before_loading(tmp_path: Path):
    tasks = [wai.envs.Task(f"t{i}", f"q{i}") for i in range(8)]
    taskset = wai.envs.Taskset("mine", tasks[:6], tasks[6:], lambda task, text: 1.0)
    with pytest.raises(wai.ConfigError, match="privileged = 'reference' shows the teacher a reference answer"):
        wai.train(method="opsd", taskset=taskset, steps=2, rollouts_per_step=2, run_dir=str(tmp_path / "r"))


# ----------------------------------------------------------------------------- teacher sources
def test_a_bad_teacher_fails_before_any_model_loads(tmp_path: Path, monkeypatch, capsys):
    import whileai.engine.training as training

    def never(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(training, "load_model", never)
    missing = tmp_path / "no-such-model"
    code = main(["train", "--method", "opd", "--teacher", str(missing), "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code != 0 and f"teacher = '{missing}': no such directory" in err and "RUN_DIR/final" in err
    assert main(["train", "--method", "opd", "--run-dir", str(tmp_path / "r")]) != 0
    assert "distills from a teacher model: give --teacher" in capsys.readouterr().err
    assert main(["train", "--method", "opd", "--teacher", "builtin:huge"]) != 0
    assert "is not a built-in model: use one of builtin:tiny" in capsys.readouterr().err
    assert main(["train", "--method", "grpo", "--teacher", "builtin:tiny"]) != 0
    assert "distills from no teacher" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_teacher_with_another_tokenizer_is_refused(tmp_path: Path, quick):
    """A teacher whose tokenizer writes 'a' and 'b' with each other's ids scores the wrong tokens: refused."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from whileai.engine.models import build_builtin

    model, tokenizer = build_builtin("tiny")
    vocab = tokenizer.get_vocab()
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    inner = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    inner.decoder = decoders.ByteLevel()
    swapped = PreTrainedTokenizerFast(tokenizer_object=inner, pad_token=tokenizer.pad_token,
                                      bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)
    model.save_pretrained(tmp_path / "teacher")
    swapped.save_pretrained(tmp_path / "teacher")
    with pytest.raises(wai.ConfigError, match=f"cannot score the student's tokens: 2 of the student's 259 token ids "
                       f"are other tokens to the teacher \\(e.g. id {min(vocab['a'], vocab['b'])}"):
        wai.train(method="opd", teacher=str(tmp_path / "teacher"), run_dir=str(tmp_path / "r"), **quick)


@pytest.mark.slow
def test_cli_opd_with_a_builtin_teacher_trains(tmp_path: Path):
    code = main(["train", "--method", "opd", "--teacher", "builtin:tiny", "--steps", "2", "--rollouts-per-step", "8",
                 "--warm-start-steps", "0", "--eval-tasks", "0", "--no-progress", "--no-export", "--seed", "1",
                 "--run-dir", str(tmp_path / "r")])
    assert code == 0
    import json

    metrics = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all("method/mean_divergence" in m for m in metrics)
    assert "teacher = a separate frozen model" in json.loads((tmp_path / "r" / "summary.json").read_text())["run_spec"]


# ----------------------------------------------------------------------------- reference policy
@pytest.mark.parametrize("lora_rank", [0, 4])
def test_the_kl_to_the_reference_is_0_at_the_first_step_and_positive_after(tmp_path: Path, quick, lora_rank: int):
    run = wai.train(method=wai.GRPO(rollouts_per_prompt=4, beta=0.04), lag=0, lora_rank=lora_rank, learning_rate=3e-2,
                    run_dir=str(tmp_path / "r"), **quick)
    kl = [m["method/mean_kl"] for m in run.metrics()]
    assert kl[0] == pytest.approx(0.0, abs=1e-9)  # the policy is still the reference
    assert kl[-1] > 1e-5, kl


def test_a_reference_under_lora_with_a_warm_start_is_refused(tmp_path: Path):
    """Under LoRA the reference is the adapter-free base: a warm start cannot move it, so a KL would pull the
    student back to the model before the warm start. Refused before anything loads."""
    with pytest.raises(wai.ConfigError, match="under LoRA is the model with its adapters switched off \\(the model as loaded\\), and a warm "
                       "start of 14 steps"):
        wai.train(method=wai.GRPO(rollouts_per_prompt=4, beta=0.04), lora_rank=4, run_dir=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()


def test_after_a_warm_start_the_reference_is_the_policy_rl_starts_from_and_a_resume_keeps_it(tmp_path: Path,
                                                                                          quick):
    """Full fine-tuning: the reference is re-taken after the warm start, so GRPO's KL is exactly 0 at the first
    step (lag 0) and positive later; it is saved as checkpoint/reference.pt, and a resumed run, which loads it,
    repeats the uninterrupted run's metrics (against the model as loaded its KL would differ from step 1)."""
    from whileai.engine.models import build_builtin

    settings = {**quick, "method": wai.GRPO(rollouts_per_prompt=4, beta=0.04), "lag": 0, "learning_rate": 3e-2,
                "warm_start_steps": 5, "steps": 2}
    whole = wai.train(**settings, run_dir=str(tmp_path / "whole"))
    kl = [m["method/mean_kl"] for m in whole.metrics()]
    assert kl[0] == pytest.approx(0.0, abs=1e-9) and kl[-1] > 1e-5, kl
    saved = torch.load(whole.dir / "checkpoint" / "reference.pt", weights_only=True)
    as_loaded = build_builtin("tiny", seed=0)[0].state_dict()
    assert any(not torch.equal(saved[k], as_loaded[k]) for k in saved)  # the warm start moved it
    half = wai.train(**{**settings, "steps": 1}, run_dir=str(tmp_path / "half"))
    resumed = wai.train(resume=str(half.dir), steps=2, progress=False)
    assert _without_timing(resumed.metrics()) == _without_timing(whole.metrics())
    (whole.dir / "checkpoint" / "reference.pt").unlink()
    with pytest.raises(wai.ConfigError, match="the checkpoint has no reference.pt"):
        wai.train(resume=str(whole.dir), steps=3, progress=False)


def _without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


@pytest.mark.slow
def test_an_ema_teacher_resumes_from_its_checkpointed_average(tmp_path: Path, quick):
    """A resumed OPSD run continues with the average it saved: its metrics equal the uninterrupted run's. With a
    fresh average (the weights at the resume) the teacher's scores, and so the gap, would differ."""
    settings = {**quick, "method": "opsd", "knobs": {"anchor": "ema:0.5", "top_k": 8}, "steps": 4, "save_every": 2,
                "lag": 0, "learning_rate": 3e-2, "warm_start_steps": 0}
    whole = wai.train(**settings, run_dir=str(tmp_path / "whole"))
    half = wai.train(**{**settings, "steps": 2}, run_dir=str(tmp_path / "half"))
    assert [p.name for p in (half.dir / "checkpoint").glob("teacher-*.pt")] == ["teacher-00000002.pt"]
    resumed = wai.train(resume=str(half.dir), steps=4, progress=False)
    assert _without_timing(resumed.metrics()) == _without_timing(whole.metrics())
    again = wai.train(**{**settings, "steps": 2}, run_dir=str(tmp_path / "again"))
    (again.dir / "checkpoint" / "teacher-00000002.pt").unlink()
    with pytest.raises(wai.ConfigError, match="the checkpoint has no teacher-00000002.pt"):
        wai.train(resume=str(again.dir), steps=4, progress=False)


def test_the_critic_fits_action_tokens_only():
    """The value loss skips a tool's tokens (action_mask false): their targets never reach the head's gradient."""
    from whileai.loop.step import _critic_backward

    engine = TrainingEngine("builtin:tiny", seed=5)
    engine.add_critic(1e-2)
    rows = [{"prompt_tokens": [1, 70, 71], "tokens": [72, 73, 74, 75], "values": [0.1, 0.2, 0.3, 0.4],
             "action_mask": [True, False, False, True]}]
    grads = []
    for tool_target in (0.0, 100.0):
        _critic_backward(engine, rows, [np.array([1.0, tool_target, tool_target, 1.0])])
        grads.append([p.grad.clone() for p in engine.critic.head.parameters()])
        engine.critic.optimizer.zero_grad(set_to_none=True)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    assert any(bool(g.abs().sum() > 0) for g in grads[0])


def test_groupwise_grading_from_the_cli_says_how_to_give_it_a_grader(capsys):
    assert main(["train", "--method", "groupwise_grading"]) != 0
    err = capsys.readouterr().err
    assert "not from `wai update` or `wai train`" in err
    assert "wai.train(method=wai.GroupwiseGrading(grader=my_grader, method=wai.GRPO(rollouts_per_prompt=4)))" in err


def test_the_teacher_scores_tool_tokens_and_the_update_gives_them_nothing():
    """A multi-turn row (a tool's tokens inside the completion, action_mask false): the teacher scores every token,
    the top-k coefficients are 0 on the tool's positions and nonzero on the model's."""
    engine = TrainingEngine("builtin:tiny", seed=6)
    rows = _with_teacher(engine, _rows(engine))
    for row in rows:
        row["action_mask"] = [True] + [False] * (len(row["tokens"]) - 2) + [True]
        assert len(row["teacher_logprobs"]) == len(row["tokens"]) == len(row["teacher_topk_tokens"])
    result = policy_step(engine, wai.OPD(top_k=8), rows, adam={"learning_rate": 0.01}, sampling_params=SAMPLING)
    for row, c in zip(rows, result.update.coefficients):
        mask = np.asarray(row["action_mask"])
        assert c.shape == (len(row["tokens"]), 8)
        assert np.all(c[~mask] == 0) and np.all(np.abs(c[mask]).sum(axis=1) > 0)


def test_reinforce_ada_samples_its_extra_rounds_inside_the_step(tmp_path: Path, quick):
    """A random-init model almost never passes, so every task keeps its round open: 4 tasks x 4 per round x 3
    rounds = 48 rows in the step, where a method without a plan trains on rollouts_per_step = 16."""
    run = wai.train(method=wai.methods.ReinforceAda(round_size=4, max_rounds=3), run_dir=str(tmp_path / "r"),
                    **{**quick, "steps": 1, "rollouts_per_step": 16})
    assert run.metrics()[0]["rollouts"] == 48
    plain = wai.train(method=wai.GRPO(rollouts_per_prompt=4), run_dir=str(tmp_path / "g"),
                      **{**quick, "steps": 1, "rollouts_per_step": 16})
    assert plain.metrics()[0]["rollouts"] == 16


def test_feedback_on_a_row_without_a_task_goes_before_its_own_prompt():
    """A row from a file has no task: the teacher sees BOS, the feedback text, then the row's prompt after BOS."""
    engine = TrainingEngine("builtin:tiny", seed=7)
    tok = engine.tokenizer
    spec = TeacherSpec("live", privileged="feedback")
    teacher = RunTeacher(spec, policy_teacher(engine, "live"), tok, [])
    row = {"prompt_tokens": [tok.bos_token_id] + tok.encode("abc", add_special_tokens=False),
           "tokens": tok.encode("def", add_special_tokens=False), "reward": 0.5, "task_id": "from-a-file"}
    want = tok.encode("An earlier attempt: def\nFeedback: it scored 0.5 (a pass is 1)\nabc", add_special_tokens=False)
    assert teacher.context(row) == [tok.bos_token_id] + want
    row["feedback"] = "the tool said: no such key"
    assert _contains(teacher.context(row), tok.encode("Feedback: the tool said: no such key", add_special_tokens=False))
