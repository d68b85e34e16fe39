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
