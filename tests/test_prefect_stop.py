"""Stopping runs, against a real Prefect server on 127.0.0.1 where one is needed: kill -9 and Ctrl-C
(SIGINT, SIGTERM) of a command-line run, and a cancel from the UI, each stopping the shards in progress
and leaving no temporary server behind."""
from __future__ import annotations

import contextlib
import gzip
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tasks.core import lifeline
from tasks.sample.server import StaticHandler, StaticServer
from tests.conftest import BIN, REPO, free_port
from tests.project_copy import copy_project
from tests.test_prefect import api, run


def test_a_killed_command_line_run_leaves_no_temporary_server(tmp_path):
    # `make run` killed by kill -9 (or the OOM killer) left Prefect's temporary server serving forever
    repo = copy_project(tmp_path / "repo")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # Prefect starts its own server
    proc = subprocess.Popen([sys.executable, "-m", "flows.pipeline", "params.yaml", "sample"], cwd=repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server, deadline = None, time.monotonic() + 300
    try:
        while server is None and proc.poll() is None and time.monotonic() < deadline:
            server = next((pid for pid in children(proc.pid) if b"uvicorn" in cmdline(pid)), None)
            time.sleep(0.05)
        assert server is not None, "no temporary server seen while the run ran"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60  # the watcher checks every second; SIGKILL follows SIGTERM after 5 s
        while lifeline.running(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not lifeline.running(server), f"Prefect's temporary server {server} outlived the killed run"
    finally:
        proc.kill()
        if server is not None and lifeline.running(server):
            os.kill(server, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_of_a_command_line_run_ends_it_at_once_and_leaves_no_server(tmp_path, sig):
    """Ctrl-C in a terminal signals the whole foreground process group, Prefect's temporary server with
    it: the run then spent minutes retrying its last API calls against the dead server before it exited.
    `timeout` and `kill -TERM -PGID` send SIGTERM to the group: the same, with ~240 lines of tracebacks
    (found by an operator drill)."""
    repo = copy_project(tmp_path / "repo")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # Prefect starts its own server
    log = tmp_path / "run.log"
    proc = from_a_terminal([sys.executable, "-m", "flows.pipeline", "params.yaml"], repo, env, log)
    server, deadline = None, time.monotonic() + 300
    try:
        while proc.poll() is None and time.monotonic() < deadline and b"for flow 'stage-download'" not in log.read_bytes():
            time.sleep(0.1)
        server = next((pid for pid in children(proc.pid) if b"uvicorn" in cmdline(pid)), None)
        assert server is not None and proc.poll() is None, log.read_text()[-3000:]
        os.killpg(proc.pid, sig)  # what Ctrl-C does (SIGINT), or `timeout` (SIGTERM)
        try:
            code = proc.wait(timeout=120)  # minutes before; a few seconds now
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run was still going 120 s after {sig.name}:\n" + log.read_text()[-3000:])
        text = log.read_text()
        assert "had not stopped" not in text, text[-6000:]  # ended by tasks.core.interrupts' limit, not by itself
        assert code == 128 + sig, text[-3000:]
        assert "interrupted: the pipeline stopped; rerun it to resume" in text and "Traceback" not in text, text[-3000:]
        cause = "an interrupt signal" if sig == signal.SIGINT else "a termination signal"
        assert f"Crashed('Execution was aborted by {cause}.')" in text, text[-6000:]  # recorded while the server lived
        assert not lifeline.running(server), "Prefect's temporary server outlived the run"
    finally:
        proc.kill()
        if server is not None and lifeline.running(server):
            os.kill(server, signal.SIGKILL)


def from_a_terminal(cmd: list[str], cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    """Start `cmd` as a shell started from a terminal runs it: its own process group (Ctrl-C signals
    the group), SIGINT neither ignored nor blocked (a test runner or a `&` job may have either)."""
    start = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
             "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); os.execv(sys.executable, sys.argv[1:])")
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-c", start, *cmd], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, process_group=0)


class TrickleHandler(StaticHandler):
    """Serves each file slowly, as a far or loaded server does a 1 GB WARC file: 4 KiB per 50 ms until
    the file ends or the test releases it."""
    release = threading.Event()
    requests = 0

    def send_body(self, data: bytes, start: int, status: int) -> None:
        TrickleHandler.requests += 1  # the server serves a subclass bound to its root
        self.send_response(status)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.close_connection = True
        with contextlib.suppress(ConnectionError):  # the client went away: what an interrupt does
            for at in range(start, len(data), 4096):
                if self.release.is_set():
                    break
                self.wfile.write(data[at:at + 4096])
                self.wfile.flush()
                time.sleep(0.05)


@pytest.fixture
def slow_crawl(tmp_path):
    """A crawl listing two WARC files that a server on 127.0.0.1 trickles (about 6 minutes each);
    yields its base URL and the params that download it with two threads."""
    root = tmp_path / "served"
    listing = root / "crawl-data/CC-MAIN-2020-50/warc.paths.gz"
    listing.parent.mkdir(parents=True)
    names = [f"crawl-data/CC-MAIN-2020-50/segments/1/warc/CC-MAIN-20201123153826-20201123183826-0000{i}.warc.gz"
             for i in range(2)]
    listing.write_bytes(gzip.compress("\n".join(names).encode(), mtime=0))
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(os.urandom(30 << 20))  # 30 MiB at 80 KiB/s: about 6 minutes
    TrickleHandler.release.clear()
    TrickleHandler.requests = 0
    with StaticServer(root, TrickleHandler) as url:
        try:
            yield {"download": {"source": "commoncrawl", "base_url": url, "crawl_id": "CC-MAIN-2020-50", "n_files": 2},
                   "runner": {"kind": "threads", "max_workers": 2}}
        finally:
            TrickleHandler.release.set()


def both_files_under_way(proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 300
    while proc.poll() is None and TrickleHandler.requests < 3 and time.monotonic() < deadline:
        time.sleep(0.1)  # the listing, then both files
    assert proc.poll() is None and TrickleHandler.requests == 3, log.read_text()[-3000:]


def no_download_done(repo: Path) -> None:
    done, shards = repo / "data/download/completions", repo / "data/download/shards"
    assert not done.exists() or list(done.iterdir()) == []
    assert not shards.exists() or list(shards.iterdir()) == []  # no partial file passes for a download


def test_ctrl_c_stops_the_shards_in_progress_not_after_them(tmp_path, slow_crawl):
    """Only the main thread gets Ctrl-C's KeyboardInterrupt, and the task runner's exit waits for its
    threads: the run went on until every shard in progress had finished (with real WARC files, many
    minutes) before it said it was interrupted."""
    repo = copy_project(tmp_path / "repo", **slow_crawl)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    log = tmp_path / "run.log"
    proc = from_a_terminal([sys.executable, "-m", "flows.pipeline", "params.yaml", "download"], repo, env, log)
    try:
        both_files_under_way(proc, log)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("the run was still going 120 s after Ctrl-C:\n" + log.read_text()[-3000:])
    finally:
        proc.kill()
    text = log.read_text()
    assert code == 130 and "interrupted: the pipeline stopped; rerun it to resume" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert text.count("Finished in state Crashed('Execution was aborted by an interrupt signal.')") >= 2 + 2, text[-3000:]
    no_download_done(repo)


def test_cancel_from_the_ui_stops_the_shards_in_progress(server, tmp_path, slow_crawl):
    """Cancel on a deployment's run, as the UI sends it: the shards in progress went on to their end
    before the run was cancelled."""
    repo = copy_project(tmp_path / "repo", **slow_crawl)
    prefect = str(BIN / "prefect")
    run([prefect, "work-pool", "create", "local-process", "--type", "process", "--overwrite"], repo, server)
    run([prefect, "--no-prompt", "deploy", "--all"], repo, {**server, "PWD": str(repo)})
    out = run([prefect, "deployment", "run", "pretraining-pipeline/sample", "--param", 'stages=["download"]'],
              repo, server)
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)
    log = tmp_path / "worker.log"
    with open(log, "wb") as sink:
        worker = subprocess.Popen([prefect, "worker", "start", "--pool", "local-process", "--run-once"], cwd=repo,
                                  env=server, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        both_files_under_way(worker, log)
        api(server, f"/flow_runs/{run_id}/set_state", {"state": {"type": "CANCELLING", "name": "Cancelling"},
                                                        "force": True})
        try:
            worker.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("the run was still going 120 s after its cancel:\n" + log.read_text()[-3000:])
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever the run left (nothing, once it works)
            os.killpg(worker.pid, signal.SIGKILL)
    assert api(server, f"/flow_runs/{run_id}")["state_type"] in ("CANCELLING", "CANCELLED"), log.read_text()[-3000:]
    no_download_done(repo)


def children(pid: int) -> list[int]:
    return [child for child, fields in lifeline.live_processes() if fields[1] == b"%d" % pid]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


# A deployment's flow, run as a worker runs it: SIGTERM lands while a finalizer runs in the main thread
# (Prefect's handler raises TerminationSignal there, which Python drops), then the flow goes on
SIGTERM_IN_A_FINALIZER = """
    import signal, sys, time
    import {module} as entry
    from tasks.core.errors import ConfigError

    class Finalized:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)  # the worker's stop, with Prefect's handler in place

    def resolve(params, params_file):  # the flow's first call
        from prefect.runtime import flow_run
        print(flow_run.id, flush=True)
        kept = Finalized()
        del kept
        for _ in range(3000):  # up to 30 s of the run going on
            time.sleep(0.01)
        raise ConfigError("went on")

    entry.resolve = resolve
    print(entry.{flow}(return_state=True).message)
"""


@pytest.mark.parametrize("module, flow", [("flows.pipeline", "pretraining_pipeline"),
                                          ("flows.eval_schedule", "evaluate_checkpoints")])
def test_a_stop_dropped_in_a_finalizer_of_a_deployments_run_still_stops_it(server, module, flow):
    """A CI run of the worker drill: the run the worker stopped went on to its end, was killed a minute
    later and stayed Running. `python -m prefect.engine` installs none of a command's interrupt handling."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(SIGTERM_IN_A_FINALIZER.format(module=module, flow=flow))],
                         cwd=REPO, env=server, capture_output=True, text=True, timeout=300)
    run_id = out.stdout.split()[0] if out.stdout.split() else None
    assert out.returncode == -signal.SIGTERM and "went on" not in out.stdout, (out.stdout, out.stderr[-3000:])
    state = api(server, f"/flow_runs/{run_id}")
    assert (state["state_type"], state["state"]["message"]) == \
        ("CRASHED", "Execution was aborted by a termination signal."), out.stderr[-3000:]


STUCK_RUN = """
    import os, subprocess, sys
    from flows import worker

    # a run's process as the worker starts it, that does not end on SIGTERM (stuck anywhere)
    stuck = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                              "print('ready', flush=True); time.sleep(600)", "prefect.engine"],
                             env={**os.environ, "PREFECT__FLOW_RUN_ID": sys.argv[1]}, stdout=subprocess.PIPE)
    stuck.stdout.readline()
    print(worker._stop_runs(os.getpid(), 1.0), stuck.wait(30))
"""


def test_a_run_that_does_not_stop_for_the_worker_is_killed_and_recorded_as_crashed(server):
    """The worker's stop kills a run still going a minute after its SIGTERM, which then recorded no end:
    the UI showed it Running for good while the worker's line said it was recorded as crashed."""
    flow = api(server, "/flows/", {"name": "stuck-for-the-worker"})
    flow_run = api(server, "/flow_runs/", {"flow_id": flow["id"], "state": {"type": "RUNNING", "name": "Running"}})
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(STUCK_RUN), flow_run["id"]], cwd=REPO, env=server,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", str(-signal.SIGKILL)], (out.stdout, out.stderr[-3000:])
    state = api(server, f"/flow_runs/{flow_run['id']}")
    assert state["state_type"] == "CRASHED", state
    assert state["state"]["message"].startswith("the worker stopped: the run had not ended 1 s after its SIGTERM"), state


def test_a_pipeline_whose_prefect_api_cannot_be_reached_is_one_line(tmp_path):
    """An operator drill: PREFECT_API_URL exported (as the README has it for `make ui`) with no server started
    gave 109 lines and 3 tracebacks."""
    url = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    params = tmp_path / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text().replace("  data_dir: data ", f"  data_dir: {tmp_path / 'data'} "))
    out = subprocess.run([sys.executable, "-m", "flows.pipeline", str(params), "sample"], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PREFECT_API_URL": url,
                                                      "PREFECT_HOME": str(tmp_path / "prefect")})
    assert out.returncode == 1 and out.stderr.splitlines() == [
        f"error: RuntimeError: Failed to reach API at {url}/ (PREFECT_API_URL is {url}: start that server, "
        "`make ui`, or unset it for a temporary one)"], out.stderr[-3000:]


