"""Each logged trace is scored under the distribution it was sampled from (its ``sampling`` field, or an
OpenAI request's settings), so its ratio pi / mu is right: traces sampled by builtin:tiny (seed 0) at
temperature 0.7 / top-p 0.9 / top-k 20 give a ratio of 1 on every token while the weights have not moved.
Scored at the method's settings instead (no field), the same tokens are far from 1: on a near-uniform random
model, keeping 20 of 259 ids puts the sampler's log-probability of a kept token about log(259 / 20) = 2.6 nats
above the untruncated one (2.4 measured), so pi / mu is about 0.09.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import whileai as wai
from whileai.engine.sampling import SamplingParams
from whileai.loop.sources.trace_run import sampling_lines
from whileai.loop.sources.traces import load_vocab, scan
from whileai.loop.step import datum, policy_step, score

PEAKED = {"temperature": 0.7, "top_p": 0.9, "top_k": 20}
FLAT = {"temperature": 1.3, "top_p": 0.8}  # top_k not stated: the method's (none)
MAX_TOKENS = 6
METHOD = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0)  # what `wai train` passes (RunPlan.sampling())
SETTINGS = {"max_tokens": MAX_TOKENS, "temperature": 1.0}  # METHOD's fields that a trace's own settings meet
FROZEN = {"learning_rate": 0.0}  # an optimizer step that leaves the weights where they are


@lru_cache(maxsize=1)
def _engine() -> Any:
    from whileai.engine import TrainingEngine

    return TrainingEngine("builtin:tiny", seed=0)


@lru_cache(maxsize=4)
def _traces(settings: tuple[tuple[str, Any], ...], n: int = 8, seed: int = 0) -> tuple[dict[str, Any], ...]:
    """``n`` traces the engine sampled at ``settings``, in the library's row form with their ``sampling``."""
    from whileai.engine import SamplingParams

    engine, stated = _engine(), dict(settings)
    prompts = [[1, *engine.tokenizer.encode(f"q{i}?", add_special_tokens=False)] for i in range(n)]
    params = SamplingParams(max_tokens=MAX_TOKENS, seed=seed, **stated)
    rows = []
    for i, (sample,) in enumerate(engine.sample(prompts, 1, params)):
        rows.append({"task_id": f"t{i}", "prompt_tokens": prompts[i], "tokens": sample.tokens,
                     "behavior_logprobs": sample.logprobs, "reward": float(i % 2), "sampling": stated})
    return tuple(rows)


def _write(path: Path, rows: Any) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _read(path: Path) -> list[dict[str, Any]]:
    source = scan(path, load_vocab("builtin:tiny"), trace=True)
    return source.read(list(range(source.n)))


def _worst(rows: list[dict[str, Any]], logprobs: list[list[float]]) -> float:
    """The largest |pi / mu - 1| over every token of every row."""
    return max(float(np.max(np.abs(np.exp(np.subtract(lp, r["behavior_logprobs"])) - 1)))
               for r, lp in zip(rows, logprobs))


def _without_field(rows: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "sampling"} for r in rows]


