"""JSONL tasksets and Hugging Face `datasets` (the local way): fields, splits, every bad line named."""

from __future__ import annotations

import json
import socket

import pytest

import whileai as wai
from whileai.envs import load_taskset


def write_jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_jsonl_fields_ids_info_and_held_out_share(tmp_path):
    rows = [{"prompt": f"{i}+1=", "answer": i + 1, "level": i % 3} for i in range(20)]
    rows[4]["task_id"] = "five"
    write_jsonl(tmp_path / "t.jsonl", rows)
    tasks = load_taskset(tmp_path / "t.jsonl", grader="numeric", max_tokens=8)   # a Path works too
    train, test = tasks.split("train"), tasks.split("test")
    assert (len(train), len(test)) == (18, 2)   # test_share 0.1 of 20 distinct prompts
    every = {t.task_id: t for t in train + test}
    assert set(every) == {str(i) for i in range(1, 21) if i != 5} | {"five"}  # default: 1-based line number
    assert every["3"].prompt == "2+1=" and every["3"].answer == 3 and every["3"].info == {"level": 2}
    assert tasks.grade(every["3"], "it is 3") == 1.0 and tasks.max_tokens == 8
    again = load_taskset(str(tmp_path / "t.jsonl"), grader="numeric")
    assert again.split("test") == test           # the same file splits the same way every run


def test_jsonl_equal_prompts_share_a_split_and_chat_prompts_load(tmp_path):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    rows = [{"prompt": "same", "answer": "a"}] * 5 + [{"prompt": f"p{i}", "answer": "b"} for i in range(15)]
    rows.append({"prompt": chat, "answer": "hello"})
    tasks = load_taskset(write_jsonl(tmp_path / "t.jsonl", rows), test_share=0.5)
    train, test = tasks.split("train"), tasks.split("test")
    assert sum(t.prompt == "same" for t in train) in (0, 5)
    assert len({str(t.prompt) for t in test}) == 8   # round(0.5 * 17 distinct prompts)
    assert any(t.prompt == chat for t in train + test)


def test_jsonl_split_field(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": "a", "split": "test" if i < 3 else "train"} for i in range(10)]
    tasks = load_taskset(write_jsonl(tmp_path / "t.jsonl", rows))
    assert [t.prompt for t in tasks.split("test")] == ["q0", "q1", "q2"]
    assert len(tasks.split("train")) == 7
    rows[5]["split"] = "dev"
    del rows[7]["split"]
    with pytest.raises(wai.BatchError, match=r"line 6: split='dev' is not a split[\s\S]*1 line name no split "
                       r"\(line 8\), while 9 do"):
        load_taskset(write_jsonl(tmp_path / "u.jsonl", rows))
    # a typo among many lines that name no split is listed first, and the rest are counted, not listed one by one
    many = [{"prompt": f"p{i}", "answer": "a"} for i in range(51)] + [{"prompt": "t", "answer": "a", "split": "test"},
                                                                      {"prompt": "u", "answer": "a", "split": "tset"}]
    with pytest.raises(wai.BatchError) as info:
        load_taskset(write_jsonl(tmp_path / "w.jsonl", many))
    text = str(info.value)
    assert text.index("line 53: split='tset' is not a split") < text.index("51 lines name no split")
    assert "and 46 more), while 2 do" in text and "line 6:" not in text
    rows = [{"prompt": "q", "answer": "a", "split": "train"}, {"prompt": "q", "answer": "a", "split": "test"}]
    with pytest.raises(wai.BatchError, match="overlap"):
        load_taskset(write_jsonl(tmp_path / "v.jsonl", rows))


def test_jsonl_every_bad_line_named(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [
        {"prompt": "2+2=", "answer": 4},                 # line 1: fine
        {"prompt": "3+3=", "answer": "six"},             # line 2: not a number
        "not json",                                      # line 3
        "",                                              # line 4: blank, skipped
        {"answer": 1},                                   # line 5: no prompt
        {"prompt": "1+1=", "answer": 2, "task_id": "a"},
        {"prompt": "1+2=", "answer": 3, "task_id": "a"},  # line 7: repeated id
        {"prompt": [{"role": "user"}], "answer": 3},      # line 8: message without content
        {"prompt": "x", "answer": 1, "task_id": 2.5},     # line 9: id neither str nor int
    ])
    with pytest.raises(wai.BatchError) as err:
        load_taskset(path, grader="numeric")
    text = str(err.value)
    for line, why in [(2, "'six' is not a finite number"), (3, "not valid JSON"), (5, "field 'prompt' is missing"),
                      (7, "task_id 'a' repeats line 6"), (8, "role"), (9, "task_id 2.5")]:
        assert f"line {line}: " in text and why in text, (line, text)
    assert "line 1:" not in text and "line 4:" not in text and "6 problem(s)" in text


def test_jsonl_bad_options_and_paths(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "a", "answer": "b"}, {"prompt": "c", "answer": "d"}])
    with pytest.raises(wai.ConfigError, match=r"unknown option\(s\) \['gradr'\].*'grader'"):
        load_taskset(path, gradr="exact")
    with pytest.raises(wai.ConfigError, match="test_share=1.5"):
        load_taskset(path, test_share=1.5)
    with pytest.raises(wai.ConfigError, match="use one of"):
        load_taskset(path, grader="fuzzy")
    with pytest.raises(wai.ConfigError, match="split_field=''"):
        load_taskset(path, split_field="")
    with pytest.raises(wai.ConfigError, match="does not exist"):
        load_taskset(str(tmp_path / "missing.jsonl"))
    with pytest.raises(wai.ConfigError, match="not understood"):
        load_taskset(str(tmp_path / "data.txt"))