def test_an_unreachable_dask_scheduler_is_refused_before_the_stage_changes_anything():
    """An operator drill: the first pass failed after 30 s ('OSError: Timed out trying to connect', no key named)
    with the stage's last completion already gone. run_stage_flow checks the scheduler first."""
    import inspect

    from flows import stages
    from flows.runners import check_reachable
    from tasks.core.config import RunnerParams
    from tasks.core.errors import ConfigError
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ConfigError, match=f"runner.dask_address {address}: cannot connect to the Dask scheduler"):
        check_reachable(RunnerParams(kind="dask", dask_address=address))
    check_reachable(RunnerParams(kind="threads"))
    source = inspect.getsource(stages.run_stage_flow)
    assert source.index("check_reachable(p.runner)") < source.index("stage_lock(p, stage)")


def test_a_pipeline_on_another_params_file_names_it_in_the_hint(server, tmp_path):
    """An operator drill: `python -m flows.pipeline other.yaml filter` without extract said "run `python -m tasks
    extract` first", which runs on params.yaml's data folder; python -m tasks names the --params file."""
    params = tmp_path / "other.yaml"
    params.write_text((REPO / "params.yaml").read_text().replace("  data_dir: data ", f"  data_dir: {tmp_path / 'data'} "))
    out = subprocess.run([sys.executable, "-m", "flows.pipeline", str(params), "filter"], cwd=REPO, capture_output=True,
                         text=True, timeout=600, env=server)
    assert out.returncode == 4, out.stderr[-3000:]
    assert out.stderr.splitlines()[-1].endswith(f"run `python -m tasks extract --params {params}` first"), \
        out.stderr[-3000:]


