"""Fail safely: every error is one line naming the file/key/stage and the cause, with a documented
exit code; a failed cleanup never hides the error; outputs stay as they were."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tasks.__main__ import main
from tasks.core.config import parse_params
from tasks.core.runner import adopt_outputs
from tasks.core.schema import write_docs
from tests.conftest import BENCHMARKS, REPO, copy_data, small_raw


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tasks", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("content, needle", [
    (b"", "params.yaml: empty; expected the sections of params.yaml"),
    (b"# only a comment\n", "params.yaml: empty"),
    (b"paths:\n  data_dir: \xff\n", "params.yaml: not UTF-8 (byte 0xff at offset 19)"),
    (b"download:\n  retries: 3\ndownload:\n  retries: 4\n", "params.yaml: line 3: duplicate key 'download'"),
    (b"extract:\n  lang_chars: 600\n  lang_chars: 700\n", "params.yaml: line 3: duplicate key 'lang_chars'"),
    (b"extract:\n  time_limit_s: \"600\"\n", "extract.time_limit_s: Input should be a valid number (got '600')"),
    (b"extract:\n  max_html_bytes: true\n", "extract.max_html_bytes: Input should be a valid integer (got True)"),
    (b"download: [unclosed\n", "params.yaml: not valid YAML: line 2:"),
])
def test_bad_params_files_are_one_line_exit_2(tmp_path, monkeypatch, capsys, content, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_bytes(content)
    assert main(["extract"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("configuration error: ") and needle in line, line
    assert not (tmp_path / "data").exists()


def test_params_that_is_a_directory_or_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    assert main(["extract", "--params", "conf"]) == 2
    assert one_line(capsys.readouterr().err) == "configuration error: conf: is a directory, not a params file"
    assert main(["extract", "--params", "nope.yaml"]) == 2
    assert one_line(capsys.readouterr().err) == "configuration error: nope.yaml: file not found"
    assert main(["no-such-stage"]) == 2
    assert "unknown stage 'no-such-stage'" in one_line(capsys.readouterr().err)


def _decontam_ready(root: Path, bench: Path) -> Path:
    root.mkdir()
    raw = small_raw(root / "data")
    raw["paths"]["benchmarks_dir"] = str(bench)
    raw["decontaminate"] = {"input_stage": "extract"}
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    p = parse_params(raw)
    (root / "data/extract/shards").mkdir(parents=True)
    write_docs(root / "data/extract/shards/s0.parquet", [
        {"id": "d0", "text": "some words " * 40, "dataset": "t", "url": "", "crawl": "", "lang": "en",
         "lang_score": 0.0}])
    adopt_outputs(p, "extract")
    return root


def test_task_file_errors_are_one_line_exit_2(tmp_path):
    bench = tmp_path / "bench"
    shutil.copytree(BENCHMARKS, bench, ignore=shutil.ignore_patterns("*.zip", "race", "hellaswag"))
    shutil.copytree(BENCHMARKS / "race", bench / "race")
    shutil.copytree(BENCHMARKS / "hellaswag", bench / "hellaswag")
    boolq = bench / "boolq/dev.jsonl"
    lines = boolq.read_text().splitlines()
    lines[2] = lines[2][:-5]  # a truncated JSON line
    boolq.write_text("\n".join(lines) + "\n")
    root = _decontam_ready(tmp_path / "w", bench)
    out = cli(root, "decontaminate")
    assert out.returncode == 2
    assert one_line(out.stderr).startswith("input file error: task 'boolq': line 3: not valid JSON")
    assert str(boolq) in out.stderr

    shutil.rmtree(bench)  # the whole benchmarks folder missing
    out = cli(root, "decontaminate")
    assert out.returncode == 2
    assert one_line(out.stderr) == f"input file error: task 'lambada': benchmarks folder {bench} does not exist"
    bench.mkdir()  # present but empty
    out = cli(root, "decontaminate")
    assert out.returncode == 2 and "file not found (expected file:" in one_line(out.stderr)

    out = cli(root, "decontaminate", "--verbose")  # the traceback only on request, the line last
    assert out.returncode == 2 and "Traceback" in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("input file error: task 'lambada'")




def _snapshot(folder: Path) -> dict:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def test_unwritable_output_folder_is_one_line_and_outputs_stay(tmp_path, downloaded):
    copy_data(downloaded, tmp_path)
    assert cli(tmp_path, "extract").returncode == 0
    stats = json.loads((tmp_path / "data/extract/stats.json").read_text())  # (a run that succeeds records
    assert 0 < stats["validation_seconds"] and stats["validation"]["success"] is True  # its validation's time)
    shards = tmp_path / "data/extract/shards"
    victim = sorted(shards.glob("CC-*.parquet"))[0]
    marker = tmp_path / "data/extract/completions" / f"{victim.stem}.json"
    marker.unlink()  # this shard must be rewritten, into a folder nobody may write to
    before = _snapshot(shards)
    if subprocess.run(["chattr", "+i", str(shards)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not permitted here")
    try:
        out = cli(tmp_path, "extract")
    finally:
        subprocess.run(["chattr", "-i", str(shards)], check=True)
    assert out.returncode == 1
    line = one_line(out.stderr)
    assert line.startswith("I/O error: Operation not permitted (EPERM): ") and str(shards) in line, line
    assert _snapshot(shards) == before
    assert not (tmp_path / "data/extract/stats.json").exists()


def test_full_disk_is_one_line_naming_the_path(tmp_path, downloaded):
    copy_data(downloaded, tmp_path)
    target = tmp_path / "data/extract"
    target.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(target)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs is not permitted here")
    try:
        out = cli(tmp_path, "extract")
        leftovers = [f for f in target.rglob(".tmp-*")]
    finally:
        subprocess.run(["umount", str(target)], check=True)
    assert out.returncode == 1
    line = one_line(out.stderr)
    assert line.startswith("I/O error: No space left on device (ENOSPC)") and str(target) in line, line
    assert leftovers == []


@pytest.fixture
def tiny_mount():
    """Mount a 64 KiB tmpfs on a folder (skips where mounting is not permitted); unmounted after."""
    mounted = []

    def mount(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                          capture_output=True).returncode != 0:
            pytest.skip("mounting a small tmpfs is not permitted here")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_full_disk_downloading_from_a_crawl_is_one_line_naming_the_path(tmp_path, tiny_mount):
    """Download from a crawl has no input stage: the check for a changed input after a failed pass asked for
    the input's folder and raised, so every such failure read `error: ValueError: stage 'download' has no
    input stage` (a full disk, a TLS error, a damaged curated file)."""
    import gzip

    from tasks.sample.server import StaticServer
    crawl = tmp_path / "www/crawl-data/CC-MAIN-2024-10"
    crawl.mkdir(parents=True)
    (crawl / "a.warc.gz").write_bytes(b"".join(gzip.compress(os.urandom(50_000), mtime=0) for _ in range(4)))
    (crawl / "warc.paths.gz").write_bytes(gzip.compress(b"crawl-data/CC-MAIN-2024-10/a.warc.gz\n", mtime=0))
    target = tiny_mount(tmp_path / "data/download")
    with StaticServer(tmp_path / "www") as url:
        raw = small_raw(tmp_path / "data", download={"source": "commoncrawl", "base_url": url, "n_files": 1,
                                                     "crawl_id": "CC-MAIN-2024-10", "retries": 0})
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
        out = cli(tmp_path, "download")
    assert out.returncode == 1
    line = one_line(out.stderr)
    assert line.startswith("I/O error: No space left on device (ENOSPC)") and str(target) in line, line


def test_a_full_disk_that_names_no_file_names_the_data_folder_and_its_space(tmp_path, tiny_mount):
    """numpy's np.save reports a short write as `N requested and M written` (no errno) and a plain
    file write as ENOSPC with no path: both name the run's data folder and the space left."""
    import numpy as np
    from tasks.core.errors import describe, naming_full_disk
    data = tiny_mount(tmp_path / "data")
    lines = []
    for write in (lambda: np.save(data / "a.npy", np.zeros(100_000)),
                  lambda: open(data / "b.bin", "wb").write(b"x" * 200_000)):
        with pytest.raises(OSError) as e:
            with naming_full_disk(data):
                write()
        lines.append(describe(e.value))
    (code, short), (code2, nospace) = lines
    assert code == code2 == 1
    assert short.startswith(f"I/O error: a write under {data} was cut short (") and " of 100000 items written; 0 B free "\
        "there, " in short and short.endswith("): is the disk full?"), short
    assert nospace.startswith(f"I/O error: No space left on device (ENOSPC) writing under {data} (0 B free there"), nospace


def test_full_data_docs_is_one_line_naming_the_full_file_system(tmp_path, downloaded, tiny_mount):
    """Great Expectations writes Data Docs with no path in its error: the line names the data folder and
    the space of each file system under it, the full one among them; the stage's outputs stay."""
    copy_data(downloaded, tmp_path)
    docs = tiny_mount(tmp_path / "data/docs")
    out = cli(tmp_path, "extract")
    assert out.returncode == 1
    line = one_line(out.stderr)
    assert line.startswith(f"I/O error: No space left on device (ENOSPC) writing under {tmp_path / 'data'} ("), line
    assert f"0 B in {docs}" in line, line
    assert json.loads((tmp_path / "data/extract/stats.json").read_text())["validation"]["pending"] is True


def test_a_data_docs_page_that_cannot_be_written_is_one_line_not_a_logged_traceback(tmp_path, downloaded):
    """GX's site builder catches a failed page write, logs 15 lines to stderr and goes on with an
    incomplete report: the run stops with one line instead (here a file stands where a folder goes;
    a full disk inside a page write was the case found, test above)."""
    copy_data(downloaded, tmp_path)
    site = tmp_path / "data/docs/extract"
    site.mkdir(parents=True)
    (site / "validations").write_text("not a folder")
    out = cli(tmp_path, "extract")
    assert out.returncode == 1
    line = one_line(out.stderr)
    assert line.startswith("I/O error: Not a directory"), line
    assert json.loads((tmp_path / "data/extract/stats.json").read_text())["validation"]["pending"] is True


def test_a_full_disk_with_no_file_named_without_a_mount(tmp_path, monkeypatch):
    """The same lines where mounting is not permitted (CI): an ENOSPC with no path and numpy's short
    write name the data folder; a failure while measuring the space still gives the line, never hides
    it; errors that name their file, or are not a full disk, pass through unchanged."""
    import errno
    from tasks.core import errors
    from tasks.core.errors import DiskFull, describe, naming_full_disk
    data = tmp_path / "data"
    (data / "docs").mkdir(parents=True)

    def raised(e: BaseException) -> BaseException:
        with pytest.raises(BaseException) as caught:
            with naming_full_disk(data):
                raise e
        return caught.value

    nospace = raised(OSError(errno.ENOSPC, "No space left on device"))
    assert isinstance(nospace, DiskFull)
    code, line = describe(nospace)
    assert code == 1 and line.startswith(f"I/O error: No space left on device (ENOSPC) writing under {data} ("), line
    assert " free there" in line, line
    code, line = describe(raised(OSError("5 requested and 3 written")))
    assert line.startswith(f"I/O error: a write under {data} was cut short (3 of 5 items written; "), line

    monkeypatch.setattr(errors, "_free_space_of", lambda folder: 1 / 0)
    code, line = describe(raised(OSError(errno.EDQUOT, "Disk quota exceeded")))
    assert line == f"I/O error: Disk quota exceeded (EDQUOT) writing under {data} (its free space unknown)", line

    named = OSError(errno.ENOSPC, "No space left on device", str(data / "x"))
    assert raised(named) is named
    denied = OSError(errno.EACCES, "Permission denied")
    assert raised(denied) is denied


def test_a_rank_line_keeps_its_kind_and_an_io_error_stays_a_training_error():
    """A training rank's one-line error becomes the same kind in the stage; an I/O line (a permission
    error as much as a full disk) stays a TrainingError, not DiskFull, which only the stage's own
    wrapper makes."""
    from tasks.core.errors import ConfigError, DiskFull, TrainingError, from_line
    assert type(from_line("configuration error: train.lr must be > 0")) is ConfigError
    for line in ("I/O error: Permission denied (EACCES): /data/x", "I/O error: No space left on device (ENOSPC)"):
        error = from_line(line, " (stage 'train')")
        assert type(error) is TrainingError and not isinstance(error, DiskFull), line
        assert str(error) == line + " (stage 'train')"
