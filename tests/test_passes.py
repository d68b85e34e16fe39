"""Stages as declared passes: global passes get the same guarantees as shards (atomic output,
marker with fingerprint, kill -9 then rerun gives the same bytes), resume verifies content, and
no stage starts on an input stage that has not completed."""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tasks.core.config import parse_params
import numpy as np

from tasks.core.passes import load_stored, run_global, savez, tree_files
from tasks.core.runner import run_stage
from tests.conftest import REPO, copy_data, copy_stages, small_raw


def test_load_stored_maps_each_array_savez_wrote(tmp_path):
    c = np.arange(60, dtype=np.uint32).reshape(10, 6)
    arrays = {"c": c, "f": np.asfortranarray(c), "empty": np.zeros((0, 6), np.uint32), "scalar": np.array('["a"]'),
              "ids": np.array([b"x/1", b"yy/22"]), "big": np.arange(200_000, dtype=np.int64)}
    with open(tmp_path / "a.npz", "wb") as fh:
        savez(fh, **arrays)
    with np.load(tmp_path / "a.npz") as z:
        for name, a in arrays.items():
            m = load_stored(tmp_path / "a.npz", name)
            assert m.dtype == a.dtype and m.shape == a.shape and np.array_equal(m, a) and np.array_equal(z[name], a)
    band = load_stored(tmp_path / "a.npz", "f")[:, 2:4]  # permutation-major: a band is one contiguous run
    assert band.flags.f_contiguous and np.array_equal(band, c[:, 2:4])
    with pytest.raises(KeyError):
        load_stored(tmp_path / "a.npz", "missing")


def _build(tmp: Path, die_after: int | None = None) -> dict:
    for i in range(4):
        if die_after is not None and i == die_after:
            os.kill(os.getpid(), signal.SIGKILL)  # as a kill -9 from outside, mid-build
        (tmp / f"part-{i}.bin").write_bytes(bytes([i]) * 1000)
    return {"parts": 4}


def _killed_build(out: str, die_after: int) -> None:
    run_global(Path(out), Path(out + ".done.json"), lambda tmp: _build(tmp, die_after), "fp")


def test_global_pass_killed_mid_build_leaves_nothing_and_reruns_to_the_same_bytes(tmp_path):
    ref = tmp_path / "ref" / "table"
    assert run_global(ref, ref.with_name("table.done.json"), _build, "fp")["resumed"] == 0
    out = tmp_path / "work" / "table"
    marker = out.with_name("table.done.json")
    ctx = multiprocessing.get_context("fork")
    for die_after in (0, 2, 3):
        proc = ctx.Process(target=_killed_build, args=(str(out), die_after))
        proc.start()
        proc.join()
        assert proc.exitcode == -signal.SIGKILL
        assert not out.exists() and not marker.exists()  # only a hidden temp folder is left
    first = run_global(out, marker, _build, "fp")
    assert first["resumed"] == 0 and tree_files(out) == tree_files(ref)
    assert run_global(out, marker, _build, "fp")["resumed"] == 1

    # an output without its marker (a kill between rename and marker) is rebuilt
    marker.unlink()
    (out / "part-0.bin").write_bytes(b"half")
    assert run_global(out, marker, _build, "fp")["resumed"] == 0 and tree_files(out) == tree_files(ref)
    # changed bytes under a valid marker: redone and counted; changed fingerprint: redone
    (out / "part-1.bin").write_bytes(b"flipped")
    assert run_global(out, marker, _build, "fp")["redone_corrupt"] == 1 and tree_files(out) == tree_files(ref)
    assert run_global(out, marker, _build, "other-params")["resumed"] == 0


def cli(root: Path, stage: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "tasks", stage], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def content(stage_dir: Path) -> dict:
    return {str(f.relative_to(stage_dir)): f.read_bytes() for f in sorted(stage_dir.rglob("*"))
            if f.is_file() and "completions" not in f.parts and not f.name.endswith(("done.json", "stats.json", ".lock"))}


