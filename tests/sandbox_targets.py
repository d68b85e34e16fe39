"""Functions the sandbox tests run in a child process."""
import time


def upper_or_hang(x: str) -> str:
    if x == "hang":
        time.sleep(60)
    if x == "boom":
        raise ValueError("bad item")
    return x.upper()


def not_plain_data(x: str) -> object:
    return object() if x == "object" else x


def slow_upper(x: str) -> str:
    time.sleep(0.5)
    return x.upper()


def upper_or_die(x: str) -> str:
    """A native crash, as a C extension's segfault ends the child: no answer, no exception."""
    if x == "die":
        import os
        os._exit(139)
    return x.upper()


def _start_helper() -> None:
    """A process that outlives the child and holds its frame pipe open: a fork (as multiprocessing's
    default start on Linux) keeps every descriptor, the child's private ones included; its pid goes
    to the file the test named, for the test to end it."""
    import os
    pid = os.fork()
    if pid == 0:
        time.sleep(300)
        os._exit(0)
    with open(os.environ["SANDBOX_TEST_HELPER_PIDS"], "a") as f:
        f.write(f"{pid}\n")


def upper_noisy(x: str) -> str:
    """What libraries do with the child's standard streams: a C library's printf, a tool it runs, a read of stdin."""
    import os
    import subprocess
    if x == "printf":
        os.write(1, b"libfoo: warning: odd markup\n")
    elif x == "tool":
        subprocess.run(["echo", "tool output"], check=True)
    elif x == "stdin":
        assert os.read(0, 4096) == b""  # nothing to read: never the parent's frames
    return x.upper()


def upper_or_die_leaving_a_helper(x: str) -> str:
    if x == "die":
        import os
        _start_helper()
        os._exit(139)
    return x.upper()


def _broken_at_import() -> None:
    import os
    if os.environ.get("SANDBOX_TEST_BREAK_AT_IMPORT"):
        _start_helper()
        raise ImportError("broken at import, a helper left running")


_broken_at_import()