class Spy:
    """The engine, with the trainer calls a step makes written down (name, rows, sampling settings)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.calls: list[tuple[str, int, Any]] = []

    def __getattr__(self, name: str) -> Any:
        op = getattr(self.engine, name)
        if name not in ("forward", "forward_backward", "forward_backward_custom"):
            return op

        def spied(data: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, len(data), kwargs.get("sampling_params")))
            return op(data, *args, **kwargs)

        return spied


# ----------------------------------------------------------------------------- one distribution
def test_traces_scored_under_their_own_sampling_have_ratio_one_and_not_at_the_methods(tmp_path: Path):
    rows = _read(_write(tmp_path / "peaked.jsonl", _traces(tuple(PEAKED.items()))))
    assert rows[0]["sampling"] == PEAKED
    assert _worst(rows, score(_engine(), rows, sampling_params=METHOD)) < 1e-4
    bare = _read(_write(tmp_path / "bare.jsonl", _without_field(rows)))
    assert "sampling" not in bare[0]
    assert _worst(bare, score(_engine(), bare, sampling_params=METHOD)) > 0.5  # pi / mu about e^-2.4 = 0.09


@pytest.mark.parametrize(("settings", "passes"), [(PEAKED, ["forward", "forward_backward"]),
                                                   ({"temperature": 0.25}, ["forward_backward_custom"])],
                         ids=["top-k: two passes", "temperature only: single pass"])
def test_flash_reinforce_admits_every_trace_with_no_drift_at_step_0(tmp_path: Path, settings: dict[str, Any],
                                                                    passes: list[str]):
    rows = _read(_write(tmp_path / "traces.jsonl", _traces(tuple(settings.items()))))
    spy = Spy(_engine())
    result = policy_step(spy, wai.FlashReinforce(), rows, adam=FROZEN, sampling_params=METHOD,
                         single_pass_tokens=10**6)
    assert all(result.update.admitted) and result.metrics["drift"] < 1e-6  # mean sequence KL, ~0
    assert [name for name, _, _ in spy.calls] == passes
    # the traces' own, in the one type the loop samples with (the engine's SamplingParams)
    assert all(isinstance(params, SamplingParams) and {**SETTINGS, **settings}.items() <= vars(params).items()
               for _, _, params in spy.calls)
    bare = policy_step(_engine(), wai.FlashReinforce(), _without_field(rows), adam=FROZEN, sampling_params=METHOD,
                       single_pass_tokens=10**6)
    assert bare.metrics["drift"] > 1e-3  # at the method's: 0.087 (top-k 20; past trust 0.003), 0.0012 (T 0.25)
    assert all(bare.update.admitted) == ("top_k" not in settings)


def test_a_token_the_traces_top_k_no_longer_keeps_scores_at_the_floor_and_its_trace_is_dropped(tmp_path: Path):
    """Once the weights move, a logged token can fall outside the top-k it was sampled under (probability 0).
    Here top-k 1 stands in for that: every token but the arg-max is outside it."""
    from whileai.loop.step import REMOVED_LOGPROB

    rows = [dict(r, sampling={"top_k": 1}) for r in _traces(tuple(PEAKED.items()))]
    logprobs = score(_engine(), rows, sampling_params=METHOD)
    for lp in logprobs:
        assert set(np.round(lp, 6)) <= {0.0, REMOVED_LOGPROB}  # the arg-max has probability 1, the rest 0
    assert sum(lp.count(REMOVED_LOGPROB) for lp in logprobs) > 8
    result = policy_step(_engine(), wai.FlashReinforce(), rows, adam=FROZEN, sampling_params=METHOD)
    removed = [REMOVED_LOGPROB in lp for lp in logprobs]
    assert list(result.update.admitted) == [not r for r in removed]  # no error: those traces are dropped


# ----------------------------------------------------------------------------- two distributions in one file
def _mixed(tmp_path: Path) -> list[dict[str, Any]]:
    peaked, flat = _traces(tuple(PEAKED.items())), _traces(tuple(FLAT.items()), seed=1)
    interleaved = [row for pair in zip(peaked, flat) for row in pair]
    return _read(_write(tmp_path / "mixed.jsonl", [dict(r, task_id=f"m{i}") for i, r in enumerate(interleaved)]))


def test_a_mixed_file_is_scored_per_group_and_equals_scoring_each_group_alone(tmp_path: Path):
    rows = _mixed(tmp_path)
    spy = Spy(_engine())
    mixed = score(spy, rows, sampling_params=METHOD)
    assert [(name, n) for name, n, _ in spy.calls] == [("forward", 8), ("forward", 8)]  # one call per group
    alone = [score(_engine(), rows[k::2], sampling_params=METHOD) for k in (0, 1)]
    assert mixed[0::2] == alone[0] and mixed[1::2] == alone[1]  # the same numbers, back in row order
    assert _worst(rows, mixed) < 1e-4
    assert rows[1]["sampling"] == {"temperature": 1.3, "top_p": 0.8}  # scored with the method's top_k (none)


def test_a_mixed_batch_trains_in_two_passes_with_the_gradient_of_each_trace_under_its_own(tmp_path: Path):
    """The slow, obvious reference: each trace alone, weighted by its coefficients c, differentiated under its
    own sampling settings, gradients summed; the step's gradient norm must be the same."""
    rows = _mixed(tmp_path)
    engine, spy = _engine(), Spy(_engine())
    result = policy_step(spy, wai.FlashReinforce(), rows, adam=FROZEN, sampling_params=METHOD,
                         single_pass_tokens=10**6)
    assert [name for name, _, _ in spy.calls] == ["forward", "forward", "forward_backward", "forward_backward"]
    assert all(result.update.admitted) and result.metrics["drift"] < 1e-6
    assert sum(bool(np.any(c)) for c in result.update.coefficients) >= 8
    for row, c in zip(rows, result.update.coefficients):
        if np.any(c):
            engine.forward_backward([datum(row, weights=np.asarray(c).tolist())], "cross_entropy",
                                    sampling_params={**SETTINGS, **row["sampling"]})
    reference = engine.optim_step(FROZEN).grad_norm
    assert result.metrics["grad_norm"] == pytest.approx(reference, rel=1e-5)
    for row, c in zip(rows, result.update.coefficients):  # what scoring every trace at the method's would train
        if np.any(c):
            engine.forward_backward([datum(row, weights=np.asarray(c).tolist())], "cross_entropy",
                                    sampling_params=METHOD)
    assert engine.optim_step(FROZEN).grad_norm != pytest.approx(reference, rel=1e-2)