def test_kill_9_during_the_index_pass_then_rerun_is_byte_identical(tmp_path, extracted):
    copy_data(Path(extracted.paths.data_dir), tmp_path)
    p = parse_params(small_raw(tmp_path / "data"))
    for stage in ("filter", "dedup", "decontaminate"):
        run_stage(stage, p)  # in this process: the CLI runs are the killed ones and the last
    stage_dir = tmp_path / "data" / "decontaminate"
    reference = content(stage_dir)
    assert {"index/hashes.npy", "index/meta.json", "frequent/frequent.npy"} <= set(reference)
    for f in stage_dir.rglob("*.done.json"):
        f.unlink()  # the global passes must run again; the kill lands while the index is built
    (stage_dir / "stats.json").unlink()  # (the stage is otherwise up to date: its kept output is whole)
    killed_mid_index = 0
    for _ in range(3):
        proc = cli(tmp_path, "decontaminate")
        while proc.poll() is None and not any(stage_dir.glob(".tmp-index-*")):
            time.sleep(0.005)
        time.sleep(0.2)
        if proc.poll() is None:
            killed_mid_index += any(stage_dir.glob(".tmp-index-*"))
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not (stage_dir / "index.done.json").exists() or (stage_dir / "index").is_dir()
        assert not (stage_dir / "stats.json").exists()  # an interrupted stage never looks complete
    assert killed_mid_index >= 1, "no kill landed inside the index pass"
    proc = cli(tmp_path, "decontaminate")
    assert proc.wait() == 0, proc.stderr.read().decode()
    assert content(stage_dir) == reference
    assert not list(stage_dir.glob(".tmp-*"))


def test_resume_redoes_a_shard_whose_bytes_changed(small_params, extracted):
    copy_stages(Path(extracted.paths.data_dir), Path(small_params.paths.data_dir))
    shard = sorted((Path(small_params.paths.data_dir) / "extract/shards").glob("CC-*.parquet"))[0]
    good = shard.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # one flipped byte, same size
    shard.write_bytes(bytes(bad))
    again = run_stage("extract", small_params)
    assert again["redone_corrupt"] == 1 and again["resumed_shards"] == again["shards"] - 1
    assert shard.read_bytes() == good


