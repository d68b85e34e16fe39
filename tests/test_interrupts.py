"""Ctrl-C of a command-line run stops it wherever it lands in the main thread (tasks.core.interrupts).

Each test runs a small program in a fresh interpreter, with the interrupt set off at one exact point:
`signal.raise_signal` runs the handler at once, in the frame that calls it; `PyErr_SetInterrupt`, a C
function, only trips the flag, so the handler runs at the caller's next check, as a real SIGINT does.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Ctrl-C while the garbage collector runs a finalizer of the main thread
IN_A_FINALIZER = """
    import signal, sys, time, weakref
    {install}

    class Finalized:
        def __del__(self):
            if sys.argv[1] == "del":
                signal.raise_signal(signal.SIGINT)

    def callback(_):
        signal.raise_signal(signal.SIGINT)

    try:
        kept = Finalized()
        ref = weakref.ref(kept, callback) if sys.argv[1] == "weakref" else None
        del kept
        for _ in range(int(sys.argv[2])):  # the run going on as if nothing had happened
            time.sleep(0.01)
        print("went on")
    except KeyboardInterrupt:
        print("interrupted")
"""

INSTALL = "from tasks.core import interrupts; interrupts.install(); interrupts.install()  # twice is once"


def python(program: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(program), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.parametrize("where", ["del", "weakref"])
def test_an_interrupt_raised_in_a_finalizer_is_raised_again_outside_it(where):
    out = python(IN_A_FINALIZER.format(install=INSTALL), where, "6000")  # up to a minute: ends at the interrupt
    assert out.stdout.strip() == "interrupted", out
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_sigterm_prefect_raises_in_a_finalizer_stops_the_run_with_143():
    """During a flow run Prefect's SIGTERM handler raises TerminationSignal; raised in a finalizer it was
    dropped, and the run went on to exit 0 (an operator drill: 1 group SIGTERM in 8)."""
    program = IN_A_FINALIZER.replace("signal.SIGINT", "signal.SIGTERM").format(install=INSTALL + (
        "\n    from prefect.utilities.engine import _prefect_sigterm_handler"
        "\n    signal.signal(signal.SIGTERM, _prefect_sigterm_handler)  # as a flow run has it"))
    program = program.replace('except KeyboardInterrupt:\n        print("interrupted")',
                              'except BaseException as e:\n        print(type(e).__name__)')
    program += "    print(interrupts.exit_code())\n"
    out = python(program, "del", "6000")
    # raised again as the TerminationSignal it was: Prefect's engine records "aborted by a termination signal"
    # for it, and "by an interrupt signal" for a KeyboardInterrupt (a CI run's SIGTERM drill)
    assert out.stdout.split() == ["TerminationSignal", "143"], out
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_without_it_python_drops_an_interrupt_raised_in_a_finalizer():
    """What the handler is for: CPython's own behaviour, which the test above would otherwise not see."""
    out = python(IN_A_FINALIZER.format(install=""), "del", "100")
    assert out.stdout.strip() == "went on" and "KeyboardInterrupt" in out.stderr, out


LOGGING_LOCK = """
    import ctypes, logging, sys, threading
    {install}

    class TripsOnFirstAcquire:
        # what a real lock does, as seen from Handler.acquire(): a C call that returns holding it; the
        # first one also trips SIGINT, so the handler runs in Handler.acquire(), before handle()'s `try`
        def __init__(self):
            self.acquired = self.released = 0
        @property
        def acquire(self):
            self.acquired += 1
            return ctypes.pythonapi.PyErr_SetInterrupt if self.acquired == 1 else int
        def release(self):
            self.released += 1

    handler = logging.StreamHandler(sys.stdout)
    handler.lock = TripsOnFirstAcquire()
    log = logging.getLogger("run")
    log.addHandler(handler)
    try:
        log.warning("written")
        for _ in range(6000):
            __import__("time").sleep(0.01)
    except KeyboardInterrupt:
        print("interrupted")
    print("lock released:", handler.lock.acquired == handler.lock.released)
"""


def test_an_interrupt_just_after_a_logging_lock_is_taken_waits_for_its_release():
    out = python(LOGGING_LOCK.format(install=INSTALL))
    # "written" first, unless a loaded machine let the second try come before the record's write
    assert [line for line in out.stdout.split("\n") if line != "written"][:2] == ["interrupted", "lock released: True"], out


def test_an_interrupt_put_off_then_raised_by_the_pipelines_check_is_raised_once():
    """Put off in a lock window, then raised by raise_if_requested before the handler's own second try:
    that try must not raise it again, in the first one's cleanup (the run then died by SIGINT at exit)."""
    program = LOGGING_LOCK.format(install=INSTALL).replace("""        log.warning("written")
        for _ in range(6000):""", """        log.warning("written")
        interrupts.raise_if_requested()  # within the 10 ms before the handler asks again
        for _ in range(6000):""").replace("""    print("lock released:""", """    time.sleep(0.5)  # where a second KeyboardInterrupt would land
    print("once")
    print("lock released:""")
    out = python(program.replace("import ctypes, logging, sys, threading", "import ctypes, logging, sys, threading, time"))
    assert [line for line in out.stdout.split("\n") if line != "written"][:3] == ["interrupted", "once", "lock released: True"], out
    assert out.returncode == 0, out


