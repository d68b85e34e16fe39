"""A rank lives only as long as its launch.

torchrun and DeepSpeed's launcher start each rank in a session of its own, so neither a kill -9 of the
process that launched the run (the train stage; a Prefect flow run cancelled from the UI) nor the
`os.killpg` of the launcher on a timeout or Ctrl-C reached the ranks: they went on training for as long
as the run had steps, writing checkpoints and metrics into the work folder that the rerun was also
writing. So each rank watches two things and exits when either goes:

- its parent (the launcher's agent): `os.getppid()` changes when it dies;
- the process that launched the run, named by `MTNLG_LAUNCHER` (`host:pid:start time`, so a reused pid
  is not mistaken for it; on another host than the launcher's only the parent is watched).

And the ranks of one run folder hold `.ranks.lock` (shared) while they live: a launch into that folder
first waits for the lock, so a rerun right after a kill never overlaps the last ranks of the killed run.
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
LOCK = ".ranks.lock"
WATCH_EVERY_S = 1.0


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name start at field 3


def launcher_env() -> dict[str, str]:
    """The variable that names this process as the launching one, for the ranks' environment."""
    return {ENV: f"{socket.gethostname()}:{os.getpid()}:{start_time(os.getpid())}"}


def launched_pids() -> list[int]:
    """Every live process this one launched (a launcher, its agents, their ranks), found by the variable
    they inherited: they sit in sessions of their own, out of reach of os.killpg."""
    mine = f"{ENV}={launcher_env()[ENV]}".encode()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if mine in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:  # gone, or another user's
                pass
    return found


def kill_launched(sig: int = signal.SIGKILL) -> None:
    """Send `sig` to every process this one launched (a timeout, an interrupt, the kill -9 drill)."""
    for pid in launched_pids():
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _launcher_gone(value: str) -> bool:
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
            if os.getppid() != parent or (launcher and _launcher_gone(launcher)):
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
