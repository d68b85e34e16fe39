"""A stage run refused for a bad path or setting leaves the stage's last completion as it was: its
stats.json and its first pass's marker. These refusals were met inside a pass, after the runner had removed
both, so the next stage refused to start (exit 4) and the rerun after the fix redid the pass (found by a
drill editing params.yaml as a user would). Each is now the stage's declared check."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tasks.core.config import parse_params
from tasks.core.errors import ConfigError, InputFileError
from tasks.core.runner import adopt_outputs, run_stage
from tasks.core.schema import write_docs
from tests.conftest import BENCHMARKS

LAST = '{"stage": "%s", "from": "the last run"}'


def doc(i: int) -> dict:
    return {"id": f"d{i}", "text": f"document {i} " * 20, "dataset": "web", "url": "", "crawl": "", "lang": "en",
            "lang_score": 1.0}


def stage_with_a_last_run(data: Path, stage: str, marker: str | None, input_stage: str | None, p) -> dict[Path, str]:
    """The input stage's shards adopted, and this stage's last completion planted: its files and texts."""
    if input_stage is not None:
        (data / input_stage / "shards").mkdir(parents=True)
        write_docs(data / input_stage / "shards/s0.parquet", [doc(i) for i in range(3)])
        adopt_outputs(p, input_stage)
    planted = {data / stage / "stats.json": LAST % stage}
    if marker:
        planted[data / stage / marker] = json.dumps({"pass": marker, "fingerprint": "the last run's"})
    for path, text in planted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return planted


CASES = {  # stage: (its input stage, its first pass's marker, bad settings, the error, its line)
    "sample": (None, "corpus.done.json", {"paths": {"benchmarks_dir": "{tmp}/benchmarkz"}}, InputFileError,
               "task 'lambada': benchmarks folder .*benchmarkz does not exist"),
    # base_url on loopback: without the check, the pass's first request is refused here, and goes nowhere else
    "download": (None, None, {"download": {"source": "commoncrawl", "base_url": "http://127.0.0.1:9", "retries": 0,
                                           "curated": [{"path": "{tmp}/none/*.jsonl"}]}},
                 ConfigError, r"download.curated: .*none/\*.jsonl does not exist"),
    "filter": ("extract", None, {"filter": {"classifier": {"model_path": "{tmp}/model.npz"}}}, ConfigError,
               "filter.classifier.model_path: .*model.npz is not a quality model"),
    "decontaminate": ("extract", "index.done.json", {"decontaminate": {"input_stage": "extract"},
                                                     "paths": {"benchmarks_dir": "{tmp}/benchmarkz"}},
                      InputFileError, "task 'lambada': benchmarks folder .*benchmarkz does not exist"),
    "tokenize": ("decontaminate", "tokenizer.done.json", {"tokenize": {"tokenizer_file": "{tmp}/tokenizer.json"}},
                 InputFileError, "cannot load tokenizer from .*tokenizer.json"),
}


@pytest.mark.parametrize("stage", CASES)
def test_a_bad_path_is_refused_before_the_last_completion_goes(tmp_path, stage):
    input_stage, marker, bad, error, line = CASES[stage]
    raw = json.loads(json.dumps(bad).replace("{tmp}", str(tmp_path)))
    paths = {"data_dir": str(tmp_path / "data"), "benchmarks_dir": str(BENCHMARKS), **raw.pop("paths", {})}
    p = parse_params({"paths": paths, **raw})
    planted = stage_with_a_last_run(tmp_path / "data", stage, marker, input_stage, p)
    with pytest.raises(error, match=line):
        run_stage(stage, p)
    assert {path: path.read_text() for path in planted} == planted


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_evaluate_refuses_cuda_without_one_and_more_shots_than_the_split_holds(tmp_path):
    data = tmp_path / "data"
    for stage, extra in (("train", ', "adopted": true'), ("evaluate", "")):  # a model made elsewhere
        (data / stage).mkdir(parents=True)
        (data / stage / "stats.json").write_text(f'{{"stage": "{stage}", "from": "the last run"{extra}}}')
    for settings, line in (({"device": "cuda"}, "evaluate.device: cuda, and torch finds no CUDA device here"),
                           ({"tasks": ["piqa"], "fewshot_k": {"piqa": 500_000}},
                            "task piqa: 500000-shot needs 500001 few-shot examples, the few-shot split has 16113")):
        p = parse_params({"paths": {"data_dir": str(data), "benchmarks_dir": str(BENCHMARKS)}, "evaluate": settings})
        with pytest.raises(ConfigError, match=line):
            run_stage("evaluate", p)
        assert (data / "evaluate/stats.json").read_text() == LAST % "evaluate"


def test_an_empty_language_list_is_refused():
    with pytest.raises(ConfigError, match=r"filter.language: .*keep: empty, which drops every document"):
        parse_params({"filter": {"language": {"keep": []}}})


def test_a_pass_that_fails_before_it_changes_anything_leaves_the_last_completion(tmp_path, monkeypatch):
    """Any refusal, not only the declared checks': stats.json goes at a stage's first change to its outputs
    (a global pass's swap, a sharded pass's first shard), not when the run starts."""
    import tasks.sample.stage as sample
    from tasks.download.http_fetch import DownloadError
    p = parse_params({"paths": {"data_dir": str(tmp_path / "data"), "benchmarks_dir": str(BENCHMARKS)},
                      "download": {"source": "commoncrawl", "base_url": "http://127.0.0.1:9", "retries": 0}})

    def refuses(*_):
        raise ConfigError("a refusal met inside the build")
    monkeypatch.setattr(sample, "generate", refuses)
    planted = stage_with_a_last_run(tmp_path / "data", "sample", "corpus.done.json", None, p)
    (tmp_path / "data/sample/corpus").mkdir()  # the last run's output, beside its marker
    with pytest.raises(ConfigError, match="a refusal met inside the build"):
        run_stage("sample", p)
    assert {path: path.read_text() for path in planted} == planted and (tmp_path / "data/sample/corpus").is_dir()
    # a sharded pass refused while planning (Common Crawl's listing unreachable): before any shard changed
    planted = stage_with_a_last_run(tmp_path / "data", "download", None, None, p)
    with pytest.raises(DownloadError, match="warc.paths.gz: failed after 1 attempts"):
        run_stage("download", p)
    assert {path: path.read_text() for path in planted} == planted


def test_a_quick_run_refuses_a_params_yaml_that_does_not_read(tmp_path):
    """A UI quick run (the flows' default params) with a broken params.yaml ran on the models' defaults,
    without a word: it redid stages at vocabulary 50257 and began a 270-billion-token training run."""
    import os
    import subprocess
    import sys
    from tests.conftest import REPO
    (tmp_path / "params.yaml").write_text("download:\n  retries: 50\n")
    code = ("from flows.stages import DEFAULT_PARAMS, resolve\n"
            "from tasks.core.errors import describe\n"
            "try:\n    resolve(DEFAULT_PARAMS, None)\nexcept Exception as e:\n    print(describe(e)[1])\n"
            "custom = DEFAULT_PARAMS.model_copy(update={'download': DEFAULT_PARAMS.download.model_copy(update={'retries': 3})})\n"
            "print(resolve(custom, None).download.retries)")  # a custom run, its parameters given: taken
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.splitlines()[0] == (
        "configuration error: params.yaml: download.retries: Input should be less than or equal to 20 (got 50) "
        "(a quick run reads params.yaml: fix it, or give the run its parameters)"), out.stdout + out.stderr
    assert out.stdout.splitlines()[1] == "3"


@pytest.mark.parametrize("profile, needle", [
    ({"parallel": {"tp": 1, "pp": 2, "dp": 1, "micro_batch": 4, "global_batch": 10}},
     "train.profiles.sample: global_batch 10 is not divisible by micro_batch x dp = 4 x 1 = 4"),
    ({"parallel": {"tp": 3, "pp": 1, "dp": 1, "micro_batch": 4, "global_batch": 8}}, "train.profiles.sample: tp 3 does not divide n_head 4"),
    ({"schedule": {"rampup_start": 6, "rampup_increment": 4, "rampup_tokens": 64}},
     "train.profiles.sample: schedule.rampup_start 6 is not a multiple of micro_batch x dp = 4")])
def test_a_layout_or_ramp_that_cannot_work_is_refused_as_params_yaml_is_read(profile, needle):
    """A review: it was refused only as train started, after every data stage had run (hours, at scale)."""
    import yaml
    raw = yaml.safe_load((Path(__file__).parent.parent / "params.yaml").read_text())
    sample = raw["train"]["profiles"]["sample"]
    for key, value in profile.items():
        sample[key] = {**sample[key], **value}
    with pytest.raises(ConfigError, match=f"^params: {needle}$".replace("(", r"\(").replace(")", r"\)")):
        parse_params(raw)


def test_a_language_cut_below_extracts_is_refused():
    """A review: extract labels every text under lang_min_confidence 'unknown', so filter.language.min_score 0.3
    kept none of the texts between 0.3 and 0.5 it was set for, silently."""
    with pytest.raises(ConfigError, match=r"^params: filter.language.min_score 0.3 is below extract.lang_min_confidence "
                                          r"0.5: extract labels every text under 0.5 'unknown'"):
        parse_params({"filter": {"language": {"min_score": 0.3}}})
    parse_params({"filter": {"language": {"min_score": 0.3}}, "extract": {"lang_min_confidence": 0.3}})
    parse_params({"filter": {"language": {"min_score": 0.3, "keep": ["en", "unknown"]}}})  # it picks the unknown kept
    parse_params({"filter": {"language": {"min_score": 0.8}}})
