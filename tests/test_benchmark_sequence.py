"""benchmarks.sequence, which runs `make bench` and `make gpu-check`: steps in order, a failure stops
the sequence (or not, for gpu-check), and SIGTERM stops the step in progress and what it started."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from benchmarks import gpu_check, sequence
from benchmarks.sequence import Step, run
from tests.conftest import REPO


def py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", textwrap.dedent(code))


def test_steps_run_in_order_and_a_failure_stops_the_rest(tmp_path, capfd):
    steps = [Step("one", py("print('first')")), Step("two", py("import sys; print('second'); sys.exit(3)")),
             Step("three", py("print('third')"))]
    assert run(steps) == 1
    out, err = capfd.readouterr()
    assert out.splitlines() == ["== one", "first", "== two", "second"]
    assert err.strip() == "two failed (exit 3); 1 not run"


def test_keep_going_runs_every_step_logs_each_and_prints_its_tail(tmp_path, capfd):
    steps = [Step("fails", py("import sys; print('a\\nb\\nc'); sys.exit(1)"), tmp_path / "fails.log", tail=2),
             Step("passes", py("import sys; print('d'); print('e', file=sys.stderr)"), tmp_path / "passes.log")]
    assert run(steps, keep_going=True) == 1
    out, err = capfd.readouterr()
    assert out.splitlines() == ["== fails", "b", "c", "== passes", "d", "e"]
    assert err.strip() == "failed: fails"
    assert (tmp_path / "fails.log").read_text() == "a\nb\nc\n"
    assert run(steps[1:], keep_going=True) == 0


def test_unknown_benchmark_is_a_one_line_usage_error(capsys):
    with pytest.raises(SystemExit) as exit:
        sequence.main(["train", "nosuch"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"no benchmark named nosuch (known: {' '.join(sequence.BENCHMARKS)})")


def test_every_declared_benchmark_and_gpu_check_step_is_a_module_here():
    assert all((REPO / "benchmarks" / f"{name}.py").is_file() for name in sequence.BENCHMARKS)
    for step in gpu_check.steps(REPO / "gpu-logs"):
        module = step.argv[step.argv.index("-m") + 1]
        path = "tests/test_kernels_gpu.py" if module == "pytest" else module.replace(".", "/") + ".py"
        assert (REPO / path).is_file(), step


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped) is not running
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_step_in_progress_and_what_it_started(tmp_path, signum):
    """The step starts a grandchild that would outlive it; the signal must reach both, and the next
    step must not start."""
    pids, marker = tmp_path / "pids", tmp_path / "second-step-ran"
    first = py(f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(600)
        """)
    second = py(f"open({str(marker)!r}, 'w')")
    runner = subprocess.Popen(
        py(f"""
            import sys
            from benchmarks.sequence import Step, run
            sys.exit(run([Step("sleeps", {first!r}), Step("marks", {second!r})]))
            """),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        started = [int(p) for p in pids.read_text().split()]
        runner.send_signal(signum)
        out, err = runner.communicate(timeout=120)
        assert runner.returncode == 128 + signum, err
        assert err.strip().splitlines()[-1] == \
            f"interrupted ({signal.Signals(signum).name}): sleeps stopped; the steps after it not run", err
        deadline = time.monotonic() + 60
        while any(map(alive, started)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(alive, started))
        assert not marker.exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            runner.kill()
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