def test_the_run_log_says_which_traces_were_scored_under_which_settings(tmp_path: Path):
    rows = _mixed(tmp_path)
    bare = dict(_without_field(rows[:1])[0], task_id="bare")
    source = scan(_write(tmp_path / "three.jsonl", [*rows, bare]), load_vocab("builtin:tiny"), trace=True)
    (line,) = sampling_lines(source, 1.0)
    assert line.startswith("sampling: each trace is scored under the settings it was sampled with: ")
    assert "8 traces at temperature 0.7, top-p 0.9, top-k 20 (as stated; first at line 1, 3, 5)" in line
    assert ("8 traces at temperature 1.3, top-p 0.8, no top-k (temperature, top_p stated, the rest the method's; "
            "first at line 2, 4, 6)") in line
    assert "1 trace at temperature 1, no top-p, no top-k (none stated: the method's; first at line 17)" in line
    plain = scan(_write(tmp_path / "plain.jsonl", [bare]), load_vocab("builtin:tiny"), trace=True)
    assert sampling_lines(plain, 0.8) == [
        "sampling: no trace states the settings it was sampled with, so all are scored at the method's "
        "(temperature 0.8, no top-p, no top-k); traces sampled otherwise need a 'sampling' field (docs/traces.md)"]


# ----------------------------------------------------------------------------- an OpenAI log's requests
def _chat_line(row: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(row["tokens"], row["behavior_logprobs"])]
    return {"request": {"model": "tiny", "messages": [{"role": "user", "content": "?"}], "logprobs": True, **request},
            "response": {"model": "tiny", "prompt_token_ids": row["prompt_tokens"],
                         "choices": [{"index": 0, "logprobs": {"content": content}, "finish_reason": "stop"}]},
            "reward": row["reward"], "task_id": row["task_id"]}


