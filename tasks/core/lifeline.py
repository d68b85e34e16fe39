"""Processes that must not outlive the process that started them.

- **Training ranks.** torchrun and DeepSpeed's launcher start each rank in a session of its own, so
  neither a kill -9 of the process that launched the run (the train stage; a Prefect flow run cancelled
  from the UI) nor the `os.killpg` of the launcher on a timeout or Ctrl-C reached the ranks: they went on
  training for as long as the run had steps, writing checkpoints and metrics into the work folder that
  the rerun was also writing. So each rank watches two things and exits when either goes: its parent
  (the launcher's agent: `os.getppid()` changes when it dies), and the process that launched the run,
  named by `MTNLG_LAUNCHER` (`host:pid:start time`, so a reused pid is not mistaken for it; on another
  host than the launcher's only the parent is watched). The ranks of one run folder also hold
  `.ranks.lock` (shared) while they live: a launch into that folder first waits for the lock, so a
  rerun right after a kill never overlaps the last ranks of the killed run.
- **What a command-line run starts.** `python -m flows.pipeline` without a server has Prefect start a
  temporary one (uvicorn, a child process) and stop it at exit; a kill -9 left it serving forever.
  `guard_descendants()` starts a small watcher that stops whatever the run started once it is gone.
"""
from __future__ import annotations

import fcntl
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from tasks.core.errors import StageBusy

ENV = "MTNLG_LAUNCHER"
SESSION_ENV = "MTNLG_SESSION"
LOCK = ".ranks.lock"
WATCH_EVERY_S = 1.0


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name start at field 3


def identity(pid: int) -> str:
    """`host:pid:start time`: names one process, even after its pid is reused."""
    return f"{socket.gethostname()}:{pid}:{start_time(pid)}"


def launcher_env() -> dict[str, str]:
    """The variable that names this process as the launching one, for the ranks' environment."""
    return {ENV: identity(os.getpid())}


def processes_with(variable: str, value: str) -> list[int]:
    """Every live process (but this one) started with `variable=value` in its environment: what a
    process launched, however deep and in whatever session, since children inherit the environment."""
    want = f"{variable}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if want in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:  # gone, or another user's
                pass
    return found


def launched_pids() -> list[int]:
    """Every live process this one launched as a training run (a launcher, its agents, their ranks)."""
    return processes_with(ENV, launcher_env()[ENV])


def kill_launched(sig: int = signal.SIGKILL) -> None:
    """Send `sig` to every process this one launched (a timeout, an interrupt, the kill -9 drill)."""
    for pid in launched_pids():
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def gone(value: str) -> bool:
    """The process an `identity` names has ended (False where it cannot be told: another host, no /proc)."""
    host, pid, started = value.rsplit(":", 2)
    if host != socket.gethostname() or started == "None":  # another host's process, or no /proc here
        return False
    return start_time(int(pid)) != started


def watch(label: str) -> None:
    """In a rank: a daemon thread that ends the process once its parent or its launcher is gone."""
    parent, launcher = os.getppid(), os.environ.get(ENV)

    def loop() -> None:
        while True:
            time.sleep(WATCH_EVERY_S)
            if os.getppid() != parent or (launcher and gone(launcher)):
                try:
                    print(f"{label}: the launch that started this rank is gone (killed?); stopping it "
                          f"(the last complete checkpoint stays)", file=sys.stderr, flush=True)
                finally:
                    os._exit(1)

    threading.Thread(target=loop, name="lifeline", daemon=True).start()


def hold(folder: Path):
    """In a rank: hold the run folder's ranks lock (shared) until the process ends. Returns the file."""
    fh = open(Path(folder) / LOCK, "a+")
    fcntl.flock(fh, fcntl.LOCK_SH)
    return fh


def wait_for_ranks(folder: Path, timeout_s: float = 60.0) -> None:
    """Before a launch into `folder`: wait until no rank of an earlier launch holds its lock (a killed
    run's ranks stop within about a second); after `timeout_s`, one line saying which folder is busy."""
    if not Path(folder).is_dir():
        return  # nothing launched there yet
    deadline = time.monotonic() + timeout_s
    with open(Path(folder) / LOCK, "a+") as fh:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return  # closing the file releases it for the ranks about to start
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StageBusy(f"ranks of an earlier launch are still running in {folder} "
                                    f"(`fuser -v {folder / LOCK}` lists them): stop them or wait") from None
                time.sleep(0.2)


def guard_descendants() -> None:
    """Stop every process this one starts from now on (SIGTERM, SIGKILL 5 s later) once this one is gone,
    however it ends: they carry `MTNLG_SESSION` (its identity) in their environment, which a small
    watcher process (`python -m tasks.core.lifeline`) looks for when this process has ended."""
    import subprocess
    me = identity(os.getpid())
    if start_time(os.getpid()) is None:  # no /proc: the watcher could not tell when to act
        return
    os.environ[SESSION_ENV] = me
    subprocess.Popen([sys.executable, "-S", "-m", "tasks.core.lifeline", me], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                     cwd=Path(__file__).resolve().parents[2])


def _stop_descendants_of(watched: str) -> None:
    while not gone(watched):
        time.sleep(WATCH_EVERY_S)
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        left = processes_with(SESSION_ENV, watched)
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = processes_with(SESSION_ENV, watched)


if __name__ == "__main__":  # the watcher: python -m tasks.core.lifeline <identity of the watched process>
    _stop_descendants_of(sys.argv[1])
