"""The child side of tasks.extract.sandbox: `python -m tasks.extract.sandbox_child module:function`.

Its own module so that the child imports nothing it does not use (the parent side pulls in
subprocess, threading, select and typing: ~15 ms of a ~60 ms start, paid once per stage run).
Frames are an 8-byte little-endian length and a `marshal` blob, so items and results are plain
data (bytes, str, numbers, bools, None, tuples/lists/dicts of them): marshal is built in, where
importing pickle alone took a quarter of the child's start. The first frame the child writes is READY.
"""
import importlib
import marshal
import os
import signal
import struct
import sys

READY = "ready"
_HDR = struct.Struct("<Q")


def frame(obj) -> bytes:
    try:
        data = marshal.dumps(obj)
    except ValueError as e:
        raise TypeError(f"sandbox items and results must be plain data (bytes, str, numbers, "
                        f"tuples, lists, dicts), got {type(obj).__name__}: {e}") from None
    return _HDR.pack(len(data)) + data


def write_frame(fd: int, obj) -> None:
    _write_all(fd, frame(obj))


def _write_all(fd: int, data: bytes) -> None:
    buf = memoryview(data)
    while buf:
        buf = buf[os.write(fd, buf):]


def _read_exact(fd: int, n: int) -> bytes:
    parts = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def read_frame(fd: int):
    (n,) = _HDR.unpack(_read_exact(fd, _HDR.size))
    return marshal.loads(_read_exact(fd, n))


def _private(fd: int, replacement: int) -> int:
    """Move the frame pipe on `fd` to a descriptor of its own, and put `replacement` on `fd`.

    Native code writes to descriptor 1 (a C library's printf, a tool it runs): in the frame stream
    that read as a frame length, and the parent waited forever for a frame that never came. A
    library that reads descriptor 0 took frames meant for the loop. The private copy is not
    inherited, so a process the library starts cannot hold the pipe open after the child died.
    """
    private = os.dup(fd)  # os.dup: close-on-exec
    os.dup2(replacement, fd)
    if replacement > 2:
        os.close(replacement)
    return private


def serve(target: str) -> None:
    """Answer every item frame with (True, fn(item)) or (False, "Error: message"); stop on None/EOF."""
    # Ctrl-C in a terminal signals the whole process group: a child that died of it mid-item was taken
    # for a crash on that page, which was then dropped from a shard that completed. The parent stops
    # the child (it closes the pipe or kills it) when it is interrupted itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rfd, wfd = _private(0, os.open(os.devnull, os.O_RDONLY)), _private(1, 2)
    sys.stdout = sys.stderr  # unbuffered, as stderr is: a crash loses none of what the library printed
    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    write_frame(wfd, READY)
    while True:
        try:
            item = read_frame(rfd)
        except EOFError:
            return
        if item is None:
            return
        try:
            out = frame((True, fn(item)))
        except Exception as e:  # reported per item, never fatal to the shard
            out = frame((False, f"{e.__class__.__name__}: {e}"))
        _write_all(wfd, out)


if __name__ == "__main__":
    serve(sys.argv[1])
