"""Ctrl-C of a command-line run (`python -m flows.pipeline`, `python -m flows.eval_schedule`,
`python -m tasks`): the run stops, whatever the main thread happened to be doing when it came.

Python's own handler raises KeyboardInterrupt at the next bytecode of the main thread, wherever that
is. Drills that pressed Ctrl-C at random moments of a pipeline run found three places where that goes
wrong, each in a few percent of the presses:

- **A finalizer** (a `__del__` or weakref callback run by the garbage collector, which Prefect, pydantic
  and asyncio set off all the time): the interpreter cannot raise from there, prints "Exception ignored
  in: ... KeyboardInterrupt" and goes on. The run ignored its Ctrl-C and went on to the next stage.
- **Prefect's end of a flow run**: an interrupt that lands after the flow's code has returned, while
  Prefect records the Completed state, is logged at debug level and dropped (flow_engine: "BaseException
  was raised after user code finished executing"). Same outcome.
- **Between taking a lock and the `try` that releases it**: importlib's global import lock and
  logging's handler locks are taken that way. The main thread keeps the lock, and the next thread to
  import anything or write to that handler waits forever, at exit too.

So `install()` puts a handler in Python's place that records the request (`requested()`,
`raise_if_requested()` for the points after a call that may have dropped it), raises KeyboardInterrupt
unless the main thread is in one of those lock windows (then it signals the main thread again a moment
later), and asks again for an interrupt that a finalizer dropped. And a run asked to stop ends within
`exit_within_s` even if its shutdown hangs somewhere else, with every thread's stack for a bug report:
the lifeline (tasks.core.lifeline) then stops what it had started.
"""
from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import signal
import sys
import threading
import time

# a clean stop takes seconds (shards get 5 s, ranks ~2 s, Prefect's server 5 s); a shard blocked in a
# read of a stalled server needs up to download.timeout_s more, which the commands add
EXIT_WITHIN_S = 30.0
_RESEND_AFTER_S = 0.01  # long enough to leave a finalizer or a lock window; short against a person
_requested = threading.Event()


class _State:
    """Whether the main thread is owed a KeyboardInterrupt (put off, or dropped in a finalizer), and
    whether the SIGINT on its way is one this module sent. Plain flags, not a lock: the signal handler
    runs in the main thread between any two bytecodes, where taking a lock the main thread may already
    hold would never return. And how long a run asked to stop may take (the last install's)."""
    owed = False
    resent = False
    exit_within_s = EXIT_WITHIN_S
    code = 130  # 128 + the signal that asked the run to stop: SIGINT, or SIGTERM (143)
    hook_code = None  # the unraisable hook's code, where an interrupt must not be raised
    # what a finalizer dropped, when it was not a KeyboardInterrupt (Prefect's TerminationSignal): raised again
    # as it was, so the flow run is recorded as aborted by a termination signal, not by an interrupt
    owed_exc = None


_LOGGING_LOCK_WINDOWS = {"acquire", "_acquireLock"}  # Handler.acquire() / _acquireLock(), then `try:`
_IMPORTLIB_FILES = (os.path.join("importlib", "_bootstrap.py"), os.path.join("importlib", "_bootstrap_external.py"))


def install(exit_within_s: float = EXIT_WITHIN_S) -> None:
    """From the main thread, as early as the command can (a Ctrl-C during its imports counts too);
    again, once the params are read, to set the limit. Leaves SIGINT alone where it is ignored (a `nohup`
    or background job) or handled by someone else, and outside the main thread (a test calling a
    command's main() in a worker thread), where no signal handler can be set."""
    if threading.current_thread() is not threading.main_thread():
        return
    _State.exit_within_s = exit_within_s
    guard_flow_run()  # the finalizer hook and the SIGINT handler
    # SIGTERM (`timeout`, `kill`, a scheduler) stops the run as Ctrl-C does, with exit status 143: by default
    # it killed the process at once, with no line, leaving Prefect's runs and the shards unreported
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _on_sigterm):
        signal.signal(signal.SIGTERM, _on_sigterm)


def guard_flow_run() -> None:
    """What `install` sets up bar SIGTERM and the limit. From a deployment's flow code, first thing: a worker runs it in `python -m prefect.engine`, where no
    command installed this module, and Prefect's SIGTERM handler (the worker's stop, flows/worker.py) raised
    its TerminationSignal in a finalizer now and then. Dropped there, the run went on to its end, was
    killed by the worker a minute later and stayed Running in the UI (a CI run of the worker drill). Here
    the dropped signal is raised again, as in a command-line run; SIGTERM stays Prefect's, and the limit set
    by a command's `install` stays as it was."""
    if threading.current_thread() is not threading.main_thread():
        return
    _raise_lost_interrupts()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # the resent request arrives as SIGINT
        signal.signal(signal.SIGINT, _on_sigint)


def exit_code() -> int:
    """130, the exit status of a command stopped by Ctrl-C (143 by SIGTERM), and no other: a KeyboardInterrupt that
    escaped code a C extension ran through PyRun_String (numba's import does) sets a flag in CPython 3.11
    that makes `python -m ...` kill itself by SIGINT at exit (status -2) however the program handled it."""
    try:
        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (ValueError, AttributeError):  # another Python keeps it elsewhere; a shell still says 130
        pass
    return _State.code


def interrupted(line: str) -> int:
    """What a command does once Ctrl-C has stopped it: its one line on stderr, and exit status 130."""
    print(line, file=sys.stderr)
    return exit_code()


def requested() -> bool:
    """Whether Ctrl-C was pressed during this run."""
    return _requested.is_set()


