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
- **A stage that `dvc repro` runs.** DVC dies of a SIGTERM sent to it alone (`kill <pid>`, or make
  passing on its own), and the stage it was running went on unseen, holding the stage's lock against
  the rerun (for training, for hours). `stop_when_gone()` stops the stage as SIGTERM would once DVC
  is gone.
- **What a command-line run starts.** `python -m flows.pipeline` without a server has Prefect start a
  temporary one (uvicorn, a child process) and stop it at exit; a kill -9 left it serving forever.
  `guard_descendants()` starts a small watcher that stops whatever the run started once it is gone.

A process counts as gone once it has exited or is a zombie (killed, its parent not yet reaping it). A
process is named by the machine's boot id, its pid namespace, its pid and its start time: on another
machine or namespace (a rank on another host of a hostfile run) only the parent is watched.
"""
from __future__ import annotations

import errno
import fcntl
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator

ENV = "MTNLG_LAUNCHER"
SESSION_ENV = "MTNLG_SESSION"
LOCK = ".ranks.lock"
WATCH_EVERY_S = 1.0
# file systems without flock (Lustre mounted noflock, some FUSE and CIFS mounts): no lock, not a crash
_NO_FLOCK = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL)


def proc_stat(pid: int) -> list[bytes] | None:
    """/proc/<pid>/stat's fields after the command name (which may hold spaces, parentheses or bytes
    that are not UTF-8): [0] is the state, [1] the parent's pid, [2] the process group, [19] the start
    time; None if there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _runs(fields: list[bytes] | None) -> bool:
    return fields is not None and fields[0] not in (b"Z", b"X")  # an exited one not yet reaped does not


def running(pid: int) -> bool:
    """Whether the process runs (an exited one not yet reaped by its parent does not)."""
    return _runs(proc_stat(pid))


def live_processes() -> Iterator[tuple[int, list[bytes]]]:
    """Every process that runs, with its proc_stat fields."""
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if entry.name.isdigit() and _runs(fields := proc_stat(int(entry.name))):
            yield int(entry.name), fields


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); None if gone."""
    fields = proc_stat(pid)
    return fields[19].decode() if fields else None


def _machine() -> str:
    """This boot of this machine and this pid namespace: where a pid means the same process. (A host
    name does not: containers and cloned nodes share them.)"""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return "unknown"


def identity(pid: int) -> str:
    """`machine:pid:start time`: names one process, even after its pid is reused."""
    return f"{_machine()}:{pid}:{start_time(pid)}"


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
    """The process an `identity` names has ended, or is a zombie (killed, not yet reaped by its parent).
    False where it cannot be told: another machine or pid namespace (a rank on another host), no /proc."""
    machine, pid, started = value.rsplit(":", 2)
    if machine != _machine() or machine == "unknown" or started == "None":
        return False
    fields = proc_stat(int(pid))
    return not _runs(fields) or fields[19].decode() != started


def watch(label: str) -> None:
    """In a rank, first thing: end the process once its parent or its launcher is gone (checked now,
    then every second by a daemon thread)."""
    parent, launcher = os.getppid(), os.environ.get(ENV)

    def orphaned() -> bool:
        return os.getppid() != parent or bool(launcher and gone(launcher))

    def stop() -> None:
        try:
            print(f"{label}: the launch that started this rank is gone (killed?); stopping it "
                  f"(the last complete checkpoint stays)", file=sys.stderr, flush=True)
        finally:
            os._exit(1)

    if launcher and gone(launcher):  # killed while this rank was starting
        stop()
    _once(orphaned, stop, "lifeline")


def _once(condition, then, name: str) -> None:
    """Call `then` once `condition()` holds, checked every WATCH_EVERY_S by a daemon thread."""
    def loop() -> None:
        while not condition():
            time.sleep(WATCH_EVERY_S)
        then()

    threading.Thread(target=loop, name=name, daemon=True).start()


def ancestor_running(program: str, levels: int = 3) -> int | None:
    """The nearest of this process's ancestors, `levels` up at most, whose command runs `program`
    (`.../bin/dvc repro`, `python .../bin/dvc repro`, `python -m dvc repro`); None if none."""
    name = program.encode()
    pid = os.getppid()
    for _ in range(levels):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if name in (os.path.basename(a) for a in args[:2]) or args[1:3] == [b"-m", name]:
            return pid
        fields = proc_stat(pid)
        pid = int(fields[1]) if fields else 0
        if pid <= 1:
            return None
    return None


def stop_when_gone(pid: int, line: str) -> None:
    """Once process `pid` has ended (checked every second by a daemon thread): print `line` and stop
    this process as SIGTERM stops it (its interrupt handler: the interrupt line, exit 143)."""
    watched = identity(pid)

    def stop() -> None:
        print(line, file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    _once(lambda: gone(watched), stop, "lifeline-parent")


@contextmanager
def _locked(folder: Path, mode: int):
    """The run folder's ranks lock in `mode` for the block (nothing on a file system without flock)."""
    with open(Path(folder) / LOCK, "a+") as fh:
        try:
            fcntl.flock(fh, mode)
        except BlockingIOError:
            raise
        except OSError as e:
            if e.errno not in _NO_FLOCK:
                raise
            print(f"note: {folder / LOCK}: no file locks on this file system ({e.strerror}); a launch "
                  f"does not wait for an earlier one's ranks here", file=sys.stderr)
        yield


def hold(folder: Path):
    """In a rank: hold the run folder's ranks lock (shared) for the `with` block."""
    return _locked(folder, fcntl.LOCK_SH) if Path(folder).is_dir() else nullcontext()


def wait_for_ranks(folder: Path, timeout_s: float = 60.0) -> None:
    """Before a launch into `folder`: wait until no rank of an earlier launch holds its lock (a killed
    run's ranks stop within about a second); after `timeout_s`, one line saying which folder is busy."""
    from tasks.core.errors import StageBusy
    if not Path(folder).is_dir():
        return  # nothing launched there yet
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with _locked(folder, fcntl.LOCK_EX | fcntl.LOCK_NB):
                return  # leaving the block releases it for the ranks about to start
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise StageBusy(f"ranks of an earlier launch are still running in {folder} "
                                f"(`fuser -v {folder / LOCK}` lists them): stop them or wait") from None
            time.sleep(0.2)


def guard_descendants() -> None:
    """Stop every process this one starts from now on (SIGTERM, SIGKILL 5 s later) once this one is gone,
    however it ends: they carry `MTNLG_SESSION` (its identity) in their environment, which a small
    watcher process (this file, run as a script) looks for when this process has ended. Once per process."""
    import subprocess
    me = identity(os.getpid())
    if start_time(os.getpid()) is None or os.environ.get(SESSION_ENV) == me:  # no /proc, or watched already
        return
    os.environ[SESSION_ENV] = me
    # a script in isolated mode: stdlib only, whatever PYTHONPATH, PYTHONSAFEPATH or the cwd are
    subprocess.Popen([sys.executable, "-I", "-S", str(Path(__file__).resolve()), me], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


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


if __name__ == "__main__":  # the watcher: python -I -S tasks/core/lifeline.py <identity of the watched process>
    _stop_descendants_of(sys.argv[1])
