"""Start one process per rank: torchrun on this machine (127.0.0.1, gloo on CPU / NCCL on GPU), or,
with a hostfile, DeepSpeed's launcher on every host it names (pdsh over ssh from the first host; one
host: started here). Either way the ranks' output is one stream, and a failing rank ends the launch
with that rank's one-line error."""
from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tasks.core.errors import ConfigError
from tasks.core import lifeline
from trainer.config import LaunchParams

LOCAL = LaunchParams()


class LaunchFailed(RuntimeError):
    def __init__(self, code: int, line: str):
        self.code, self.line = code, line
        super().__init__(f"launch exited {code}: {line}")


class LaunchTimedOut(LaunchFailed):
    """The launch ran past its time limit, and every rank was stopped."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        RuntimeError.__init__(self, f"every rank was stopped after the launch's time limit of {timeout:g} s")
        self.code, self.line = None, str(self)


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a server that binds it a moment later. It is drawn from below the
    kernel's ephemeral range (ip_local_port_range), the range bind(0) and outgoing connections take their
    ports from: a port bind(0) returned could be handed to another process's bind(0) or connection before
    the server bound it (seen with parallel test workers on a busy machine). Where nothing lies below that
    range, bind(0)'s port, as before."""
    low = ephemeral_ports()[0]
    candidates = list(range(max(10_000, low - 10_000), low))
    random.Random().shuffle(candidates)  # two processes asking at once rarely draw the same port
    for port in candidates[:200]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ephemeral_ports() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):  # not Linux: the IANA dynamic range, macOS's and Windows' default
        return 49152, 65535


def hosts(hostfile: str) -> dict[str, int]:
    """A DeepSpeed hostfile's hosts and their slots, read by DeepSpeed's own parser (the launcher reads
    it the same way); a missing or malformed file is a ConfigError naming it."""
    path = Path(hostfile)
    if not path.is_file():
        raise ConfigError(f"train.launch.hostfile {hostfile}: no such file")
    from deepspeed.launcher.runner import fetch_hostfile
    try:
        found = fetch_hostfile(str(path))
    except ValueError as e:
        raise ConfigError(f"train.launch.hostfile {hostfile}: {e} (lines are `<host> slots=<ranks>`)") from None
    if not found:
        raise ConfigError(f"train.launch.hostfile {hostfile}: no `<host> slots=<ranks>` line")
    return dict(found)


def check(launch: LaunchParams, ranks: int) -> dict[str, int]:
    """The hostfile's hosts, whose slots must be the layout's ranks (DeepSpeed would start the slots'
    count); no hostfile: none."""
    if launch.hostfile is None:
        return {}
    found = hosts(launch.hostfile)
    if sum(found.values()) != ranks:
        raise ConfigError(f"train.launch.hostfile {launch.hostfile} has {sum(found.values())} slots on "
                          f"{len(found)} host(s) but the layout has tp x pp x dp = {ranks} ranks")
    return found


def command(module: str, config: Path, ranks: int, launch: LaunchParams = LOCAL) -> list[str]:
    if launch.hostfile is None and launch.master_port is None and launch.master_addr is None:
        # torchrun's rendezvous binds a free port itself: a port found free here and bound there could be
        # taken in between (another run's launch, a client's outgoing connection) on a busy machine
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                "-m", module, str(config)]
    port = str(launch.master_port or free_port())
    if launch.hostfile is None:
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
                "--master-addr", launch.master_addr or "127.0.0.1", "--master-port", port, "-m", module, str(config)]
    one_host = len(check(launch, ranks)) == 1
    addr = launch.master_addr or ("127.0.0.1" if one_host else None)  # else DeepSpeed asks the first host (ssh)
    # no ssh check: one host is started here, several through pdsh, which names an unreachable host itself
    return [sys.executable, "-u", "-m", "deepspeed.launcher.runner", "--hostfile", str(Path(launch.hostfile).resolve()),
            "--no_ssh_check", "--master_port", port, *(["--master_addr", addr] if addr else []),
            "--no_local_rank", "--module", module, str(Path(config).resolve())]