def raise_if_requested() -> None:
    """After a call into code that may have dropped the interrupt (a Prefect flow run)."""
    if _requested.is_set():
        _State.owed = False  # paid here: a SIGINT this module still has on its way is not raised again
        raise _pay()


def stops_the_run(kind: type[BaseException]) -> bool:
    """Whether an exception is a signal asking the run to stop: KeyboardInterrupt (Ctrl-C, or SIGTERM through
    this module) or Prefect's TerminationSignal (SIGTERM while its handler is in place, in a flow run)."""
    return isinstance(kind, type) and (issubclass(kind, KeyboardInterrupt) or kind.__name__ == "TerminationSignal")


def _on_sigterm(signum, frame) -> None:
    _State.code = 128 + signal.SIGTERM
    _on_sigint(signum, frame)


def _on_sigint(signum, frame) -> None:
    if not _requested.is_set():
        _requested.set()
        threading.Thread(target=_exit_if_still_running, args=(_State.exit_within_s,), name="exit-after-interrupt",
                         daemon=True).start()
    if _State.resent:  # ours: raised only if still owed (raise_if_requested may have raised it meanwhile;
        _State.resent = False  # a second KeyboardInterrupt would land in the first one's cleanup)
        if not _State.owed:
            return
    if _in_lock_window(frame) or _in_the_hook(frame):
        _State.owed = True
        _resend_later()
        return
    _State.owed = False
    raise _pay()


def _pay() -> BaseException:
    """The exception that stops the run: the one a finalizer dropped, or KeyboardInterrupt."""
    exc, _State.owed_exc = _State.owed_exc, None
    return exc.with_traceback(None) if exc is not None else KeyboardInterrupt()


def _in_lock_window(frame) -> bool:
    """Where the handler would raise between taking a lock and the `try` that releases it: in
    importlib's own code (`_imp.acquire_lock()` then `try:` takes the global import lock), or just back
    from taking a logging lock. The handler runs in the innermost frame, so that frame is the one to
    look at: a module's own code, run inside an import, is safe to interrupt (importlib holds the
    module's lock in a `with`), and the import then fails as it always did."""
    if frame is None:
        return False
    code = frame.f_code
    return _importlib_code(code) or (code.co_filename == logging.__file__ and code.co_name in _LOGGING_LOCK_WINDOWS)


def _in_the_hook(frame) -> bool:
    """Whether the main thread is still in the unraisable hook below, which asks again for an interrupt a
    finalizer dropped: raised there, it is dropped again, for good (a loaded machine can hold the main
    thread there past the 10 ms the request waits; the run then ran on until its limit)."""
    while frame is not None:
        if frame.f_code is _State.hook_code:
            return True
        frame = frame.f_back
    return False


def importing(frame) -> bool:
    """Whether the thread running `frame` is anywhere inside an import. An exception raised in another
    thread (tasks/core/shard_threads.py) lands at whatever bytecode that thread runs next, maybe in
    importlib's lock windows, so there the whole import is avoided."""
    while frame is not None:
        if _importlib_code(frame.f_code):
            return True
        frame = frame.f_back
    return False


def _importlib_code(code) -> bool:
    name = code.co_filename  # "<frozen importlib._bootstrap>", or a path under -X frozen_modules=off
    return name.startswith("<frozen importlib") or name.endswith(_IMPORTLIB_FILES)


def _raise_lost_interrupts() -> None:
    """An unraisable-exception hook that takes a KeyboardInterrupt dropped in a finalizer of the main
    thread and asks for it again, from a helper thread: asked for at once, the handler would run inside
    the hook, that is, still inside the finalizer. Every other exception goes to the previous hook."""
    if getattr(sys.unraisablehook, "_raises_lost_interrupts", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        # Prefect's SIGTERM handler, in place during a flow run, raises TerminationSignal: dropped the same way
        # (a run went on to exit 0), it is asked for again through the Ctrl-C path, with SIGTERM's code, and
        # raised again as itself (as a KeyboardInterrupt, Prefect recorded "aborted by an interrupt signal")
        if stops_the_run(unraisable.exc_type) and threading.current_thread() is threading.main_thread() \
                and not getattr(threading, "_SHUTTING_DOWN", False):  # at exit: reported, as Python does
            if not issubclass(unraisable.exc_type, KeyboardInterrupt):
                _State.code = 128 + signal.SIGTERM
                _State.owed_exc = unraisable.exc_value
            _State.owed = True
            _resend_later()
            return
        previous(unraisable)

    hook._raises_lost_interrupts = True
    _State.hook_code = hook.__code__
    sys.unraisablehook = hook


def _resend_later() -> None:
    def resend() -> None:
        time.sleep(_RESEND_AFTER_S)
        # SIGINT again, to the main thread: a real signal, so that a main thread blocked in a wait
        # (Prefect's as_completed, a join) wakes to run the handler now, not when the wait ends
        if _State.owed and callable(signal.getsignal(signal.SIGINT)) \
                and not getattr(threading, "_SHUTTING_DOWN", False):  # not at exit, nor where SIGINT is ignored
            _State.resent = True
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    threading.Thread(target=resend, name="resend-interrupt", daemon=True).start()


def _exit_if_still_running(after_s: float) -> None:
    time.sleep(after_s)
    try:
        sys.stdout.flush()
        sys.stderr.write(f"interrupted: the run had not stopped {after_s:g} s after it was asked to; ending it now. "
                         "Where each thread was (for a bug report):\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(all_threads=True)
    finally:
        os._exit(_State.code)
