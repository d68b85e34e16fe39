"""Loaders for the nine evaluation tasks: counts from the official files, and loud failures."""
from __future__ import annotations

import json
import shutil

import pytest

from tasks.evalsets.loaders import TASK_NAMES, TaskFileError, load_task

EXPECTED = {"lambada": 5153, "boolq": 3270, "race_h": 3498, "piqa": 1838, "hellaswag": 10042,
            "winogrande": 1267, "anli_r2": 1000, "hans": 30000, "wic": 638}
FEWSHOT = {"piqa": 16113, "winogrande": 40398, "anli_r2": 1000, "wic": 5428}


@pytest.mark.parametrize("name", TASK_NAMES)
def test_official_files_load(benchmarks_dir, name):
    t = load_task(name, benchmarks_dir, fewshot=True)
    assert len(t.examples) == EXPECTED[name]
    assert (len(t.fewshot) if t.fewshot is not None else None) == FEWSHOT.get(name)
    assert next(t.decontam_texts())


def test_label_semantics(benchmarks_dir):
    lam = load_task("lambada", benchmarks_dir).examples[0]
    assert lam["text"].endswith(" " + lam["target"]) and lam["target"] == "signs"
    wino = load_task("winogrande", benchmarks_dir).examples[0]
    assert wino["label"] == 1 and "Maria always" in wino["filled"]
    hs = load_task("hellaswag", benchmarks_dir).examples[0]
    assert hs["gold_text"].endswith("starts pulling up roofing on a roof.")


def test_missing_file_names_task_and_file(tmp_path):
    (tmp_path / "boolq").mkdir()
    with pytest.raises(TaskFileError, match=r"task 'boolq': file not found \(expected file: .*boolq/dev.jsonl\)"):
        load_task("boolq", tmp_path)
    with pytest.raises(TaskFileError, match="benchmarks folder .* does not exist"):
        load_task("boolq", tmp_path / "nowhere")
    with pytest.raises(TaskFileError, match="unknown task"):
        load_task("squad", tmp_path)


def test_malformed_files(tmp_path):
    (tmp_path / "boolq").mkdir()
    f = tmp_path / "boolq" / "dev.jsonl"
    f.write_text('{"question": "q", "passage": "p", "answer": true}\n{broken\n')
    with pytest.raises(TaskFileError, match="line 2: not valid JSON"):
        load_task("boolq", tmp_path)
    f.write_text('{"question": "q", "answer": true}\n')
    with pytest.raises(TaskFileError, match=r"line 1: missing field\(s\) \['passage'\]"):
        load_task("boolq", tmp_path)
    f.write_text("\n\n")
    with pytest.raises(TaskFileError, match="no records"):
        load_task("boolq", tmp_path)


def test_bom_and_blank_lines_are_tolerated(tmp_path):
    (tmp_path / "boolq").mkdir()
    row = json.dumps({"question": "q", "passage": "p", "answer": False})
    (tmp_path / "boolq" / "dev.jsonl").write_bytes(("\ufeff" + row + "\n\n" + row + "\n\n").encode())
    assert len(load_task("boolq", tmp_path).examples) == 2


def test_label_count_mismatch(benchmarks_dir, tmp_path):
    shutil.copytree(benchmarks_dir / "piqa", tmp_path / "piqa")
    labels = tmp_path / "piqa" / "valid-labels.lst"
    labels.chmod(0o644)
    labels.write_text("0\n1\n")
    with pytest.raises(TaskFileError, match="2 labels for 1838 examples"):
        load_task("piqa", tmp_path)


@pytest.mark.parametrize("task,path,row,message", [
    # BoolQ's answer as a string: every gold became "yes"
    ("boolq", "boolq/dev.jsonl", {"question": "q", "passage": "p", "answer": "false"},
     "line 1: answer \"false\" is not true or false"),
    ("boolq", "boolq/dev.jsonl", {"question": None, "passage": "p", "answer": True},
     "line 1: field 'question' is null, not a string"),
    # HellaSwag's test split (label ""), a label past the endings, -1 (silently the last ending)
    ("hellaswag", "hellaswag/hellaswag_val.jsonl", {"ctx": "c", "endings": ["a", "b"], "label": ""},
     "line 1: label \"\" is not the index of one of its 2 endings"),
    ("hellaswag", "hellaswag/hellaswag_val.jsonl", {"ctx": "c", "endings": ["a", "b"], "label": 7},
     "line 1: label 7 is not the index"),
    ("hellaswag", "hellaswag/hellaswag_val.jsonl", {"ctx": "c", "endings": ["a", "b"], "label": -1},
     "line 1: label -1 is not the index"),
    ("hellaswag", "hellaswag/hellaswag_val.jsonl", {"ctx": "c", "endings": "a b", "label": 0},
     "line 1: endings is not a list of two or more strings"),
    # a digit int() refuses (a bare ValueError), and the prompt's own fields when present
    ("hellaswag", "hellaswag/hellaswag_val.jsonl", {"ctx": "c", "endings": ["a", "b"], "label": "\u00b2"},
     "line 1: label \".u00b2\" is not the index"),  # json.dumps writes it \\u00b2
    ("hellaswag", "hellaswag/hellaswag_val.jsonl", {"ctx": "c", "ctx_a": "c", "ctx_b": None, "endings": ["a", "b"],
                                                    "label": 0}, "line 1: field 'ctx_b' is null, not a string"),
    ("hellaswag", "hellaswag/hellaswag_val.jsonl", {"ctx": "c", "activity_label": 3, "endings": ["a", "b"],
                                                    "label": 0}, "line 1: field 'activity_label' is 3, not a string"),
    ("anli_r2", "anli/R2/test.jsonl", {"context": "c", "hypothesis": "h", "label": "x"},
     "line 1: label \"x\" not e/n/c"),
    ("lambada", "lambada/lambada_test.jsonl", {"text": 17}, "line 1: field 'text' is 17, not a string"),
])
def test_values_that_are_not_the_formats_are_refused_naming_the_line(tmp_path, task, path, row, message):
    f = tmp_path / path
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps(row) + "\n")
    with pytest.raises(TaskFileError, match=f"task '{task}': " + message.replace("(", r"\(")):
        load_task(task, tmp_path)


def test_hugging_face_style_string_labels_are_read(tmp_path):
    f = tmp_path / "hellaswag/hellaswag_val.jsonl"
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({"ctx": "c", "endings": ["a", "b"], "label": "1"}) + "\n")
    assert load_task("hellaswag", tmp_path).examples[0]["gold_text"] == "c b"


@pytest.mark.parametrize("answer", ["", "AB", 1])
def test_a_race_answer_that_is_not_one_letter_is_refused(tmp_path, answer):
    d = tmp_path / "race/test/high"
    d.mkdir(parents=True)
    (d / "1.txt").write_text(json.dumps({"article": "A.", "questions": ["Q?"], "options": [["a", "b", "c", "d"]],
                                         "answers": [answer], "id": "1.txt"}))
    with pytest.raises(TaskFileError, match="question 1: answer .* is not A-D"):
        load_task("race_h", tmp_path)
