"""`make worker`: Prefect's process worker for prefect.yaml's deployments, which Ctrl-C and SIGTERM stop
with the runs it is executing recorded as crashed.

    python -m flows.worker [prefect worker start options ...]

Two things went wrong with `prefect worker start` run directly (operator drills):
- Prefect's worker answers SIGTERM by sending itself SIGINT. Started with SIGINT ignored (a shell's
  background job, `make worker &`, nohup), that did nothing: the worker ran on, executing scheduled runs,
  after `kill <make's pid>`, until a second SIGTERM, which Prefect turns into SIGKILL.
- A worker that stops kills the runs it is executing with SIGKILL (anyio, as its task group is
  cancelled): they never recorded an end, and the UI showed them Running for good.

So the worker runs here as a child in a session of its own (a terminal's Ctrl-C reaches this process
alone), with SIGINT at its default. On Ctrl-C or SIGTERM, each run it is executing gets SIGTERM first,
as a cancel from the UI does: the run stops its shards and ranks and is recorded as Crashed ("aborted by
a termination signal"; a rerun resumes it). Then the worker gets its SIGINT. A kill -9 of this process
still stops the worker and its runs (tasks.core.lifeline's watcher). A run that has not ended a minute
after its SIGTERM is killed and recorded as Crashed here, saying so: a killed run records no end itself.
While its runs stop, the worker is frozen (SIGSTOP): it went on polling and started the runs scheduled
meanwhile, which its own stop then killed, unrecorded and Running in the UI for good.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tasks.core import lifeline

POOL = "local-process"  # prefect.yaml's work_pool for every deployment; `make deploy` creates it
RUNS_STOP_WITHIN_S = 60.0  # a run's clean stop takes seconds (shards 5 s, ranks ~2 s); then it is killed
WORKER_STOPS_WITHIN_S = 30.0


_received: list[int] = []  # the signals that asked the worker to stop, in order


def _record(signum, _frame) -> None:
    _received.append(signum)


def flow_runs(worker: int) -> list[int]:
    """The processes executing the worker's runs: its children running `prefect.engine`."""
    return [pid for pid, fields in lifeline.live_processes() if int(fields[1]) == worker and _runs_engine(pid)]


def _runs_engine(pid: int) -> bool:
    return b"prefect.engine" in (_cmdline(pid) or b"")


def flow_run_id(pid: int) -> str | None:
    """The flow run a `prefect.engine` process executes (the worker hands it PREFECT__FLOW_RUN_ID)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone meanwhile
        return None
    return next((v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"PREFECT__FLOW_RUN_ID=")), None)


def _forks_not_yet_run(worker: int) -> list[int]:
    """The worker's children that are still copies of it: a run it forked and has not exec'd yet."""
    own = _cmdline(worker)
    if own is None:
        return []
    children = [pid for pid, fields in lifeline.live_processes() if int(fields[1]) == worker]
    return [pid for pid in children if _cmdline(pid) == own]


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone meanwhile
        return None


def _stop_runs(worker: int, within_s: float) -> int:
    """SIGTERM to each run the worker is executing, SIGKILL to what is left after `within_s`; how many.
    A run killed so never recorded its end: it is recorded as crashed here."""
    deadline = time.monotonic() + 1.0  # a fork made just before the worker froze becomes its run in microseconds
    while _forks_not_yet_run(worker) and time.monotonic() < deadline:
        time.sleep(0.01)
    runs = {pid: flow_run_id(pid) for pid in flow_runs(worker)}
    for pid in runs:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + within_s
    while (left := [pid for pid in runs if lifeline.running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        _signal(pid, signal.SIGKILL)
    for pid in left:
        if runs[pid]:
            record_crashed(runs[pid], f"the worker stopped: the run had not ended {within_s:g} s after its SIGTERM "
                                      "and was killed; rerun to resume")
    return len(runs)


def record_crashed(run_id: str, message: str) -> None:
    """Crashed, with `message`, for a run still not in a final state: without it a killed run stayed
    Running in the UI for good. A server that cannot be reached gets one line, not a traceback."""
    from prefect.client.orchestration import get_client  # here: the worker's stop is the only user
    from prefect.states import Crashed
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(run_id).state
            if state is None or not state.is_final():
                client.set_flow_run_state(run_id, Crashed(message=message), force=True)
    except Exception as e:  # noqa: BLE001 - any failure of the API call is this one line
        print(f"could not record flow run {run_id} as crashed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    prefect = str(Path(sys.executable).with_name("prefect"))
    return supervise([prefect, "worker", "start", "--pool", POOL, *argv])


def supervise(command: list[str]) -> int:
    """Run the worker `command` until it ends, or until Ctrl-C/SIGTERM stops its runs and then it."""
    # handlers, not SIG_IGN: across exec a handled signal is back at its default, so the worker's Python
    # installs its KeyboardInterrupt, whatever this process was started with
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _record)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    lifeline.guard_descendants()
    worker = subprocess.Popen(command, start_new_session=True)
    while worker.poll() is None and not _received:
        time.sleep(0.2)
    if not _received:
        return worker.returncode
    worker.send_signal(signal.SIGSTOP)  # no new run while its runs stop (module docstring)
    try:
        stopped = _stop_runs(worker.pid, RUNS_STOP_WITHIN_S)
    finally:  # the SIGINT waits for the SIGCONT: the worker's first step is its stop, not a poll
        worker.send_signal(signal.SIGINT)
        worker.send_signal(signal.SIGCONT)
    try:
        worker.wait(timeout=WORKER_STOPS_WITHIN_S)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
    runs = f"; {stopped} run(s) it was executing stopped, recorded as crashed: rerun to resume" if stopped else ""
    print(f"worker stopped ({signal.Signals(_received[0]).name}){runs}", file=sys.stderr, flush=True)
    return 128 + _received[0]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
