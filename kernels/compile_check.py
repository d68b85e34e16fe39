"""Compile every kernel source with nvcc for the given GPU architectures, with every template
instantiation the Python wrappers can launch. Needs nvcc, not a GPU: CI runs it so that a syntax or
type error in CUDA code cannot land. NVRTC (used at run time) accepts the same text: no #include."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kernels import runtime

ARCHES = ("sm_80", "sm_90")


def translation_unit(file: str, expressions: list[str]) -> str:
    """The source plus a host-side table of kernel addresses, which makes nvcc instantiate each one."""
    table = ",\n  ".join(f"(const void*)&{e}" for e in expressions)
    return f"{runtime.source(file)}\n\nconst void* const instantiated[] = {{\n  {table}\n}};\n"


def compile_all(arches=ARCHES, nvcc: str | None = None) -> dict[tuple[str, str], str]:
    """{(file, arch): error text} for every source that failed; empty when all compiled."""
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc not found on PATH: install the CUDA toolkit to compile the kernels")
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        jobs = {}
        for file, expressions in runtime.every_instantiation().items():
            unit = Path(tmp) / file
            unit.write_text(translation_unit(file, expressions))
            for arch in arches:  # one nvcc per (source, arch), as many at once as there are cores
                jobs[(file, arch)] = pool.submit(subprocess.run, [
                    nvcc, "-std=c++17", f"-arch={arch}", "-c", str(unit), "-o", str(unit.with_suffix(f".{arch}.o"))],
                    capture_output=True, text=True)
        done = {key: job.result() for key, job in jobs.items()}
    return {key: out.stderr.strip() for key, out in sorted(done.items()) if out.returncode != 0}
