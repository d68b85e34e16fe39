"""What a command-line run (`python -m flows.pipeline`, `python -m flows.eval_schedule`) sets up before
its first flow, so that however it ends it leaves nothing behind and ends promptly.

- What it starts is stopped once it is gone, even by kill -9 (tasks.core.lifeline).
- Ctrl-C stops the run wherever it lands, and the run ends soon after it (tasks.core.interrupts).
- With no server configured, Prefect starts a temporary one as a child process. Ctrl-C in a terminal
  signals the whole foreground process group, and `timeout`, or a `kill -TERM -PGID`, the whole group the
  run leads: that server died with the run it serves, and the run then spent minutes retrying its last
  API calls (the progress artifact, the crash report) against it before it exited. Started here in a
  session of its own (and with SIGINT blocked, which a blocked signal keeps across fork and exec), the
  server outlives a signal to the run's group, records the run as crashed, and is stopped by Prefect at
  exit with SIGTERM, as before, or, when the run is killed outright, by the lifeline's watcher.
"""
from __future__ import annotations

import signal
import subprocess


def stop_during_imports(line: str) -> None:
    """First thing a command does, before its imports (Prefect's take seconds): a Ctrl-C or SIGTERM then
    ends it with its one line and 130 or 143, where SIGTERM killed it with no line and Ctrl-C printed a
    KeyboardInterrupt traceback. Nothing has started yet that needs stopping."""
    import os
    import sys

    from tasks.core import interrupts
    interrupts.install()
    previous = sys.excepthook

    def hook(kind, value, tb) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            return previous(kind, value, tb)
        print(line, file=sys.stderr, flush=True)
        os._exit(interrupts.exit_code())

    sys.excepthook = hook


def prepare(stop_within_s: float | None = None) -> None:
    """`stop_within_s`: how long a run asked to stop may take before it is ended (the default: 30 s)."""
    from tasks.core import interrupts, lifeline
    interrupts.install(stop_within_s or interrupts.EXIT_WITHIN_S)
    lifeline.guard_descendants()
    _start_temporary_server_apart_from_ctrl_c()


def _start_temporary_server_apart_from_ctrl_c() -> None:
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED
    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return  # a server of the user's: not ours to start
    from prefect.server.api import server
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    server.subprocess = _InNewSession()  # the module's own name for subprocess: its Popen only
    try:
        server.SubprocessASGIServer().start()  # the instance Prefect's clients then find and use (one per process)
    finally:
        server.subprocess = subprocess
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class _InNewSession:
    """`subprocess` as Prefect's server module uses it, with its Popen starting a new session."""

    def __getattr__(self, name: str):
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args, **kwargs) -> subprocess.Popen:  # noqa: N802 (subprocess's name)
        return subprocess.Popen(*args, start_new_session=True, **kwargs)
