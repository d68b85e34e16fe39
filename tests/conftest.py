"""Shared fixtures. Environment set before Prefect/GX import: no analytics, temp PREFECT_HOME."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

_PREFECT_HOME = tempfile.mkdtemp(prefix="prefect-home-")
os.environ["PREFECT_HOME"] = _PREFECT_HOME
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["DVC_NO_ANALYTICS"] = "1"
os.environ["GX_ANALYTICS_ENABLED"] = "False"
os.environ.setdefault("OMP_NUM_THREADS", "1")
# a loaded 2-core CI machine needs more than Prefect's default 20 s to start a temporary server
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
os.environ.pop("PREFECT_API_URL", None)

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = (REPO.parent / "shared" / "benchmarks").resolve()
BIN = Path(sys.executable).parent  # the venv's prefect, dvc


@pytest.fixture(scope="session")
def benchmarks_dir() -> Path:
    if not BENCHMARKS.is_dir():
        pytest.fail(f"{BENCHMARKS} missing: tests need ../shared/benchmarks beside the repo")
    return BENCHMARKS


def small_raw(data_dir: Path, **over) -> dict:
    raw = {
        "paths": {"data_dir": str(data_dir), "benchmarks_dir": str(BENCHMARKS)},
        "sample": {"n_warc_files": 2, "pages_per_warc": 20, "curated_docs_per_dataset": 10},
        "download": {"n_files": 2, "backoff_s": 0.01},
        "runner": {"kind": "threads", "max_workers": 2},
    }
    for k, v in over.items():
        raw.setdefault(k, {}).update(v)
    return raw


@pytest.fixture
def copied_sources(tmp_path, monkeypatch) -> Path:
    """A copy of tasks/ digested in place of the repo's sources (which stay as they are), with what this
    process loaded forgotten (tasks.core.source): the test edits stage code in the copy."""
    import shutil

    from tasks.core import source
    src = tmp_path / "src"
    shutil.copytree(REPO / "tasks", src / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(source, "SOURCE_ROOT", src)
    monkeypatch.setattr(source, "_LOADED", {})
    return src


@pytest.fixture
def small_params(tmp_path):
    from tasks.core.config import parse_params

    return parse_params(small_raw(tmp_path / "data"))


@pytest.fixture(scope="session")
def extracted(tmp_path_factory):
    """A data dir where sample -> download -> extract already ran (small sample)."""
    from tasks.core.config import parse_params
    from tasks.core.runner import run_stage

    p = parse_params(small_raw(tmp_path_factory.mktemp("pipeline") / "data"))
    for s in ("sample", "download", "extract"):
        run_stage(s, p)
    return p


@pytest.fixture(scope="session")
def downloaded(tmp_path_factory) -> Path:
    """A data dir where sample -> download already ran (small sample), for tests to copy (`copy_data`):
    each test that ran the two stages itself spent ~10 s on the same bytes."""
    from tasks.core.config import parse_params
    from tasks.core.runner import run_stage

    data = tmp_path_factory.mktemp("downloaded") / "data"
    p = parse_params(small_raw(data))
    for s in ("sample", "download"):
        run_stage(s, p)
    return data


def copy_stages(template: Path, data: Path) -> None:
    """The stages a session fixture's data dir `template` ran (`downloaded`, `extracted`), copied to `data`
    for a test to go on from; copy2 keeps mtimes and sizes: the outputs stay as their stage recorded them."""
    import shutil
    shutil.copytree(template, data, ignore=shutil.ignore_patterns(
        "filter", "dedup", "decontaminate", "tokenize", "train", "evaluate"))


def copy_data(template: Path, root: Path) -> None:
    """`copy_stages` to root/data, with root/params.yaml (small_raw) pointing at it."""
    import yaml
    copy_stages(template, root / "data")
    (root / "params.yaml").write_text(yaml.safe_dump(small_raw(root / "data")))


def free_port() -> int:  # a port no other test's bind(0) or connection is handed meanwhile
    from trainer.launch import free_port as below_the_ephemeral_range

    return below_the_ephemeral_range()


def all_end(pids: list[int], within_s: float) -> bool:
    """Whether every process has ended, or ends within `within_s` (one just signalled, or killed with
    SIGKILL, may not have been scheduled to die yet)."""
    from tasks.core.lifeline import running
    deadline = time.monotonic() + within_s
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(map(running, pids))


@contextlib.contextmanager
def prefect_server(home: Path, **settings: str):
    """A real `prefect server start` on 127.0.0.1 with its home in `home` and these settings; yields its
    environment (PREFECT_API_URL ...); stopped by its pid."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": api, "PREFECT_UI_URL": f"http://127.0.0.1:{port}",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PATH": f"{BIN}:{os.environ['PATH']}", **settings}
    log = open(home / "server.log", "w")
    proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 180
        while True:
            try:
                urllib.request.urlopen(f"{api}/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail("prefect server did not start:\n" + (home / "server.log").read_text()[-3000:])
                time.sleep(0.5)
        yield env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """A real `prefect server start` on 127.0.0.1, one for the session (its start is ~15 s), stopped by its pid.
    The tests trigger every run themselves; the scheduler would add runs of the deployed */30 evaluation
    schedule, which a `worker --run-once` near :00 or :30 picks up beside the test's own."""
    with prefect_server(tmp_path_factory.mktemp("prefect-server-home"),
                        PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED="false") as env:
        yield env