def environment(log: Path) -> dict:
    # one thread per rank: ranks x default threads on a few cores is ~10x slower (DESIGN.md)
    # and the ranks stop when this process does (tasks.core.lifeline)
    # (MKL's too: torch reads MKL_NUM_THREADS after OMP_NUM_THREADS and the later wins, so a job script's
    # MKL_NUM_THREADS=4 gave each rank 2 threads, other reduction orders, other checkpoint bytes, 38% slower)
    ours = {"DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR") or "cpu", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", **lifeline.launcher_env()}
    # pdsh passes only a few variables to the other hosts: the rest go through DeepSpeed's env file
    # (the user's ~/.deepspeed_env lines first, then ours)
    env_file = Path(log).with_name("deepspeed_env")
    user = Path.home() / ".deepspeed_env"
    lines = user.read_text().splitlines() if user.is_file() else []
    env_file.write_text("\n".join([*lines, *(f"{k}={v}" for k, v in ours.items())]) + "\n")
    return {**os.environ, **ours, "DS_ENV_FILE": str(env_file.resolve())}


# torchrun's line for the first rank that failed (its exit code negative: killed by that signal), and DeepSpeed's
# per-host launcher's (which names no rank); pdsh puts `<host>: ` before every line from another host
_RANK_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)"
                          r"|exits with return code = (-?\d+)")
_HOST = re.compile(r"[\w.-]+")
_EXCEPTION = re.compile(r"(?:[\w.]+\.)?\w*(?:Error|Exception)(?::|$)")  # a traceback's last line
_KILLED_WHY = {signal.SIGKILL: "the kernel's out-of-memory killer, or kill -9", signal.SIGSEGV: "a crash in native code",
               signal.SIGABRT: "an abort in native code (a failed CUDA or NCCL call, say)",
               signal.SIGBUS: "a crash in native code (or /dev/shm full)"}


def _labels() -> set[str]:
    from tasks.core.errors import PipelineError
    labels, todo = {"error"}, [PipelineError]
    while todo:
        cls = todo.pop()
        labels.add(cls.label)
        todo += cls.__subclasses__()
    return labels


def _killed(code: int, rank: str | None, pid: str | None, host: str | None) -> str:
    who = (f"rank {rank} (local rank, pid {pid})" if rank is not None else "a rank") + (f" on {host}" if host else "")
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"{who} was killed by signal {-code}"
    why = _KILLED_WHY.get(sig)
    return f"{who} was killed by {sig.name}" + (f" ({why})" if why else "")


def first_error(log: Path, start: int = 0) -> str:
    """Why the launch failed, from what it wrote to `log` after byte `start` (a resumed run appends to the log
    of the run before, whose error is not this one's): the ranks' own one-line error (`<label>: cause`); a
    rank killed by a signal, which writes none (the other ranks' errors then are only their lost peer); a
    Python traceback's last line; the exit code torchrun reports; else the launcher's first error line."""
    labels = _labels()
    with open(log, "rb") as f:
        f.seek(start)
        lines = f.read().decode("utf-8", "replace").splitlines()
    own, exceptions, failed, other = [], [], None, []
    for ln in lines:
        host, sep, rest = ln.partition(": ")
        if not (sep and _HOST.fullmatch(host) and host not in labels and not _EXCEPTION.match(host + ":")
                and (rest.partition(": ")[0] in labels or rest[:1].isspace() or _RANK_FAILED.search(rest)
                     or _EXCEPTION.match(rest))):  # `ValueError: x` names no host
            host, rest = None, ln
        if failed is None and (m := _RANK_FAILED.search(rest)):
            code = int(m[1] if m[1] is not None else m[4])
            failed = (code, m[2], m[3], host)
            continue
        if failed is not None or rest[:1].isspace():
            continue  # the launcher's report after it; a traceback's frames
        if rest.partition(": ")[0] in labels:
            own.append(rest + (f" (on {host})" if host else ""))
        elif _EXCEPTION.match(rest):
            exceptions.append(rest)
        elif "error" in rest.lower():
            other.append(rest)
    if failed is not None and failed[0] < 0:
        return _killed(*failed)
    found = own or exceptions
    if found:
        return found[0].strip()
    if failed is not None:
        return f"rank {failed[1]} exited with code {failed[0]} and no error line" if failed[1] is not None else \
            f"a rank exited with code {failed[0]} and no error line"
    return other[0].strip() if other else f"see {log}"