def test_a_stage_refuses_an_input_stage_that_did_not_complete(tmp_path):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        small_raw(tmp_path / "data", sample={"n_warc_files": 6, "pages_per_warc": 80}, download={"n_files": 6})))
    for stage in ("sample", "download"):
        assert cli(tmp_path, stage).wait() == 0
    proc = cli(tmp_path, "extract")
    completions = tmp_path / "data/extract/completions"
    while proc.poll() is None and len(list(completions.glob("*.json")) if completions.exists() else []) < 1:
        time.sleep(0.005)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    out = subprocess.run([sys.executable, "-m", "tasks", "filter"], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 4, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"unfinished input: stage 'filter' needs stage 'extract' completed "
        f"({tmp_path / 'data/extract/stats.json'} missing): run `python -m tasks extract` first"]
    assert not (tmp_path / "data/filter/shards").exists() or not any((tmp_path / "data/filter/shards").iterdir())
    # run on another params file, the hint names it
    (tmp_path / "other.yaml").write_text((tmp_path / "params.yaml").read_text())
    out = subprocess.run([sys.executable, "-m", "tasks", "filter", "--params", "other.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 4 and out.stderr.strip().endswith(
        "run `python -m tasks extract --params other.yaml` first"), out.stderr


def test_an_unvalidated_stage_is_not_an_input_and_a_refused_run_keeps_the_last_completion(small_params):
    from tasks.core.errors import UnfinishedInput
    from tasks.core.runner import require_complete
    from tasks.validation import validate_stage

    run_stage("sample", small_params)
    # the CLI and the flows validate next; a kill before the result is recorded leaves it pending
    run_stage("download", small_params, validation_follows=True)
    with pytest.raises(UnfinishedInput, match="needs stage 'download' validated, and its validation did not finish"):
        require_complete(small_params, "download", "extract")
    validate_stage("download", small_params)
    require_complete(small_params, "download", "extract")
    stats = (Path(small_params.paths.data_dir) / "download/stats.json").read_text()
    (Path(small_params.paths.data_dir) / "sample/stats.json").unlink()
    with pytest.raises(UnfinishedInput, match="needs stage 'sample' completed"):
        run_stage("download", small_params)
    assert (Path(small_params.paths.data_dir) / "download/stats.json").read_text() == stats  # still complete, as it was


def test_a_stage_refuses_an_input_shard_missing_altered_or_foreign(extracted, tmp_path):
    import shutil

    from tasks.core.errors import UnfinishedInput

    data = tmp_path / "data"
    shutil.copytree(extracted.paths.data_dir, data)
    p = parse_params(small_raw(data))
    shards = data / "extract/shards"
    first = sorted(shards.glob("*.parquet"))[0]
    whole = first.read_bytes()
    cases = [(lambda: first.rename(tmp_path / "aside.parquet"), f"input shard {first} of stage 'extract' is missing"),
             (lambda: (tmp_path / "aside.parquet").rename(first), None),
             (lambda: first.write_bytes(whole[:-100]), f"input shard {first} has .* bytes, stage 'extract' wrote"),
             (lambda: first.write_bytes(whole), None),
             # same size, 64 bytes flipped mid-file (a disk error): the decoder fails, and the shard is named
             (lambda: first.write_bytes(whole[:len(whole) // 2] + bytes(b ^ 0xFF for b in whole[len(whole) // 2:][:64])
                                        + whole[len(whole) // 2 + 64:]),
              f"input shard {first} changed since stage 'extract' wrote it \\(same size, other bytes"),
             (lambda: first.write_bytes(whole), None),
             (lambda: (shards / "junk.parquet").write_bytes(b"PAR1"), "junk.parquet was not written by stage 'extract'")]
    for change, message in cases:
        change()
        if message:
            with pytest.raises(UnfinishedInput, match=message):
                run_stage("filter", p)
            assert not (data / "filter/stats.json").exists()


def test_a_stage_does_not_start_while_it_or_its_input_is_in_use(tmp_path):
    from tasks.core.runner import stage_lock

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(small_raw(tmp_path / "data")))
    p = parse_params(small_raw(tmp_path / "data"))
    with stage_lock(p, "filter"):  # as a filter run in progress: extract's folder is read, filter's written
        for stage, why in (("filter", "it is running already, or a stage reading it as input is"),
                           ("extract", "it is running already, or a stage reading it as input is"),
                           ("dedup", "its input stage 'filter' is running")):
            out = subprocess.run([sys.executable, "-m", "tasks", stage], cwd=tmp_path, capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
            assert (out.returncode, out.stderr.strip()) == (1, f"stage busy: stage '{stage}' cannot start: {why}, in "
                                                               f"{tmp_path / 'data'}")
        with stage_lock(parse_params(small_raw(tmp_path / "data", dedup={"input_stage": "extract"})), "dedup"):
            pass  # two readers of one input may run together
    with stage_lock(p, "filter"):  # released at the end of the run
        pass


def test_stats_name_every_pass_in_order(small_params, extracted):
    copy_stages(Path(extracted.paths.data_dir), Path(small_params.paths.data_dir))
    for s in ("filter", "dedup", "decontaminate"):
        stats = run_stage(s, small_params)
    assert [p["name"] for p in stats["passes"]] == ["index", "count", "frequent", "remove"]
    assert [p["kind"] for p in stats["passes"]] == ["global", "sharded", "global", "sharded"]
    assert run_stage("decontaminate", small_params)["up_to_date"]
    again = run_stage("decontaminate", small_params, skip_up_to_date=False)
    assert all(p["resumed"] == (p.get("shards") or 1) for p in again["passes"])
    assert json.loads((Path(small_params.paths.data_dir) / "decontaminate/stats.json").read_text())["passes"] == again["passes"]
    p = parse_params(small_raw(Path(small_params.paths.data_dir).parent / "data",
                               decontaminate={"margin_chars": 50}))
    changed = run_stage("decontaminate", p)  # only the removal pass depends on the margin
    assert [x["resumed"] for x in changed["passes"]] == [1, changed["shards"], 1, 0]


def test_what_a_worker_read_of_markers_lasts_one_stage_run(tmp_path):
    """Inputs count by the sha256 their pass's marker recorded, read once per change of the completions
    folder. A Dask worker lives across runs, and a folder rewritten within one tick of the file system's
    clock keeps its mtime: a new stage run drops what the worker read before."""
    from tasks.core.identity import input_stat, recorded_for
    shard = tmp_path / "extract" / "shards" / "a.parquet"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(b"PAR1")
    (tmp_path / "extract" / "completions").mkdir()

    def mark(sha: str) -> None:
        marker = tmp_path / "extract" / "completions" / "a.json"
        marker.write_text(json.dumps({"shard": "a", "output": "a.parquet", "bytes": 4, "sha256": sha}))
        os.utime(marker.parent, ns=(1, 1))  # the folder's mtime as it was: same tick

    mark("aaaa")
    recorded_for("run-1")
    assert input_stat([str(shard)]) == [["sha256", "aaaa"]]
    mark("bbbb")
    assert input_stat([str(shard)]) == [["sha256", "aaaa"]]  # within the run: read once
    recorded_for("run-2")
    assert input_stat([str(shard)]) == [["sha256", "bbbb"]]
    shard.write_bytes(b"PAR12")  # not the size the marker recorded: by its own content
    assert input_stat([str(shard)]) == [["sha256", hashlib.sha256(b"PAR12").hexdigest()]]


def test_an_input_no_pass_wrote_counts_by_content_when_small(tmp_path):
    """Task files, a user's tokenizer file: a fresh copy of them (new mtimes) redoes nothing, an edit at
    the same size does."""
    from tasks.core import identity
    task = tmp_path / "boolq" / "dev.jsonl"
    task.parent.mkdir()
    task.write_text('{"question": "is it?"}\n')
    identity.recorded_for("run-1", tmp_path / "data")
    first = identity.input_stat([str(task)])
    os.utime(task, (time.time() + 100, time.time() + 100))
    assert identity.input_stat([str(task)]) == first
    task.write_text('{"question": "is it!"}\n')
    assert identity.input_stat([str(task)]) != first
    assert not (tmp_path / "data").exists()  # small ones are hashed each run, not remembered


def counting_hashes(monkeypatch) -> list:
    """The files identity hashes from now on, in order."""
    from tasks.core import identity
    hashed, real = [], identity.file_sha256
    monkeypatch.setattr(identity, "file_sha256", lambda p: hashed.append(Path(p).name) or real(p))
    return hashed


def test_a_large_input_no_pass_wrote_is_hashed_once_per_change_of_its_size_or_mtime(tmp_path, monkeypatch):
    """A user's curated corpus (hundreds of GB) copied to a new disk got new mtimes, and counted by size
    and mtime, download converted all of it again. Now it is hashed once after the copy, remembered
    under the data folder, and found the same; hashed again when its size, mtime or ctime changes."""
    from tasks.core import identity
    monkeypatch.setattr(identity, "SMALL_INPUT", 4)
    monkeypatch.setattr(identity, "RACY_NS", 0)  # (its own case below)
    corpus = tmp_path / "pile" / "00.jsonl.zst"
    corpus.parent.mkdir()
    corpus.write_bytes(b"zstd frames")
    hashed = counting_hashes(monkeypatch)

    def stat(run: str) -> list:
        identity.recorded_for(run, tmp_path / "data")
        return identity.input_stat([str(corpus)])

    first = stat("run-1")
    assert first == [["sha256", hashlib.sha256(b"zstd frames").hexdigest()]] and len(hashed) == 1
    assert stat("run-2") == first and len(hashed) == 1  # remembered across runs
    old = corpus.stat().st_mtime_ns
    copied = time.time() - 50
    os.utime(corpus, (copied, copied))  # a copy: same bytes, another mtime
    assert stat("run-3") == first and len(hashed) == 2
    assert stat("run-4") == first and len(hashed) == 2
    corpus.write_bytes(b"zstd FRAMES")  # same size, other bytes
    assert stat("run-5") == [["sha256", hashlib.sha256(b"zstd FRAMES").hexdigest()]]
    corpus.write_bytes(b"zstd frames")
    os.utime(corpus, ns=(old, old))  # the first version put back with its mtime (rsync -a): a new ctime
    assert stat("run-6") == first
    assert not [f for f in (tmp_path / "data" / ".input-hashes").iterdir() if f.name.startswith(".tmp-")]
    identity.recorded_for("run-7")  # nowhere to remember: size and mtime, never a read of it all each run
    st = corpus.stat()
    assert identity.input_stat([str(corpus)]) == [[st.st_size, st.st_mtime_ns]]
    monkeypatch.setattr(identity, "RACY_NS", 10 ** 15)  # written within a clock tick of the hash: a writer
    corpus.write_bytes(b"zstd frames, more")             # may still be at it, so it is not remembered
    n = len(hashed)
    assert stat("run-8") == stat("run-9") == [["sha256", hashlib.sha256(b"zstd frames, more").hexdigest()]]
    assert len(hashed) == n + 2


def test_a_pass_written_input_edited_after_its_marker_counts_by_its_new_content(tmp_path, monkeypatch):
    """The recorded sha256 stands for a file only while the file is no newer than the record: an edit at
    the same size (a hand fix, a bad disk) after the pass wrote it is another input, even one put back
    with an old mtime (`cp -p`: its ctime is new); a file that only got a new mtime (a copy, `dvc
    checkout` in any order) is hashed once, at any size, and found the same."""
    from tasks.core import identity
    monkeypatch.setattr(identity, "SMALL_INPUT", 0)  # the rule for pass-written files holds at any size
    monkeypatch.setattr(identity, "RACY_NS", 0)
    root = tmp_path / "extract"
    shard, marker, done = root / "shards" / "a.parquet", root / "completions" / "a.json", tmp_path / "tok.done.json"
    shard.parent.mkdir(parents=True)
    marker.parent.mkdir()
    vocab = tmp_path / "tok" / "vocab.json"
    vocab.parent.mkdir()
    for path, data in ((shard, b"PAR1"), (vocab, b'{"a": 1}')):
        path.write_bytes(data)
    written_at = max(f.stat().st_ctime_ns for f in (shard, vocab))
    marker.write_text(json.dumps({"shard": "a", "output": "a.parquet", "bytes": 4,
                                  "sha256": hashlib.sha256(b"PAR1").hexdigest()}))
    done.write_text(json.dumps({"files": {"vocab.json": hashlib.sha256(b'{"a": 1}').hexdigest()}}))
    for record in (marker, done):  # the pass writes its records after its files
        os.utime(record, ns=(written_at, written_at))
    hashed = counting_hashes(monkeypatch)
    inputs = [str(shard), str(vocab)]

    def stat(run: str) -> list:
        identity.recorded_for(run, tmp_path / "data")
        return identity.input_stat(inputs)

    written = stat("run-1")
    assert written == [["sha256", hashlib.sha256(b"PAR1").hexdigest()], ["sha256", hashlib.sha256(b'{"a": 1}').hexdigest()]]
    assert hashed == []  # by the records
    time.sleep(0.05)  # past the records' time on the file system's coarse clock
    for path in (shard, vocab):
        os.utime(path, ns=(written_at + 1, written_at + 1))  # newer than their records, same bytes
    assert stat("run-2") == written and len(hashed) == 2
    assert stat("run-3") == written and len(hashed) == 2  # remembered
    shard.write_bytes(b"PAR2")
    os.utime(shard, ns=(written_at, written_at))  # another version put back with the old mtime
    vocab.write_bytes(b'{"b": 1}')
    assert stat("run-4") == [["sha256", hashlib.sha256(b"PAR2").hexdigest()],
                             ["sha256", hashlib.sha256(b'{"b": 1}').hexdigest()]]
    identity.recorded_for("run-5")  # nowhere to remember: hashed all the same
    os.utime(shard, ns=(written_at + 2, written_at + 2))
    assert identity.input_stat(inputs)[0] == ["sha256", hashlib.sha256(b"PAR2").hexdigest()]
