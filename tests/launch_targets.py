"""A stand-in rank for the launcher's tests: `python -m tests.launch_targets <file>` does what the file says,
as a rank of trainer.run ends: its one-line error and exit code, killed by a signal, or still working."""
import os
import signal
import sys
import time
from pathlib import Path


def main(path: str) -> int:
    what = Path(path).read_text(encoding="utf-8").strip()
    print("rank up", flush=True)
    if what.startswith("say "):  # as trainer.run prints a failure (tasks.core.errors.describe)
        print(what[4:], file=sys.stderr, flush=True)
        return 1
    if what == "killed":  # as the kernel's out-of-memory killer ends a rank: no line of its own
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "busy":
        time.sleep(600)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
