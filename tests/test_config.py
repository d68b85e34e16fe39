"""params.yaml -> typed models: one clear error per bad key, before any work starts."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tasks.core.config import ConfigError, PipelineParams, load_params, parse_params
from tests.conftest import REPO


def test_repo_params_yaml_is_valid():
    p = load_params(REPO / "params.yaml")
    assert isinstance(p, PipelineParams) and p.download.source == "sample"


def test_repo_params_yaml_names_every_parameter():
    """It is "the single source of every parameter": one left out (dedup.device, a profile's layernorm_eps)
    ran on a default no file showed. Models held in a dict (the train profiles) are walked too."""
    import yaml
    from pydantic import BaseModel

    def missing(model: BaseModel, raw: dict, where: str) -> list[str]:
        out = []
        for name in type(model).model_fields:
            value, key = getattr(model, name), f"{where}{name}"
            if not isinstance(raw, dict) or name not in raw:
                out.append(key)
            elif isinstance(value, BaseModel):
                out += missing(value, raw[name], f"{key}.")
            elif isinstance(value, dict) and all(isinstance(v, BaseModel) for v in value.values()):
                out += [m for k, v in value.items() for m in missing(v, raw[name].get(k), f"{key}.{k}.")]
        return out

    assert missing(load_params(REPO / "params.yaml"), yaml.safe_load((REPO / "params.yaml").read_text()), "") == []


@pytest.mark.parametrize("raw, needle", [
    ({"download": {"retires": 3}}, "download.retires: unknown key"),
    ({"extract": {"time_limit_s": "fast"}}, "extract.time_limit_s: Input should be a valid number"),
    ({"download": {"retries": 50}}, "download.retries: Input should be less than or equal to 20 (got 50)"),
    ({"download": {"base_url": "ftp://x"}}, "download.base_url: String should match pattern"),
    ({"runner": {"kind": "gpu"}}, "runner.kind: Input should be 'sequential', 'threads', 'processes' or 'dask'"),
    ({"sample": {"n_warc_files": 0}}, "sample.n_warc_files: Input should be greater than or equal to 1"),
    ({"filtr": {}}, "filtr: unknown key"),
    # an operator drill: .inf passed, to fail mid-stage (after the stage's last completion was gone)
    ({"tokenize": {"blend": [{"dataset": "web", "weight": float("inf")}]}},
     "tokenize.blend.0.weight: Input should be a finite number (got inf)"),
    ({"train": {"profiles": {"sample": {"optim": {"lr": float("inf")}}}}},
     "train.profiles.sample.optim.lr: Input should be a finite number (got inf)"),
])
def test_bad_values_name_key_and_expectation(raw, needle):
    with pytest.raises(ConfigError) as e:
        parse_params(raw)
    assert needle in str(e.value)


def test_bad_yaml_and_missing_file(tmp_path):
    (tmp_path / "p.yaml").write_text("download: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(tmp_path / "p.yaml")
    with pytest.raises(ConfigError, match="file not found"):
        load_params(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_params(tmp_path / "list.yaml")


def test_yaml_reads_numbers_as_people_write_them_and_refuses_the_yaml_1_1_surprises(tmp_path):
    """PyYAML (YAML 1.1) read `seed: 010` as 8 and `checkpoint_every: 1:30` as 90, and kept `lr: 3e-4` as text."""
    f = tmp_path / "p.yaml"
    f.write_text("train:\n  profiles:\n    sample:\n      optim: {lr: 3e-4, eps: 1e-8}\n")
    assert load_params(f).train.profiles["sample"].optim.lr == 3e-4
    for text, key in [("sample:\n  seed: 010\n", "sample.seed"), ("download:\n  n_files: 0123\n", "download.n_files"),
                      ("train:\n  checkpoint_every: 1:30\n", "train.checkpoint_every")]:
        f.write_text(text)
        with pytest.raises(ConfigError, match=rf"{key}: Input should be a valid integer \(got '[\d:]+'\)"):
            load_params(f)
    # a merge (<<: *anchor) is YAML's own, its keys given again after it; a key that is a list is one line
    f.write_text("train:\n  profiles:\n    sample: &s {seq_len: null}\n    other:\n      <<: *s\n      seq_len: 64\n")
    assert load_params(f).train.profiles["other"].seq_len == 64
    f.write_text("? [a, b]\n: 1\n")
    with pytest.raises(ConfigError, match=r"p.yaml: line 1: a key is a name, not a list$"):
        load_params(f)
    f.write_text("sample: {}\n")
    f.chmod(0)
    try:
        if not os.access(f, os.R_OK):  # (root reads it all the same where it may override permissions)
            with pytest.raises(ConfigError, match=r"p.yaml: cannot be read \(Permission denied\)$"):
                load_params(f)
    finally:
        f.chmod(0o644)


@pytest.mark.parametrize("raw,message", [
    ({"extract": {"lang_chars": 150}}, "extract: lang_min_chars 200 is more than the 150 characters language ID reads"),
    ({"filter": {"gopher_quality": {"min_stop_words": 9}}}, "min_stop_words: Input should be less than or equal to 8"),
    ({"train": {"profiles": {"sample": {"parallel": {"zero_stage": False}}}}},
     "parallel.zero_stage: the ZeRO stage is 0 or 1, not a yes/no (got False)"),
    ({"evaluate": {"tasks": ["boolq", "piqa", "boolq"]}}, "evaluate: tasks lists boolq twice"),
    ({"paths": {"data_dir": "$MTNLG_UNSET_VARIABLE/data"}}, "paths.data_dir: names $MTNLG_UNSET_VARIABLE, which is not set"),
])
def test_values_that_would_quietly_drop_everything_or_mean_another_thing_are_refused(raw, message, monkeypatch):
    """lang_min_chars above lang_chars made every page 'unknown' and the filter dropped the whole crawl, as 9 of
    Gopher's 8 stop words did; YAML's `off` for zero_stage turned ZeRO-1 off; a task listed twice was scored
    twice and failed the stage's validation after the work."""
    monkeypatch.delenv("MTNLG_UNSET_VARIABLE", raising=False)
    with pytest.raises(ConfigError) as e:
        parse_params(raw)
    assert message in str(e.value)


@pytest.mark.parametrize("section,key,value,message", [
    ("sample", "crawl_id", "CC-MAIN-2021-04",
     "tokenize.blend names CC-2020-50, but the crawl is CC-MAIN-2021-04 (its dataset: CC-2021-04)"),
    ("train", "profile", "gpt-350m",
     "train.profile 'gpt-350m' is for seq_len 2048 but the blend's samples hold tokenize.seq_length 128 tokens"),
    ("tokenize", "train_tokens", 100, "tokenize: train_tokens (100) is less than one sample of seq_length (128) tokens"),
])
def test_what_the_params_alone_rule_out_is_refused_as_they_are_read(section, key, value, message):
    """Each was refused by the stage that met it: the blend's snapshot after six stages, the profile's context
    length after seven (a gpt-350m run on params.yaml's 128-token blend)."""
    import yaml
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw[section][key] = value
    with pytest.raises(ConfigError) as e:
        parse_params(raw)
    assert str(e.value) == f"params: {message}"


def test_home_and_environment_variables_in_paths_are_expanded(monkeypatch, tmp_path):
    """`data_dir: ~/data` wrote into a folder named `~` inside the project."""
    monkeypatch.setenv("HOME", "/home/someone")
    monkeypatch.setenv("DATA_DISK", "/mnt/big")
    p = parse_params({"paths": {"data_dir": "~/mtnlg", "benchmarks_dir": "$DATA_DISK/benchmarks"},
                      "tokenize": {"tokenizer_file": "${DATA_DISK}/gpt2/vocab.json", "merges_file": "~/merges.txt"}})
    assert (p.paths.data_dir, p.paths.benchmarks_dir) == ("/home/someone/mtnlg", "/mnt/big/benchmarks")
    assert (p.tokenize.tokenizer_file, p.tokenize.merges_file) == ("/mnt/big/gpt2/vocab.json", "/home/someone/merges.txt")
    # a literal $: written $$, or in a path that exists as written (the diff review: such paths became unnameable)
    (tmp_path / "price$list.jsonl").write_text("{}\n")
    p = parse_params({"paths": {"data_dir": "out$$1"}, "download": {"curated": [{"path": str(tmp_path / "price$list.jsonl")}]}})
    assert p.paths.data_dir == "out$1" and p.download.curated[0].path == str(tmp_path / "price$list.jsonl")


def test_a_form_that_left_a_profiles_field_empty_takes_params_yamls_value():
    """The UI's custom-run form: a field emptied inside train.profiles (a dict of models) took the model's
    default (lr 3e-4 for params.yaml's 0.001, warmup 0 for 10,240), and the run's log did not name it."""
    from flows.stages import DEFAULT_PARAMS, filled_from
    form = DEFAULT_PARAMS.model_dump(mode="json")
    del form["download"]["n_files"]
    del form["train"]["profiles"]["sample"]["optim"]["lr"]
    del form["train"]["profiles"]["sample"]["schedule"]["warmup_tokens"]
    p, filled = filled_from(DEFAULT_PARAMS, PipelineParams.model_validate(form))
    assert filled == ["download.n_files", "train.profiles.sample.optim.lr", "train.profiles.sample.schedule.warmup_tokens"]
    assert p == DEFAULT_PARAMS


def test_cli_reports_config_error_before_work(tmp_path):
    (tmp_path / "params.yaml").write_text("extract:\n  extractor: regex\n")
    out = subprocess.run([sys.executable, "-m", "tasks", "extract"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 2
    assert "extract.extractor: Input should be 'resiliparse' or 'trafilatura'" in out.stderr
    assert not (tmp_path / "data").exists()
    (tmp_path / "params.yaml").write_text("{}\n")
    out = subprocess.run([sys.executable, "-m", "flows.pipeline", "params.yaml", "sample", "dedupe"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith(
        "configuration error: unknown stage 'dedupe': the stages are sample, download, extract"), out.stderr
    assert not (tmp_path / "data").exists()
    out = subprocess.run([sys.executable, "-m", "flows.pipeline", "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m flows.pipeline [params.yaml [stage ...]]")
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("section,seed", [("tokenize", -1), ("sample", 2**32), ("evaluate", -5)])
def test_a_seed_numpy_cannot_take_is_refused_up_front(section, seed):
    with pytest.raises(ConfigError, match=f"{section}.seed"):
        parse_params({section: {"seed": seed}})


def test_models_are_flow_parameters():
    """The Prefect flows take the same models, so the UI renders them as a form."""
    from prefect.utilities.callables import parameter_schema

    from flows.pipeline import pretraining_pipeline

    schema = parameter_schema(pretraining_pipeline.fn).model_dump()
    assert "params" in schema["properties"] and "PipelineParams" in str(schema["definitions"])
    assert "DownloadParams" in schema["definitions"]


def test_a_form_is_judged_across_sections_after_its_empty_fields_take_params_yamls_values():
    """The checks across fields ran as the form was validated, on the models' defaults in its emptied fields:
    a seq_length left empty was 2048 there, and a valid 1024-token profile was refused before params.yaml's
    1024 could be filled in (the session's diff review)."""
    import copy

    import yaml

    from flows.stages import filled_from
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["tokenize"].update(seq_length=1024, train_tokens=100_000)
    raw["train"]["profiles"]["gpu-1k"] = {**copy.deepcopy(raw["train"]["profiles"]["sample"]), "seq_len": 1024}
    raw["train"]["profile"] = "gpu-1k"
    defaults = parse_params(raw)
    form = defaults.model_dump(mode="json")
    del form["tokenize"]["seq_length"]
    p, filled = filled_from(defaults, PipelineParams.model_validate(form))
    assert filled == ["tokenize.seq_length"] and p.tokenize.seq_length == 1024 and p.across_sections() is None
    assert "is for seq_len 1024 but" in PipelineParams.model_validate(form).across_sections()


def test_every_field_of_the_custom_run_form_has_a_description():
    """The README promises the form 'a description on each' field; 69 of 197 had none (a newcomer's drill)."""
    from prefect.utilities.callables import parameter_schema

    from flows.pipeline import pretraining_pipeline
    schema = parameter_schema(pretraining_pipeline.fn).model_dump_for_openapi()
    fields = [f"{m}.{f}" for m, d in schema["definitions"].items() for f, s in d.get("properties", {}).items()
              if not s.get("description")]
    assert fields == []


def test_a_command_naming_a_projects_params_from_elsewhere_runs_in_that_project(tmp_path):
    """From another folder, the params file's relative paths were read from the working directory: a new
    data/ tree there, or 'benchmarks folder ../shared/benchmarks does not exist'. Found by an operator drill."""
    from tests.project_copy import copy_project
    repo = copy_project(tmp_path / "repo")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "sub").mkdir(parents=True)
    out = subprocess.run([sys.executable, "-m", "tasks", "sample", "--params", str(repo / "params.yaml")],
                         cwd=elsewhere, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"note: running in {repo}, the project of {repo / 'params.yaml'}" in out.stderr
    assert (repo / "data" / "sample" / "stats.json").is_file() and not (elsewhere / "data").exists()
    # from inside the project, with a relative path: the same, and the same outputs (up to date)
    out = subprocess.run([sys.executable, "-m", "tasks", "sample", "--params", "../params.yaml"], cwd=repo / "data",
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and '"up_to_date": true' in out.stdout, out.stderr[-2000:]
    assert not (repo / "data" / "data").exists()
    # a params file outside any project: its paths are read from the working directory, as before
    (elsewhere / "p.yaml").write_text("paths:\n  data_dir: out\n")
    out = subprocess.run([sys.executable, "-m", "tasks", "extract", "--params", "../p.yaml"], cwd=elsewhere / "sub",
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 4 and "note:" not in out.stderr, out.stderr
    assert "(out/download/stats.json missing)" in out.stderr and (elsewhere / "sub" / "out").is_dir()


def test_a_stage_run_from_inside_the_tasks_folder_finds_pythons_tokenize(tmp_path):
    """From inside tasks/, `python -m tasks` had tasks/tokenize stand in for Python's tokenize: every
    stage failed with "module 'tokenize' has no attribute 'tokenize'" (an operator drill)."""
    params = tmp_path / "p.yaml"
    params.write_text(f"paths:\n  data_dir: {tmp_path / 'data'}\n")
    out = subprocess.run([sys.executable, "-m", "tasks", "filter", "--params", str(params)], cwd=REPO / "tasks",
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 4 and "tokenize" not in out.stderr, out.stderr
    assert out.stderr.startswith("unfinished input: stage 'filter' needs stage 'extract' completed"), out.stderr


def test_yaml_errors_say_where_the_construct_began_and_checks_read_without_pydantics_prefix(tmp_path):
    """PyYAML marks where it noticed a problem, often lines after the one to fix (an operator drill read
    'line 99' for a quote left open on line 98); a section's own check read 'evaluate: Value error, ...'."""
    bad = tmp_path / "bad.yaml"
    bad.write_text('download:\n  crawl_id: "CC-MAIN-2020-50\n  n_files: 2\n')
    with pytest.raises(ConfigError, match=r"not valid YAML: line 4: found unexpected end of stream \(while scanning "
                                          r"a quoted scalar that began on line 2\)$"):
        load_params(bad)
    bad.write_text("evaluate:\n  fewshot_k: {lambada: 0}\n  tasks: [lambada]\n")
    with pytest.raises(ConfigError, match=r"^.*bad.yaml: evaluate: fewshot_k must be >= 1 \(got lambada: 0\)$"):
        load_params(bad)


def test_zero_stage_0_with_a_pipeline_is_refused_in_one_line(tmp_path):
    """DeepSpeed's stage-0 clipping counts the tied embedding on both end stages and leaves out later
    stages' replicated gradients: the clipping norm was 2.29 where it is 2.24 (a review's 2-stage run)."""
    import yaml
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["train"]["profiles"]["sample"]["parallel"]["zero_stage"] = 0
    with pytest.raises(ConfigError) as e:
        parse_params(raw)
    assert "train.profiles.sample.parallel: zero_stage 0 with pp > 1 clips by a wrong gradient norm" in str(e.value)
    assert len(str(e.value).splitlines()) == 1
    raw["train"]["profiles"]["sample"]["parallel"].update(pp=1, dp=2)  # no pipeline: stage 0 is taken
    parse_params(raw)
