"""Start one process per rank on this machine with torchrun (127.0.0.1, gloo on CPU / NCCL on GPU).
Several nodes: the same module under the `deepspeed` launcher with a hostfile."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


class LaunchFailed(RuntimeError):
    def __init__(self, code: int, line: str):
        self.code, self.line = code, line
        super().__init__(f"torchrun exited {code}: {line}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(module: str, config: Path, ranks: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", module, str(config)]


def environment() -> dict:
    # one thread per rank: ranks x default threads on a few cores is ~10x slower (DESIGN.md)
    return {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR") or "cpu", "OMP_NUM_THREADS": "1"}


def start(module: str, config: Path, ranks: int, log: Path) -> subprocess.Popen:
    """The launch in its own session (so `os.killpg` stops every rank), output appended to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(command(module, config, ranks), env=environment(), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def first_error(log: Path) -> str:
    """The ranks' own one-line error (`<label>: cause`), else the launcher's last error line."""
    from tasks.core.errors import PipelineError
    labels, todo = {"error"}, [PipelineError]
    while todo:
        cls = todo.pop()
        labels.add(cls.label)
        todo += cls.__subclasses__()
    lines = Path(log).read_text(errors="replace").splitlines()
    own = [ln for ln in lines if ln.split(":", 1)[0] in labels]
    errors = own or [ln for ln in lines if "error" in ln.lower()]
    return errors[0].strip() if errors else f"see {log}"


def run(module: str, config: Path, ranks: int, log: Path, timeout: float | None = 1800, echo=None) -> None:
    """Run to the end (every rank killed after `timeout` seconds; None: no limit); the ranks' output
    goes to `log` and, as it comes, to `echo` (a binary stream, e.g. sys.stderr.buffer)."""
    if echo is None:
        proc = start(module, config, ranks, log)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            raise
    else:
        code = _run_echoing(module, config, ranks, log, echo, timeout)
    if code:
        raise LaunchFailed(code, first_error(log))


def _run_echoing(module: str, config: Path, ranks: int, log: Path, echo, timeout: float | None) -> int:
    import threading
    proc = subprocess.Popen(command(module, config, ranks), env=environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    timer = threading.Timer(timeout, os.killpg, (proc.pid, 9)) if timeout else None
    if timer:
        timer.start()
    try:
        with open(log, "ab") as out:
            while chunk := os.read(proc.stdout.fileno(), 65536):
                out.write(chunk)
                echo.write(chunk)
                echo.flush()
        return proc.wait()
    finally:
        if timer:
            timer.cancel()
        if proc.poll() is None:  # the caller was interrupted: take the ranks down with it
            os.killpg(proc.pid, 9)
            proc.wait()
