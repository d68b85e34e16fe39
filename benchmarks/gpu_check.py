"""Every check that needs a GPU, each logged into its own file: what `make gpu-check` runs.

    python -m benchmarks.gpu_check [--logs gpu-logs]

Every kernel instantiation compiled at once into CuPy's cache (benchmarks/nvrtc_cache.py), then the
fused kernels against their references (tests/test_kernels_gpu.py), the kernel benchmark with the
~350M step (eager and torch.compile), the MinHash kernel against the CPU signatures, and the
launch-shape sweep (the table the kernels' defaults were chosen from). Each step's log is in --logs and
its last lines are printed; a failed step does not stop the others, and the check then ends 1. Where
there is no CUDA GPU with CuPy it stops at once with one line, rather than report the skipped tests as
passed. It needs no venv: a system python with torch, CuPy, pydantic (the step imports trainer/), numba
(the MinHash step) and pytest."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.sequence import Step, run


def steps(logs: Path) -> list[Step]:
    py = sys.executable
    return [
        Step("NVRTC cache", (py, "-m", "benchmarks.nvrtc_cache"), logs / "nvrtc_cache.log", 3),
        Step("GPU tests", (py, "-m", "pytest", "-q", "tests/test_kernels_gpu.py"), logs / "test_kernels_gpu.log", 3),
        Step("benchmarks.kernels", (py, "-m", "benchmarks.kernels", "--reps", "30", "--step-compile"),
             logs / "kernels.log", 25),
        Step("MinHash kernel", (py, "-m", "tasks.dedup.gpu"), logs / "dedup_gpu.log", 3),
        Step("benchmarks.kernel_sweep", (py, "-m", "benchmarks.kernel_sweep", "--json", str(logs / "sweep.json")),
             logs / "sweep.log", 25),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", type=Path, default=Path("gpu-logs"), help="folder of the steps' logs")
    args = ap.parse_args(argv)
    import kernels
    if not kernels.fused_available():
        sys.exit("gpu-check: no CUDA GPU with CuPy here")
    args.logs.mkdir(parents=True, exist_ok=True)
    return run(steps(args.logs), keep_going=True)


if __name__ == "__main__":
    sys.exit(main())
