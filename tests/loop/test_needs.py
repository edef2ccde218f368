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
from whileai.loop.step import policy_step
from whileai.loop.teacher import PRIVILEGED, RunTeacher, teacher_prompt
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
    run = wai.train(method=wai.GRPO(generations=4, beta=0.04), lag=0, lora_rank=lora_rank, learning_rate=3e-2,
                    run_dir=str(tmp_path / "r"), **quick)
    kl = [m["method/mean_kl"] for m in run.metrics()]
    assert kl[0] == pytest.approx(0.0, abs=1e-9)  # the policy is still the reference
    assert kl[-1] > 1e-5, kl


def test_a_reference_with_a_warm_start_is_refused(tmp_path: Path):
    with pytest.raises(wai.ConfigError, match="needs the reference policy, which is the model as loaded"):
        wai.train(method=wai.GRPO(generations=4, beta=0.04), run_dir=str(tmp_path / "r"))
