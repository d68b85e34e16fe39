"""The Makefile's long-running commands under `kill <pid of make>`, as an operator or a process manager
sends it: SIGTERM to make alone, which make passes on to its child; everything make started stops."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tasks.core.lifeline import running
from tests.conftest import BIN, all_end, free_port, prefect_server
from tests.project_copy import copy_project
from tests.test_prefect import api, run
from tests.test_prefect_stop import TrickleHandler, children, cmdline, slow_crawl  # noqa: F401 - a fixture


def make(target: str, repo: Path, log: Path, *args: str, env: dict | None = None,
         in_the_background: bool = False) -> subprocess.Popen:
    """`make -o install <target>` in a project copy with this checkout's venv (installed already).
    `in_the_background`: with SIGINT ignored, as a shell starts a background job (`make worker &`) or nohup."""
    env = {k: v for k, v in (env or os.environ).items() if k not in ("PREFECT_API_URL", "MAKEFLAGS", "MAKELEVEL")}
    argv = ["make", "-o", "install", target, f"VENV={BIN.parent}", *args]
    if in_the_background:  # make's pid stays the process's: exec, not a child
        argv = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                "os.execvp(sys.argv[1], sys.argv[1:])", *argv]
    with open(log, "wb") as out:
        return subprocess.Popen(argv, cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).read()
        return True
    except OSError:
        return False


def kill_make(proc: subprocess.Popen, log: Path, started: list[int]) -> str:
    """SIGTERM to make alone (not its process group); then make and every process in `started` must
    end within 120 s. Returns the log."""
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("make was still running 120 s after its SIGTERM:\n" + log.read_text()[-3000:])
    all_end(started, 120)
    left = [cmdline(pid).replace(b"\0", b" ").decode() for pid in started if running(pid)]
    assert not left, f"still running after make was killed: {left}\n" + log.read_text()[-3000:]
    return log.read_text()


def kill_left(proc: subprocess.Popen, started: list[int]) -> None:
    """After a drill, pass or fail: kill -9 to make's process group and to whatever it started."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    found = children(pid)
    return found + [d for c in found for d in descendants(c)]