def test_an_openai_logs_request_settings_are_the_traces_sampling(tmp_path: Path):
    rows = _traces(tuple(PEAKED.items()))
    lines = [_chat_line(r, {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_tokens": MAX_TOKENS}) for r in rows]
    read = _read(_write(tmp_path / "chat.jsonl", lines))
    assert [r["sampling"] for r in read] == [PEAKED] * len(rows)
    assert _worst(read, score(_engine(), read, sampling_params=METHOD)) < 1e-4
    neutral = _chat_line(rows[0], {"top_k": -1, "temperature": None, "frequency_penalty": 0})
    assert _read(_write(tmp_path / "neutral.jsonl", [neutral]))[0].get("sampling") == {"top_k": 0}
    source = scan(tmp_path / "chat.jsonl", load_vocab("builtin:tiny"), trace=True)
    assert "vLLM's default raw_logprobs come before temperature, top-k and top-p" in sampling_lines(source, 1.0)[1]


# ----------------------------------------------------------------------------- bad fields
def test_a_bad_sampling_field_fails_with_its_line_field_and_fix(tmp_path: Path):
    good = dict(_traces(tuple(PEAKED.items()))[0])
    bad = [{"temperature": 0}, {"temperature": -0.5}, {"top_p": 1.5}, {"top_p": 0}, {"top_k": 2.5},
           {"top_k": -2}, {"temprature": 0.7}, {"min_p": 0.1}, "hot", {"temperature": True}]
    path = _write(tmp_path / "bad.jsonl", [good] + [dict(good, sampling=s) for s in bad]
                  + [_chat_line(good, {"temperature": 0})])
    with pytest.raises(wai.BatchError) as caught:
        scan(path, load_vocab("builtin:tiny"), trace=True)
    parts = str(caught.value).split(" | ")
    assert len(parts) == len(bad) + 1 and "line 1:" not in str(caught.value)
    expected = ["line 2: field 'sampling.temperature' is 0; temperature 0 is greedy",
                "line 3: field 'sampling.temperature' is -0.5; it must be a finite number > 0",
                "line 4: field 'sampling.top_p' is 1.5; it must be a number in (0, 1]",
                "line 5: field 'sampling.top_p' is 0; it must be a number in (0, 1]",
                "line 6: field 'sampling.top_k' is 2.5; it must be an integer >= 0",
                "line 7: field 'sampling.top_k' is -2; it must be an integer >= 0",
                "line 8: field 'sampling' has unknown setting(s) ['temprature']. Fix: use ['temperature', 'top_p', "
                "'top_k']",
                "line 9: field 'sampling.min_p' is 0.1; the trainer scores a trace under temperature, top-p and "
                "top-k only",
                "line 10: field 'sampling' is 'hot'; it must be a JSON object",
                "line 11: field 'sampling.temperature' is True; it must be a finite number > 0",
                "line 12: a openai line in a file read as whileai"]
    for part, want in zip(parts, expected):
        assert want in part, (want, part)
        assert "Fix:" in part
    chat = _write(tmp_path / "greedy.jsonl", [_chat_line(good, {"temperature": 0})])
    with pytest.raises(wai.BatchError, match=r"line 1: field 'request.temperature' is 0; temperature 0 is greedy"):
        scan(chat, load_vocab("builtin:tiny"), trace=True)


def test_sft_dpo_and_rm_neither_read_nor_check_the_sampling_settings(tmp_path: Path):
    """They train the model's own distribution: a greedy log is a fine demonstration, and no row is scored
    under a top-k it was sampled with."""
    good = dict(_traces(tuple(PEAKED.items()))[0])
    for rows in ([good], [_chat_line(good, {"temperature": 0})]):
        source = scan(_write(tmp_path / "sft.jsonl", rows), load_vocab("builtin:tiny"), trace=False)
        assert "sampling" not in source.read([0])[0] and set(source.samplings) == {()}


# ----------------------------------------------------------------------------- a run
def test_a_traces_run_scores_each_trace_under_its_sampling_from_the_first_step(tmp_path: Path, capsys):
    """`wai train --rows` end to end: step 1's drift is ~0 and every trace admitted (the weights that wrote
    them, unmoved), and the held-out traces' drift before training is ~0 too."""
    path = _write(tmp_path / "peaked.jsonl", _traces(tuple(PEAKED.items()), n=24))
    run = wai.train(rows=str(path), method="flash_reinforce", model="builtin:tiny", steps=1, rollouts_per_step=8,
                    run_dir=str(tmp_path / "run"), export=False, progress=False, save_every=1,
                    lr_schedule="constant", max_tokens=MAX_TOKENS)
    record = run.metrics()[0]
    assert record["drift"] < 1e-6 and record["admitted_share"] == 1.0
    assert run.summary["heldout_traces"]["before"]["drift"] < 1e-6
    assert "24 traces at temperature 0.7, top-p 0.9, top-k 20 (as stated; first at line 1, 2, 3)" in \
        capsys.readouterr().out
