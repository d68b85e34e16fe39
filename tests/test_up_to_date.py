"""A stage whose code, parameters and inputs are those of the run that made its outputs, with its outputs
whole, is not run again (tasks.core.uptodate): above all after a `dvc pull`, which brings a stage's kept
outputs and not its intermediate passes, so that walking the passes rebuilt every one of them."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tasks.core import registry
from tasks.core.config import parse_params
from tasks.core.runner import run_stage
from tasks.core.uptodate import kept_passes
from tests.conftest import small_raw

INTERMEDIATE = ("signatures", "exact", "buckets", "components")  # dedup's passes DVC does not keep


@pytest.fixture
def deduped(extracted, tmp_path):
    """A copy of the session's extracted data, with filter and dedup run on it."""
    shutil.copytree(extracted.paths.data_dir, tmp_path / "data")
    p = parse_params(small_raw(tmp_path / "data"))
    for s in ("filter", "dedup"):
        run_stage(s, p)
    return p


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def test_a_stage_restored_without_its_intermediate_passes_is_not_run_again(deduped):
    data = Path(deduped.paths.data_dir)
    stats = (data / "dedup/stats.json").read_bytes()
    for name in INTERMEDIATE:  # what a `dvc pull` leaves: the kept outputs, their markers and stats.json
        shutil.rmtree(data / "dedup" / name)
        (data / "dedup" / f"{name}.done.json").unlink(missing_ok=True)
    later = time.time() + 100  # and new times on every file it brings
    for f in sorted(data.rglob("*")):
        os.utime(f, (later, later))
    kept = files_of(data / "dedup")
    st = run_stage("dedup", deduped)
    assert st["up_to_date"] is True
    assert not any((data / "dedup" / name).exists() for name in INTERMEDIATE)  # nothing rebuilt
    assert files_of(data / "dedup") == kept and (data / "dedup/stats.json").read_bytes() == stats
    assert st["docs_out"] == json.loads(stats)["docs_out"]

    # the passes walked all the same (skip_up_to_date=False) rebuild them, and make the same outputs
    st = run_stage("dedup", deduped, skip_up_to_date=False)
    assert "up_to_date" not in st and all((data / "dedup" / name).exists() for name in INTERMEDIATE)
    assert [x["resumed"] for x in st["passes"] if x["name"] in ("aside", "remove")] == [st["shards"]] * 2


def test_what_the_stage_depends_on_or_an_output_that_changed_runs_it(deduped):
    data = Path(deduped.paths.data_dir)
    assert run_stage("dedup", deduped)["up_to_date"]
    # a parameter of an intermediate pass
    other = parse_params(small_raw(data, dedup={"threshold": 0.7}))
    assert "up_to_date" not in run_stage("dedup", other)
    assert run_stage("dedup", other)["up_to_date"]
    # an output shard removed, or edited (a new mtime: hashed again), is made again
    shard = sorted((data / "dedup/shards").glob("*.parquet"))[0]
    whole = shard.read_bytes()
    shard.unlink()
    st = run_stage("dedup", other)
    assert "up_to_date" not in st and shard.read_bytes() == whole
    shard.write_bytes(whole[:-8] + bytes(8))
    st = run_stage("dedup", other)
    assert "up_to_date" not in st and st["redone_corrupt"] == 1 and shard.read_bytes() == whole
    # a file added to a kept pass's folder
    (data / "dedup/aside/shards/stray.parquet").write_bytes(b"x")
    assert "up_to_date" not in run_stage("dedup", other)
    assert not (data / "dedup/aside/shards/stray.parquet").exists()
    # the input stage made other outputs
    before = run_stage("dedup", other)
    assert before["up_to_date"]
    filtered = parse_params(small_raw(data, dedup={"threshold": 0.7}, filter={"gopher_quality": {"min_words": 300}}))
    run_stage("filter", filtered)
    st = run_stage("dedup", filtered)
    assert "up_to_date" not in st and st["docs_in"] < before["docs_in"]


def test_a_failed_or_pending_validation_or_failed_shards_run_it_again(deduped):
    data = Path(deduped.paths.data_dir)
    path = data / "dedup/stats.json"
    stats = json.loads(path.read_text())
    for change in ({"validation": {"success": False}}, {"validation": {"success": None, "pending": True}},
                   {"failed_shards": [{"shard": "x", "inputs": [], "reason": "gone"}]}):
        path.write_text(json.dumps({**stats, **change}))
        assert "up_to_date" not in run_stage("dedup", deduped), change
    # a stats.json whose record of the outputs is not theirs (another run's, put back)
    run_stage("dedup", deduped)
    path.write_text(json.dumps({**json.loads(path.read_text()),
                                "fingerprint": {**stats["fingerprint"], "outputs": "0" * 16}}))
    assert "up_to_date" not in run_stage("dedup", deduped)


