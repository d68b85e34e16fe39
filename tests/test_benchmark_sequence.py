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
from tests.conftest import REPO, all_end


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


def test_make_bench_runs_every_benchmark_also_after_one_fails(monkeypatch):
    """eval stopped `make bench` on a fresh clone (it needs `make run`'s tokenizer): kernels and determinism
    never ran."""
    called = {}
    monkeypatch.setattr(sequence, "run", lambda steps, **kw: called.update(steps=steps, **kw) or 0)
    assert sequence.main([]) == 0
    assert [s.name for s in called["steps"]] == [f"benchmarks.{n}" for n in sequence.BENCHMARKS]
    assert called["keep_going"] is True


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


# the step's child: `stop` runs on SIGINT/SIGTERM ("slow": a second of shutdown, then a line on the shared
# stderr, as torchrun's ranks take; "deaf": ignores them); it says "ready" once its handlers are in place
GRANDCHILD = """
import signal, sys, time
def stop(*_):
    time.sleep(1)
    sys.stderr.write("grandchild stopped\\n")
    sys.exit(0)
handler = stop if sys.argv[1] == "slow" else signal.SIG_IGN
signal.signal(signal.SIGINT, handler)
signal.signal(signal.SIGTERM, handler)
print("ready", flush=True)
time.sleep(600)
"""


def start_runner(tmp_path, grandchild: str, group_exit_s: float = sequence.GROUP_EXIT_S):
    """The sequence of two steps in a process of its own; the first step's pid and its child's, once both
    are in place."""
    pids, marker = tmp_path / "pids", tmp_path / "second-step-ran"
    first = py(f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", {GRANDCHILD!r}, {grandchild!r}], stdout=subprocess.PIPE)
        child.stdout.readline()
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(600)
        """)
    second = py(f"open({str(marker)!r}, 'w')")
    runner = subprocess.Popen(
        py(f"""
            import sys
            from benchmarks import sequence
            sequence.GROUP_EXIT_S = {group_exit_s}
            sys.exit(sequence.run([sequence.Step("sleeps", {first!r}), sequence.Step("marks", {second!r})]))
            """),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    return runner, [int(p) for p in pids.read_text().split()], marker


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_step_in_progress_and_what_it_started(tmp_path, signum):
    """The step starts a grandchild that would outlive it; the signal must reach both, the sequence must
    wait for both before its line (a grandchild's last words came after it), and the next step must not start."""
    runner, started = None, []
    try:
        runner, started, marker = start_runner(tmp_path, "slow")
        runner.send_signal(signum)
        out, err = runner.communicate(timeout=120)
        assert runner.returncode == 128 + signum, err
        lines = err.strip().splitlines()
        assert "grandchild stopped" in lines and lines[-1] == \
            f"interrupted ({signal.Signals(signum).name}): sleeps stopped; the steps after it not run", err
        assert all_end(started, 30)
        assert not marker.exists()
    finally:
        stop_all(runner, started)


def test_what_a_stopped_step_started_and_does_not_end_is_killed(tmp_path):
    runner, started = None, []
    try:
        runner, started, _ = start_runner(tmp_path, "deaf", group_exit_s=1)
        runner.send_signal(signal.SIGTERM)
        out, err = runner.communicate(timeout=120)
        assert runner.returncode == 128 + signal.SIGTERM, err
        assert all_end(started, 30), "the deaf grandchild outlived the sequence"
    finally:
        stop_all(runner, started)


def stop_all(runner, pids) -> None:
    if runner is not None:
        with contextlib.suppress(ProcessLookupError):
            runner.kill()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
