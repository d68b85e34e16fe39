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
