"""`make worker`: Prefect's process worker for prefect.yaml's deployments, which SIGTERM stops.

    python -m flows.worker [prefect worker start options ...]

Prefect's worker answers SIGTERM by sending itself SIGINT, whose KeyboardInterrupt ends it. A process
started with SIGINT ignored keeps it ignored (a shell's background job, `make worker &`, nohup), and
Python then leaves it so: the SIGINT did nothing and the worker ran on, executing scheduled runs minutes
after `kill <make's pid>` (an operator drill), until a second SIGTERM, which Prefect turns into SIGKILL.
A shell cannot give an ignored signal back its default, so this does, and then becomes the worker.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

POOL = "local-process"  # prefect.yaml's work_pool for every deployment; `make deploy` creates it


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # kept across exec: Python then installs its KeyboardInterrupt
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    prefect = str(Path(sys.executable).with_name("prefect"))
    os.execv(prefect, [prefect, "worker", "start", "--pool", POOL, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