def test_a_changed_task_file_runs_the_stages_reading_it(small_params, benchmarks_dir, tmp_path):
    tasks = tmp_path / "benchmarks"
    shutil.copytree(benchmarks_dir, tasks)
    p = parse_params(small_raw(Path(small_params.paths.data_dir), paths={"benchmarks_dir": str(tasks)}))
    run_stage("sample", p)
    assert run_stage("sample", p)["up_to_date"]
    piqa = next(f for f in sorted(tasks.rglob("*")) if f.is_file() and "piqa" in str(f))
    piqa.write_bytes(piqa.read_bytes() + b"\n")
    assert "up_to_date" not in run_stage("sample", p)


def test_a_pass_reading_a_file_its_stage_does_not_declare_is_refused(small_params, monkeypatch):
    sample = registry.stage("sample")
    undeclared = dataclasses.replace(sample, other_inputs=lambda p, ctx: [])
    monkeypatch.setitem(registry._BY_NAME, "sample", undeclared)
    with pytest.raises(RuntimeError, match="pass 'corpus' reads .*, which is neither in its input stage's folder "
                                           "nor among the files the stage declares it reads"):
        run_stage("sample", small_params)
    # a file that appeared after the stage listed its inputs (a task file added meanwhile) is listed again
    calls = []

    def listed(p, ctx):
        calls.append(1)
        return sample.other_inputs(p, ctx) if len(calls) > 1 else []

    monkeypatch.setitem(registry._BY_NAME, "sample", dataclasses.replace(sample, other_inputs=listed))
    run_stage("sample", small_params)
    assert len(calls) == 2


def test_kept_passes_are_what_dvc_keeps():
    import yaml
    from tasks.core.stage import ShardedPass
    from tests.conftest import REPO

    outs = {name: d["outs"] for name, d in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].items()}
    for st in registry.STAGES:
        kept = {ps.name for ps in kept_passes(st)}
        for ps in st.passes:
            folder = str(st.pass_root("data", ps))
            tracked = folder in outs[st.name] or (isinstance(ps, ShardedPass) and f"{folder}/shards" in outs[st.name])
            assert tracked == (ps.name in kept), f"{st.name}.{ps.name}: kept {ps.name in kept}, in dvc.yaml {tracked}"


def test_a_changed_suite_runs_the_stage_and_its_validation_again(deduped, copied_sources):
    from tasks.core import source
    from tasks.validation import validation_of

    st = run_stage("filter", deduped, validation_follows=True)
    assert st["up_to_date"] and "validation" not in st  # the fixture's run was not validated: validated now
    assert validation_of("filter", deduped, st).success
    st = run_stage("filter", deduped, validation_follows=True)
    assert st["up_to_date"] and validation_of("filter", deduped, st).seconds == st["validation_seconds"]  # recorded
    suite = copied_sources / "tasks/validation/filter.py"
    suite.write_text(suite.read_text() + "\nCHANGED = 1\n")
    source._LOADED.clear()  # a new process
    assert "up_to_date" not in run_stage("filter", deduped, validation_follows=True)


def test_a_validation_parameter_is_part_of_the_key(deduped):
    """filter's suite bounds the classifier's kept fraction with parameters no pass reads."""
    assert run_stage("filter", deduped)["up_to_date"]
    strict = parse_params(small_raw(Path(deduped.paths.data_dir), filter={"classifier": {"min_kept": 0.99}}))
    assert "up_to_date" not in run_stage("filter", strict)


def cli(root: Path, stage: str) -> dict:
    from tests.test_errors import cli as command
    out = command(root, stage)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_command_keeps_a_recorded_validation_only_where_it_stands(deduped, tmp_path):
    import yaml

    data = Path(deduped.paths.data_dir)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(small_raw(data)))
    assert "up_to_date" not in cli(tmp_path, "filter")  # run without validation (the fixture): validated now
    stats = (data / "filter/stats.json").read_bytes()
    assert json.loads(stats)["validation"]["success"] is True
    assert cli(tmp_path, "filter")["up_to_date"] and (data / "filter/stats.json").read_bytes() == stats
    for name in ("rules", "score"):  # a `dvc pull`: the kept outputs, not the passes the suite reads
        shutil.rmtree(data / "filter" / name)
    assert cli(tmp_path, "filter")["up_to_date"] and not (data / "filter/rules").exists()
    shutil.rmtree(data / "docs/filter")  # a DVC output: its stage is run and validated again
    out = cli(tmp_path, "filter")
    assert "up_to_date" not in out and out["validation"]["batches"] > 0 and (data / "docs/filter/index.html").is_file()
    assert (data / "filter/rules").is_dir()


def test_inputs_through_links_lie_in_their_stage(deduped, tmp_path):
    """A DVC symlink cache, or a shards folder on another disk: the input stage's files are links."""
    data = Path(deduped.paths.data_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for f in sorted((data / "extract/shards").iterdir()):
        shutil.move(f, elsewhere / f.name)
        f.symlink_to(elsewhere / f.name)
    other = parse_params(small_raw(data, filter={"gopher_quality": {"min_words": 60}}))
    st = run_stage("filter", other)
    assert "up_to_date" not in st and st["docs_out"] > 0