def test_kill_of_make_run_stops_the_pipeline(tmp_path):
    """make passed SIGTERM to a shell, which died of it, and the pipeline ran on, unseen, to its end."""
    repo = copy_project(tmp_path / "repo")
    log = tmp_path / "run.log"
    proc = make("run", repo, log)
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline and b"for flow 'stage-download'" not in log.read_bytes():
            time.sleep(0.1)
        pipeline = next((pid for pid in children(proc.pid) if b"flows.pipeline" in cmdline(pid)), None)
        assert pipeline is not None and proc.poll() is None, log.read_text()[-3000:]
        text = kill_make(proc, log, [pipeline])
        assert "interrupted: the pipeline stopped; rerun it to resume" in text and "Traceback" not in text, text[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_kill_of_make_repro_stops_the_stage_dvc_was_running(tmp_path, slow_crawl):
    """DVC dies of SIGTERM; the stage command it was running went on unseen, and held the stage's lock
    against the rerun (a training stage, for hours). Here a download of two slowly served files."""
    repo = copy_project(tmp_path / "repo", **slow_crawl)
    log = tmp_path / "repro.log"
    proc = make("repro", repo, log)
    stage = None
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and TrickleHandler.requests < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # the listing, then the first file (the stage command downloads one at a time)
        stage = next((pid for pid in descendants(proc.pid) if b"tasks\0download" in cmdline(pid)), None)
        assert stage is not None and proc.poll() is None, log.read_text()[-3000:]
        text = kill_make(proc, log, [stage])  # make passes it on to dvc
        assert "stage 'download': dvc repro, which ran it, is gone (killed?); stopping it" in text, text[-3000:]
        assert "interrupted: stage 'download' stopped; rerun it to resume" in text, text[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if stage is not None and running(stage):
            os.kill(stage, signal.SIGKILL)


def test_kill_of_make_ui_stops_both_servers(tmp_path):
    """The shell waited on the Prefect server in the foreground, and a waiting shell runs its traps only
    after that command: neither the Prefect server nor the Data Docs server stopped."""
    port, docs_port = free_port(), free_port()
    while docs_port == port:
        docs_port = free_port()
    repo = copy_project(tmp_path / "repo", paths={"docs_url": f"http://127.0.0.1:{docs_port}"})
    log = tmp_path / "ui.log"
    proc = make("ui", repo, log, f"PORT={port}", env={**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")})
    started = []
    try:
        api, docs = f"http://127.0.0.1:{port}/api/health", f"http://127.0.0.1:{docs_port}/index.html"
        deadline, up = time.monotonic() + 180, False
        while proc.poll() is None and time.monotonic() < deadline and not up:
            up = answers(api) and answers(docs)  # asked again after, a server busy starting may take > 2 s
            time.sleep(0.5)
        assert up, log.read_text()[-3000:]
        started = descendants(proc.pid)
        kill_make(proc, log, started)
        assert not answers(api) and not answers(docs)
    finally:
        kill_left(proc, started)


def test_kill_of_make_worker_stops_it_and_records_its_run_as_crashed(tmp_path):
    """Two defects of an operator drill. Prefect's worker answers SIGTERM by sending itself SIGINT, which a
    background job ignores: the worker ran on, executing scheduled runs, after `kill <make's pid>`. And a
    worker that stopped killed the runs it was executing with SIGKILL: the UI showed them Running for good."""
    # the scheduler off: the deployed */30 evaluation schedule's runs, due while the worker runs, were its run too
    with prefect_server(tmp_path / "home", PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED="false") as server:
        repo = copy_project(tmp_path / "repo")
        run([str(BIN / "prefect"), "work-pool", "create", "local-process", "--type", "process"], repo, server)
        run([str(BIN / "prefect"), "--no-prompt", "deploy", "--all"], repo, {**server, "PWD": str(repo)})
        port = server["PREFECT_API_URL"].split(":")[-1].split("/")[0]
        log = tmp_path / "worker.log"
        proc = make("worker", repo, log, f"PORT={port}", in_the_background=True,
                    env={**os.environ, "PREFECT_HOME": str(tmp_path / "home")})
        started = []
        try:
            dep = api(server, "/deployments/name/pretraining-pipeline/sample")
            flow_run = api(server, f"/deployments/{dep['id']}/create_flow_run", {})  # the UI's Run button
            # its first stage begun: the flow's own code has run (it guards the run's stop; before it, a stop
            # dropped in a finalizer leaves the worker to kill the run)
            first_stage = b"for flow 'stage-sample'"  # the only run: the scheduler is off
            deadline = time.monotonic() + 240
            while proc.poll() is None and time.monotonic() < deadline and first_stage not in log.read_bytes():
                time.sleep(0.2)
            assert api(server, f"/flow_runs/{flow_run['id']}")["state_type"] == "RUNNING", log.read_text()[-3000:]
            started = [proc.pid, *descendants(proc.pid)]
            text = kill_make(proc, log, started)
            assert "Sending SIGKILL" not in text  # stopped by the first SIGTERM, not killed by a second
            assert "worker stopped (SIGTERM); 1 run(s) it was executing stopped" in text, text[-3000:]
            state = api(server, f"/flow_runs/{flow_run['id']}")
            assert (state["state_type"], state["state"]["message"]) == \
                ("CRASHED", "Execution was aborted by a termination signal."), text[-3000:]
        finally:
            kill_left(proc, started)


def test_kill_of_make_bench_stops_the_benchmark_and_its_ranks(tmp_path):
    """A shell loop ran the benchmarks, and died of make's SIGTERM: the benchmark in progress ran on,
    unseen. Here benchmarks.train, during its parity run on 8 torchrun ranks."""
    repo = copy_project(tmp_path / "repo")
    log = tmp_path / "bench.log"
    proc = make("bench", repo, log, "-o", str(BIN.parent / ".bench-installed-stamp"), "BENCHES=train")
    started = []
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline and \
                sum(b"trainer.parity" in cmdline(pid) for pid in descendants(proc.pid)) < 9:
            time.sleep(0.2)  # torchrun and its 8 ranks
        started = descendants(proc.pid)
        assert proc.poll() is None and sum(b"trainer.parity" in cmdline(p) for p in started) >= 9, log.read_text()[-3000:]
        text = kill_make(proc, log, started)
        assert "interrupted (SIGTERM): benchmarks.train stopped; the steps after it not run" in text, text[-3000:]
    finally:
        kill_left(proc, started)