def test_without_it_the_interrupt_leaves_the_logging_lock_held():
    out = python(LOGGING_LOCK.format(install=""))
    assert out.stdout.split("\n")[:2] == ["interrupted", "lock released: False"], out


IN_AN_IMPORT = """
    import ctypes, sys, time
    sys.path.insert(0, sys.argv[1])
    {install}

    class TripsInImportlib:
        # a finder that is a C function: importlib's own frame calls it, so the handler runs in importlib's
        # code, where the global import lock may be held (`_imp.acquire_lock()` then `try:`)
        find_spec = ctypes.pythonapi.PyErr_SetInterrupt
    ctypes.pythonapi.PyErr_SetInterrupt.restype = None  # "no spec here": the next finder is asked

    if sys.argv[2] == "importlib":
        sys.meta_path.insert(0, TripsInImportlib)
    try:
        import a_module
        sys.meta_path[:] = [f for f in sys.meta_path if f is not TripsInImportlib]
        for _ in range(6000):
            time.sleep(0.01)
    except KeyboardInterrupt as e:
        print("interrupted")
        tb = e.__traceback__
        while tb.tb_next:
            tb = tb.tb_next
        where = tb.tb_frame.f_code.co_filename
    print("imported:", "a_module" in sys.modules)
    print("module code ran to its end:", (sys.modules.get("a_module") and a_module.done) or False)
    print("raised in importlib's code:", where.startswith("<frozen importlib"))
"""


@pytest.mark.parametrize("install,in_importlib", [(INSTALL, False), ("", True)])
def test_an_interrupt_in_importlibs_own_code_is_raised_outside_it(tmp_path, install, in_importlib):
    """Put off while importlib's code runs: raised after the import, or (on a slow machine, where the
    second try comes sooner) in the module's own code, which is safe to interrupt."""
    (tmp_path / "a_module.py").write_text("done = True\n")
    out = python(IN_AN_IMPORT.format(install=install), str(tmp_path), "importlib")
    lines = out.stdout.split("\n")
    assert lines[0] == "interrupted" and lines[3] == f"raised in importlib's code: {in_importlib}", out


def test_an_interrupt_in_a_modules_own_code_is_raised_there(tmp_path):
    """Not put off to the end of the import: importlib holds the module's lock in a `with`, so the import
    fails cleanly, as it does without the handler (an import can take long, or block)."""
    (tmp_path / "a_module.py").write_text("import ctypes\nctypes.pythonapi.PyErr_SetInterrupt()\ndone = True\n")
    for install in (INSTALL, ""):
        out = python(IN_AN_IMPORT.format(install=install), str(tmp_path), "module")
        assert out.stdout.split("\n")[:4] == ["interrupted", "imported: False", "module code ran to its end: False",
                                               "raised in importlib's code: False"], out


# an interrupt dropped in a finalizer just before the main thread waits (as in Prefect's as_completed)
DROPPED_THEN_WAITING = """
        class Finalized:
            def __del__(self):
                signal.raise_signal(signal.SIGINT)
        try:
            Finalized()
            threading.Event().wait(3600)
            print("wait ended")
        except KeyboardInterrupt:
            print("interrupted")
"""


def test_an_interrupt_asked_again_wakes_a_main_thread_blocked_in_a_wait():
    """Dropped in a finalizer just before the main thread waits (as in Prefect's as_completed): asked
    again by a real signal, it ends the wait, rather than being run when the wait is over."""
    program = """
        import signal, threading
        from tasks.core import interrupts
        interrupts.install()
    """ + DROPPED_THEN_WAITING
    try:
        out = python(program)
    except subprocess.TimeoutExpired:
        pytest.fail("the interrupt waited for the end of the wait")
    assert out.stdout.strip() == "interrupted", out


def test_an_interrupt_asked_again_while_the_hook_still_runs_is_not_lost():
    """On a loaded machine (CI) the main thread was still in the unraisable hook when the interrupt it had
    asked for again arrived 10 ms later: raised inside the hook, it was dropped for good, and the run went on
    until the 30 s limit. Here the request lands inside the hook at once."""
    program = """
        import signal, threading
        from tasks.core import interrupts
        interrupts.install()
        later, calls = interrupts._resend_later, []
        def at_once():
            calls.append(1)
            if len(calls) == 1:  # as if the 10 ms had passed before the hook returned
                interrupts._State.resent = True
                signal.raise_signal(signal.SIGINT)
            else:
                later()
        interrupts._resend_later = at_once
    """ + DROPPED_THEN_WAITING
    out = python(program)
    assert out.stdout.strip() == "interrupted" and "had not stopped" not in out.stderr, out


