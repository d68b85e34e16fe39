"""Benchmarks one after another, each in its own process: what `make bench` runs.

    python -m benchmarks.sequence [name ...]     # default: every benchmark, in the README's order

Every benchmark runs, also after one fails; it ends 1 and names those that failed.

A kill of make reaches this process alone (make passes SIGTERM on to its child, and the Makefile
execs this): it passes the signal on to the step in progress and to everything that step started
(its own process group: torchrun ranks, servers), waits for all of them (what still runs 30 s later
is killed), and stops with one line, exit 128 + the signal. The shell loop it replaces died of the
signal and left the benchmark running.
`make gpu-check` runs its steps through the same `run` (benchmarks/gpu_check.py)."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from tasks.core import lifeline

GROUP_EXIT_S = 30.0  # how long what a stopped step started may take to end before it is killed

# every benchmark, in the order of the README's Benchmarks section
BENCHMARKS = ("extract", "langid", "decontam", "filter", "filter_agreement", "dedup", "blend", "train", "resume",
              "eval", "kernels", "determinism")


@dataclass(frozen=True)
class Step:
    """One command of a sequence. `log`: its output goes there and its last `tail` lines are printed
    after it; None: its output goes straight through."""
    name: str
    argv: tuple[str, ...]
    log: Path | None = None
    tail: int = 25


class _Forwarder:
    """SIGINT and SIGTERM, while installed, go on to the running step's process group; the first
    one received is kept (a second Ctrl-C is passed on too, and changes nothing here)."""

    def __init__(self):
        self.received: int | None = None
        self.child: subprocess.Popen | None = None

    def __call__(self, signum, _frame):
        self.received = self.received or signum
        self.forward(signum)

    def forward(self, signum: int) -> None:
        if self.child is not None and self.child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child.pid, signum)

    @contextlib.contextmanager
    def installed(self):
        before = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in before.items():
                signal.signal(s, handler)


def _run_one(step: Step, forwarder: _Forwarder) -> int:
    out = open(step.log, "wb") if step.log else None
    try:
        # its own process group, so that a signal reaches whatever the step starts, and not make
        forwarder.child = subprocess.Popen(step.argv, stdout=out, stderr=subprocess.STDOUT if out else None,
                                           start_new_session=True)
        if forwarder.received:  # arrived between the check before this step and its start
            forwarder.forward(forwarder.received)
        code = forwarder.child.wait()
        if forwarder.received:  # what the step started (ranks, servers) may outlive it: waited for as well
            _wait_for_group(forwarder.child.pid, GROUP_EXIT_S)
        return code
    finally:
        forwarder.child = None
        if out:
            out.close()


def _wait_for_group(pgid: int, within_s: float) -> None:
    """Until the stopped step's group has ended (its grandchildren wrote to the same terminal after the
    line that says the sequence stopped, or were still running when it exited); killed after `within_s`."""
    deadline = time.monotonic() + within_s
    while any(int(fields[2]) == pgid for _, fields in lifeline.live_processes()):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            return
        time.sleep(0.05)


def _print_tail(step: Step) -> None:
    if step.log and step.log.exists():
        with open(step.log, "rb") as f:
            lines = deque(f, maxlen=step.tail)
        sys.stdout.write(b"".join(lines).decode(errors="replace"))
        sys.stdout.flush()


def run(steps: list[Step], keep_going: bool = False, header: bool = True) -> int:
    """Each step in turn: 0 when all passed. A failed step stops the sequence, or with `keep_going`
    the sequence goes on and ends 1. On SIGINT/SIGTERM: the step in progress gets the signal, the
    rest do not run, 128 + the signal."""
    failed, started = [], None
    with _Forwarder().installed() as forwarder:
        for i, step in enumerate(steps):
            if forwarder.received:
                break
            if header:
                print(f"== {step.name}", flush=True)
            started = step.name
            code = _run_one(step, forwarder)
            _print_tail(step)
            if forwarder.received:
                break
            if code != 0:
                failed.append(step.name)
                if not keep_going:
                    rest = len(steps) - i - 1
                    print(f"{step.name} failed (exit {code}); " + (f"{rest} not run" if rest else "it was the last"),
                          file=sys.stderr, flush=True)
                    return 1
        if forwarder.received:
            name = signal.Signals(forwarder.received).name
            where = f"{started} stopped" if started else "before the first step"
            print(f"interrupted ({name}): {where}; the steps after it not run", file=sys.stderr, flush=True)
            return 128 + forwarder.received
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", metavar="name", help=f"benchmarks to run (default: {' '.join(BENCHMARKS)})")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"no benchmark named {', '.join(unknown)} (known: {' '.join(BENCHMARKS)})")
    names = args.names or BENCHMARKS
    # the benchmarks are independent: one that cannot run here (eval before `make run`, kernels without
    # nvcc) does not keep the others' figures from being printed; the sequence still ends 1, naming it
    return run([Step(f"benchmarks.{n}", (sys.executable, "-m", f"benchmarks.{n}")) for n in names], keep_going=True)


if __name__ == "__main__":
    sys.exit(main())