def test_a_killed_run_the_worker_cannot_record_is_one_line():
    env = {**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}  # nothing listens there
    out = subprocess.run([sys.executable, "-c", "from flows.worker import record_crashed; "
                          "record_crashed('5d8b3c39-5c5c-4a8d-9a83-6c1f0c2e7a11', 'killed')"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr.strip().splitlines() == [
        "could not record flow run 5d8b3c39-5c5c-4a8d-9a83-6c1f0c2e7a11 as crashed: ConnectError: "
        "[Errno 111] Connection refused"], out.stderr


# A stand-in for `prefect worker start` whose scheduled runs keep coming: it starts a run every 0.2 s. A
# run takes a second to stop on SIGTERM and exits 0; on SIGINT the worker kills its runs as Prefect's does
# (anyio cancelling its task group) and prints how each ended.
BUSY_WORKER = """
    import signal, subprocess, sys, time
    RUN = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0))); time.sleep(600)"
    runs = []
    def stop(*_):
        for run in runs:
            run.kill()
        print(*[run.wait() for run in runs], flush=True)
        sys.exit(0)
    signal.signal(signal.SIGINT, stop)
    while True:
        runs.append(subprocess.Popen([sys.executable, "-c", RUN, "prefect.engine"]))
        print("started", flush=True)
        time.sleep(0.2)
"""


def test_the_worker_starts_no_run_while_its_runs_stop():
    """A worker drill: the worker went on polling while its runs stopped, and its own stop then killed the
    runs it had started meanwhile, which stayed Running in the UI for good."""
    supervisor = subprocess.Popen([sys.executable, "-c", "import sys; from flows import worker; "
                                   "sys.exit(worker.supervise([sys.executable, '-c', sys.argv[1]]))",
                                   textwrap.dedent(BUSY_WORKER)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
    assert supervisor.stdout.readline() == "started\n"
    supervisor.send_signal(signal.SIGTERM)
    out, err = supervisor.communicate(timeout=120)
    assert supervisor.returncode == 128 + signal.SIGTERM, err
    ended = out.splitlines()[-1].split()  # the worker's last line: how each of its runs ended
    assert ended and set(ended) == {"0"}, (out, err)  # each on its SIGTERM; none killed by the worker's stop


MAPPING_INTERRUPTED = """
    import signal, types
    from prefect import flow
    from flows import stages
    from tasks.core.config import PipelineParams
    from tests.signalled_shards import SignalledShards, interrupt

    drill = SignalledShards()
    stages.process_shard = drill.work
    stages._took = drill.announcing(stages._took)  # the mapper's wait on its shards
    signal.signal(signal.SIGUSR1, interrupt)
    drill.signal_a_shard(signal.SIGUSR1)

    @flow
    def stage():
        return stages.map_with_prefect("extract", "text", PipelineParams(runner={"kind": "threads", "max_workers": 2}),
                                       [types.SimpleNamespace(name=n) for n in "ab"], None)
    try:
        stage()
        print("went on", sorted(drill.outcomes.items()))
    except KeyboardInterrupt:
        print("interrupted", sorted(drill.outcomes.items()))
    finally:
        drill.end()
"""


def test_an_interrupt_reaching_a_shard_thread_stops_the_flows_shards(server):
    """The flows' mapper waited on its shards in Prefect's as_completed, one untimed wait: a signal the
    kernel delivered to a shard's thread ran its handler only when a shard ended (the command's mapper
    waits in short slices since bca23b2)."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(MAPPING_INTERRUPTED)], cwd=REPO, env=server,
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1:] == ["interrupted [('a', 'stopped'), ('b', 'stopped')]"], \
        out.stdout[-2000:] + out.stderr[-3000:]