def test_jsonl_user_grader_needs_no_answer(tmp_path, monkeypatch):
    (tmp_path / "len_grader.py").write_text("def score(task, completion):\n    return float(len(completion) >= 3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": f"write {i}"} for i in range(10)])
    tasks = load_taskset(path, grader="len_grader:score")
    task = tasks.split("test")[0]
    assert task.answer is None and tasks.grade(task, "abc") == 1.0 and tasks.grade(task, "ab") == 0.0
    with pytest.raises(wai.BatchError, match="line 1: field 'answer' is missing"):
        load_taskset(path)  # the exact grader needs an answer


# ---------------------------------------------------------------------------------- Hugging Face
datasets = pytest.importorskip("datasets")


def qa(n: int, start: int = 0) -> dict:
    return {"question": [f"{i}*2=" for i in range(start, start + n)],
            "solution": [str(2 * i) for i in range(start, start + n)],
            "uid": [f"u{i}" for i in range(start, start + n)]}


def test_hf_local_parquet_dir_with_field_mapping(tmp_path):
    datasets.Dataset.from_dict(qa(12)).to_parquet(str(tmp_path / "train.parquet"))
    datasets.Dataset.from_dict(qa(4, start=100)).to_parquet(str(tmp_path / "test.parquet"))
    tasks = load_taskset(f"hf:{tmp_path}", prompt_field="question", answer_field="solution", id_field="uid",
                         grader="numeric")
    train, test = tasks.split("train"), tasks.split("test")
    assert [t.task_id for t in test] == ["u100", "u101", "u102", "u103"]
    assert len(train) == 12 and train[3].prompt == "3*2=" and train[3].answer == "6"
    assert tasks.grade(test[1], "202") == 1.0 and tasks.grade(test[1], "203") == 0.0


def test_hf_local_json_file_holds_out_share_and_save_to_disk(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": f"a{i}"} for i in range(30)]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(wai.ConfigError, match=r"no split 'test' \(it has \['train'\]\).*test_split=None"):
        load_taskset(f"hf:{path}")
    tasks = load_taskset(f"hf:{path}", test_split=None, test_share=0.2)
    assert (len(tasks.split("train")), len(tasks.split("test"))) == (24, 6)
    assert tasks.split("train")[0].task_id.startswith("train-")   # default id: split and 1-based row
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(qa(5)),
                          "validation": datasets.Dataset.from_dict(qa(2, start=50))}).save_to_disk(str(saved))
    tasks = load_taskset(f"hf:{saved}", test_split="validation", prompt_field="question", answer_field="solution")
    assert [t.task_id for t in tasks.split("test")] == ["validation-1", "validation-2"]


def test_hf_bad_rows_named(tmp_path):
    data = qa(3)
    data["solution"][1] = None
    datasets.Dataset.from_dict(data).to_parquet(str(tmp_path / "train.parquet"))
    datasets.Dataset.from_dict(qa(2, start=9)).to_parquet(str(tmp_path / "test.parquet"))
    with pytest.raises(wai.BatchError, match=r"split 'train' row 2: answer None"):
        load_taskset(f"hf:{tmp_path}", prompt_field="question", answer_field="solution")


def test_hf_hub_name_offline_fails_fast(monkeypatch):
    def unreachable(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "create_connection", unreachable)
    with pytest.raises(wai.ConfigError, match="cannot be reached.*pass a local path"):
        load_taskset("hf:openai/gsm8k")


def test_hf_offline_hub_name_and_unreadable_file_are_config_errors(tmp_path, monkeypatch):
    # HF_HUB_OFFLINE=1 (as datasets read it at import): no probe; datasets looks in its cache and misses
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(socket, "create_connection", None)   # the probe would fail loudly if it ran
    with pytest.raises(wai.ConfigError, match="hf:openai/gsm8k: datasets could not load it"):
        load_taskset("hf:openai/gsm8k", subset="main")
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a", "answer": "b"}\n{"prompt": \n')
    with pytest.raises(wai.ConfigError, match="datasets could not load it"):
        load_taskset(f"hf:{tmp_path / 'broken.jsonl'}", test_split=None)
    with pytest.raises(wai.ConfigError, match=r"unknown option\(s\) \['split_field'\]"):   # JSONL only
        load_taskset("hf:json", split_field="split")
    with pytest.raises(wai.ConfigError, match="cannot tell the format"):
        (tmp_path / "d.txt").write_text("x")
        load_taskset(f"hf:{tmp_path / 'd.txt'}")