def test_an_interrupt_prefect_drops_at_the_end_of_a_flow_run_is_raised_after_it(server):
    """Prefect logs and drops a KeyboardInterrupt that comes after the flow's code returned (here from an
    on_completion hook, which runs there); the pipeline asks again after each stage's flow run."""
    program = """
        import signal
        from prefect import flow
        from tasks.core import interrupts
        interrupts.install()

        def ctrl_c(flow, flow_run, state):
            signal.raise_signal(signal.SIGINT)

        @flow(on_completion=[ctrl_c])
        def stage():
            return 1

        print("state:", stage(return_state=True).type.value)
        try:
            interrupts.raise_if_requested()
            print("went on")
        except KeyboardInterrupt:
            print("interrupted")
    """
    out = python(program, env=server)
    assert out.stdout.split("\n")[:2] == ["state: COMPLETED", "interrupted"], out


def test_a_run_whose_shutdown_hangs_ends_after_the_limit():
    program = """
        import signal, threading, time
        from tasks.core import interrupts
        interrupts.install(exit_within_s=5.0)
        threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon: the exit waits for it
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """
    out = python(program)
    assert out.returncode == 130, out
    assert out.stdout == "interrupted\n" and "had not stopped 5 s after it was asked to; ending it now" in out.stderr, out
    assert "in _shutdown" in out.stderr, out.stderr  # every thread's stack: the main one waits for the sleeper


def test_other_lost_exceptions_still_reach_the_previous_hook():
    program = """
        from tasks.core import interrupts
        interrupts.install()
        class Broken:
            def __del__(self):
                raise ValueError("from a finalizer")
        Broken()
        print("went on")
    """
    out = python(program)
    assert out.stdout.strip() == "went on", out
    assert "Exception ignored" in out.stderr and "ValueError: from a finalizer" in out.stderr, out.stderr


def test_an_ignored_sigint_stays_ignored():
    """`nohup` and background jobs start with SIGINT ignored: installing must not bring it back."""
    program = """
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        from tasks.core import interrupts
        interrupts.install()
        signal.raise_signal(signal.SIGINT)
        print("went on", signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
    """
    out = python(program)
    assert out.stdout.strip() == "went on True", out


@pytest.mark.parametrize("ends_with,status", [("sys.exit(interrupts.exit_code())", 130), ("sys.exit(130)", -2)])
def test_a_command_stopped_by_ctrl_c_exits_130(tmp_path, ends_with, status):
    """A KeyboardInterrupt that escaped code a C extension ran through PyRun_String (numba's import does)
    made `python -m tasks ...` kill itself by SIGINT at exit, however main() had handled it."""
    (tmp_path / "a_command.py").write_text(textwrap.dedent(f"""
        import ctypes, sys
        from tasks.core import interrupts
        ctypes.pythonapi.PyRun_SimpleString(b"import signal; signal.raise_signal(signal.SIGINT)")
        {ends_with}
    """))
    out = subprocess.run([sys.executable, "-m", "a_command"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == status, out


def test_ctrl_c_as_the_scheduled_evaluation_ends_exits_130(server, tmp_path):
    """python -m flows.eval_schedule: a Ctrl-C that Prefect drops as the flow run ends still ends the
    command with its interrupt line and 130 (it used to print the result and exit 0)."""
    import yaml
    from tests.conftest import BENCHMARKS
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["paths"].update(data_dir=str(tmp_path / "data"), benchmarks_dir=str(BENCHMARKS))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    program = """
        import signal, sys
        from flows import eval_schedule

        def ctrl_c(flow, flow_run, state):
            signal.raise_signal(signal.SIGINT)

        eval_schedule.evaluate_checkpoints = eval_schedule.evaluate_checkpoints.with_options(on_completion=[ctrl_c])
        sys.exit(eval_schedule.main(sys.argv[1:]))
    """
    out = python(program, str(tmp_path / "params.yaml"), env=server)
    assert out.returncode == 130 and "interrupted: evaluation stopped" in out.stderr + out.stdout, out
    assert "'new': []" not in out.stdout, out  # the result is not printed as if the run had finished


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_during_the_commands_imports_ends_it_with_its_line(sig):
    """Prefect's imports take seconds: a SIGTERM then killed `python -m flows.pipeline` with no line (status
    -15), a Ctrl-C printed a KeyboardInterrupt traceback (found by an operator drill)."""
    program = f"""
        import signal, sys
        from flows.command_line import stop_during_imports
        stop_during_imports("interrupted: the pipeline stopped; rerun it to resume")
        signal.raise_signal(signal.{sig})  # as if it came during the imports that follow
        import prefect
        print("went on")
    """
    out = python(program)
    assert out.stdout == "" and out.stderr == "interrupted: the pipeline stopped; rerun it to resume\n", out
    assert out.returncode == {"SIGINT": 130, "SIGTERM": 143}[sig]
