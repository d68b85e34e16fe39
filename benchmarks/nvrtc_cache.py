"""Every kernel instantiation compiled by NVRTC into CuPy's on-disk cache, in parallel processes: the
first step of `make gpu-check`, so that the tests, the benchmark and the sweep load what they launch
instead of each compiling it in turn (on a lent H200: 240 instantiations in 9.8 s with 12 processes).
The sweep's register-capped variants (NVRTC's --maxrregcount) are not among them: it compiles those.

    python -m benchmarks.nvrtc_cache [--processes 12]

Each process compiles its share through kernels.runtime, as a launch would (same source, options and
device, so the same cache entry). A failed compile is printed in one line and the command ends 1; a
process that dies (a crash in NVRTC) ends it too, rather than leaving it waiting on that process."""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor


def compile_one(item: tuple[str, str]) -> str | None:
    from kernels import runtime
    file, expression = item
    try:
        runtime._function(file, expression)
    except Exception as e:  # noqa: BLE001 - reported, the others still compile
        first = str(e).splitlines()[0] if str(e) else ""
        return f"{file} {expression}: {type(e).__name__}: {first}"[:300]
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=min(12, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    import kernels
    from kernels import runtime
    if not kernels.fused_available():
        print("nvrtc_cache: no CUDA GPU with CuPy here")
        return 1
    items = [(file, e) for file, expressions in runtime.every_instantiation().items() for e in expressions]
    start = time.perf_counter()
    # spawn: a forked child would inherit the parent's CUDA state, which CUDA does not allow. An executor,
    # not a Pool: a worker that dies raises BrokenProcessPool here, where Pool.map waited for it forever
    with ProcessPoolExecutor(args.processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        failed = [r for r in pool.map(compile_one, items, chunksize=2) if r]
    for line in failed:
        print("FAILED", line)
    # last: gpu-check prints a step's last lines
    print(f"nvrtc_cache: {len(items)} instantiations in {time.perf_counter() - start:.1f} s, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