def start(module: str, config: Path, ranks: int, log: Path, launch: LaunchParams = LOCAL) -> subprocess.Popen:
    """The launch in its own session (`stop` kills it and its ranks; killed otherwise, its ranks stop
    themselves, tasks.core.lifeline), output appended to `log`. Waits first for an earlier launch's ranks to be gone."""
    lifeline.wait_for_ranks(Path(config).parent)
    with open(log, "ab") as out:
        return subprocess.Popen(command(module, config, ranks, launch), env=environment(log), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def run(module: str, config: Path, ranks: int, log: Path, timeout: float | None = 1800, echo=None,
        launch: LaunchParams = LOCAL) -> None:
    """Run to the end (every rank killed after `timeout` seconds; None: no limit); the ranks' output
    goes to `log` and, as it comes, to `echo` (a binary stream, e.g. sys.stderr.buffer)."""
    lifeline.wait_for_ranks(Path(config).parent)  # first: an earlier launch's last ranks may still write to the log
    start_at = Path(log).stat().st_size if Path(log).exists() else 0  # a resumed run's log goes on
    if echo is None:
        proc = start(module, config, ranks, log, launch)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(proc)
            raise LaunchTimedOut(timeout) from None
    else:
        code = _run_echoing(command(module, config, ranks, launch), log, echo, timeout)
    if code:
        raise LaunchFailed(code, first_error(log, start_at))


def _run_echoing(cmd: list[str], log: Path, echo, timeout: float | None) -> int:
    import threading
    proc = subprocess.Popen(cmd, env=environment(log), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    timed_out = threading.Event()

    def time_up() -> None:
        timed_out.set()
        stop(proc)

    timer = threading.Timer(timeout, time_up) if timeout else None
    if timer:
        timer.start()
    last, tail, held, muted = b"\n", b"", b"", False
    try:
        with open(log, "ab") as out:
            while chunk := os.read(proc.stdout.fileno(), 65536):
                out.write(chunk)
                muted = muted or timed_out.is_set()  # torchrun's report of the timer's stop: launch.log only
                if not muted:
                    shown, held, muted = _split_echo(tail, held + chunk)
                    tail = (tail + shown)[-512:]
                    if shown:
                        echo.write(shown)
                        echo.flush()
                        last = shown[-1:]
        code = proc.wait()
        if code and timed_out.is_set():  # stopped by the timer (torchrun then exits 1, as for a failed rank)
            raise LaunchTimedOut(timeout)
        return code
    finally:
        if timer:
            timer.cancel()
            timer.join()  # a stop under way ends first: its kill of every launched process would take the next launch's
        if proc.poll() is None:  # the caller was interrupted: take the ranks down with it
            stop(proc)
            proc.wait()
        if held and not muted:  # an unfinished last line that was not the report after all (or a Ctrl-C came)
            echo.write(held)
            echo.flush()
            last = held[-1:]
        if last not in (b"\n", b""):  # a progress bar's line (\r-redrawn) ended: what follows, e.g. the
            echo.write(b"\n")         # interrupted or error line, starts on a line of its own
            echo.flush()


# torchrun's own report of a failed rank: its agent's error line, then a Python traceback of the launcher and a
# box of the ranks' exit codes (about 30 lines). The console has had the rank's one-line error already, and
# the stage ends with it; the report stays in launch.log, which that line names. Found anywhere in a line: a
# rank killed mid-step leaves its progress bar's line unfinished, and the report goes on from there.
_TORCHRUN_REPORT = re.compile(rb"E\d{4} [^\n]*?torch/distributed/elastic/multiprocessing/api\.py:\d+\] failed "
                              rb"\(exitcode")
# The end of the unfinished last line that may yet be that report's first bytes: held back until the line goes
# on, since a read that split the report's line echoed its first bytes before it could be recognised.
_REPORT_START = re.compile(rb"(?:E\d{4} [^\n\r]{0,300}|E\d{0,4})\Z")


def _split_echo(tail: bytes, pending: bytes) -> tuple[bytes, bytes, bool]:
    """(what of `pending` to echo now, what to hold back, whether torchrun's failure report began);
    `pending`: the bytes not echoed yet, `tail`: the last bytes echoed before them."""
    found = _TORCHRUN_REPORT.search(tail + pending)
    if found is not None:
        return pending[:max(0, found.start() - len(tail))], b"", True
    maybe = _REPORT_START.search(pending, max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1)
    if maybe is not None:
        return pending[:maybe.start()], pending[maybe.start():], False
    return pending, b"", False


def stop(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Stop the launch: SIGTERM to the launcher's session first (DeepSpeed's runner then stops the other
    hosts' ranks through pdsh, torchrun its own), then, after up to `grace_s`, kill -9 of the session and
    of every local rank it started in a session of its own. grace_s 0: kill -9 at once, as a crash would."""
    if grace_s > 0:
        _signal_session(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_session(proc, signal.SIGKILL)
    lifeline.kill_launched()


def _signal_session(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
