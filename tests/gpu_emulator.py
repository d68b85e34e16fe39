"""The kernels of kernels/cuda/ run on the CPU: each instantiation compiled by the host C++ compiler
after tests/gpu_emulator.h (CUDA threads as fibers, barriers and warp shuffles emulated), launched
through the same Python wrappers as on a GPU, with `runtime.launch` swapped for `launch` below.

This checks what can be wrong without a GPU in sight: indexing, the rows and columns each thread and
block takes, barriers, shuffles, races in shared memory (races=True), template logic and the wrappers'
launch shapes. Every tensor argument is copied into a mapping of its own that ends at a protected page
(a read or write past the end faults), after guard bytes (NaN in every float type, tagged per argument:
a write before it raises, a read before it shows as NaN). It does not replace tests/test_kernels_gpu.py:
timing, NVRTC, the fp32 contraction nvcc does (FMA) and the hardware's exp are the GPU's."""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from kernels import runtime

HEADER = Path(__file__).with_name("gpu_emulator.h")
CXX = shutil.which("g++") or shutil.which("c++")
ARCH = 900  # __CUDA_ARCH__: the sm_80+ paths (PTX conversions) an H100 or H200 runs
# uninitialised locals filled with a pattern (fresh fiber stacks would read as zeros), every misaligned
# typed access a trap (a GPU faults on one; x86 would not), stack frames probed page by page
FLAGS = ("-std=c++17", "-O1", "-fPIC", "-fvisibility=hidden", "-w", f"-D__CUDA_ARCH__={ARCH}",
         "-ftrivial-auto-var-init=pattern", "-fsanitize=alignment", "-fsanitize-undefined-trap-on-error",
         "-fstack-clash-protection")  # a frame larger than a thread's stack touches its guard page
GUARD = 256  # guard bytes before every tensor argument
CACHE = Path(os.environ.get("GPU_EMULATOR_CACHE", Path(tempfile.gettempdir()) / f"gpu-emulator-{os.getuid()}"))
UNUSED_FOR_S = 14 * 86400  # what the cache keeps: a library or prebuilt emulator used in the last two weeks
SCALARS = {np.int32: ctypes.c_int32, np.int64: ctypes.c_int64, np.float32: ctypes.c_float, np.uint64: ctypes.c_uint64}


class EmulatedKernelError(RuntimeError):
    pass


def _operands(text: str) -> list[str]:
    """The C expressions of an asm operand list: `"=f"(f), "h"(v.bits)` -> ["f", "v.bits"]."""
    out, i = [], 0
    while (m := re.compile(r'"=?\w"\s*\(').search(text, i)):
        depth, j = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            j += 1
        out.append(text[m.end():j - 1].strip())
        i = j
    return out


ALIGN = r"(?:__align__\((\d+)\)\s+)?"  # `__shared__ __align__(16) float s[8];`: as declared, else its type's
DYNAMIC = re.compile(rf"extern\s+{ALIGN}__shared__\s+{ALIGN}(\w+)\s+(\w+)\s*\[\s*\]\s*;")


def dynamic_alignment(source: str) -> str:
    """The C++ expression of the largest alignment among the extern __shared__ declarations (CUDA starts
    them all at one address, aligned for each of them)."""
    aligns = [m[1] or m[2] or f"alignof({m[3]})" for m in DYNAMIC.finditer(source)]
    return "std::max<size_t>({" + ", ".join(["1", *aligns]) + "})"


def rewrite(source: str) -> str:
    """CUDA text the host compiler takes: each inline PTX statement becomes a call of its emulation
    (emu::ptx_cvt_rn_bf16_f32 for `cvt.rn.bf16.f32`), `__shared__` arrays are refilled with NaN bytes
    at each block's start and aligned as declared (`__align__(16)`, or their type's) and no more,
    `extern __shared__` ones all start at the launch's dynamic shared memory, and every reinterpret_cast
    (the vector accesses) checks its alignment. An asm statement or a `__shared__` declaration of
    another form is refused, not skipped."""
    def asm(m: re.Match) -> str:
        parts = re.fullmatch(r'\s*"([^"]*)"\s*:(.*?):(.*)', m.group(1), re.S)
        if not parts or not parts.group(1).startswith("cvt."):
            raise EmulatedKernelError(f"inline PTX the emulator does not know: asm({m.group(1)})")
        op = "ptx_" + parts.group(1).split()[0].replace(".", "_")
        (out,), ins = _operands(parts.group(2)), _operands(parts.group(3))
        return f"{out} = emu::{op}({', '.join(ins)});"
    source = re.sub(r"\basm\((.*?)\);", asm, source, flags=re.S)
    source = re.sub(DYNAMIC, r"EMU_DYNAMIC_SHARED(\3, \4);", source)
    source = source.replace("reinterpret_cast<", "emu::aligned_cast<")  # vector accesses: alignment checked
    source = re.sub(rf"{ALIGN}__shared__\s+{ALIGN}(\w+)\s+(\w+)\s*((?:\[[^\]]+\]\s*)+);",
                    lambda m: f"EMU_SHARED({m[3]}, {m[4]}, {m[5]}, {m[1] or m[2] or f'alignof({m[3]})'});", source)
    if (left := re.search(r".*__shared__.*", re.sub(r"//.*", "", source))):
        raise EmulatedKernelError(f"a __shared__ declaration the emulator does not know: {left.group(0).strip()}")
    return source


def translation_unit(source: str, expression: str, header: Path = HEADER) -> str:
    return (f'#include "{header}"\n{rewrite(source)}\n'
            'extern "C" __attribute__((visibility("default"))) int emu_launch(const unsigned* grid, '
            'const unsigned* block, unsigned long long shared, void** args, const int* sizes, int nargs, '
            'unsigned long long seed, char* error, int error_len) {\n'
            f'  const std::string e = emu::launch(&{expression}, grid, block, shared, args, sizes, nargs, seed, '
            f'{dynamic_alignment(source)});\n'
            '  snprintf(error, error_len, "%s", e.c_str());\n  return e.empty() ? 0 : 1;\n}\n')


# with races=True: every load and store calls the header's __tsan_* hooks, which check shared memory
# for races; compiled, then linked apart, so that no TSan runtime comes with it
RACE_FLAGS = ("-fsanitize=thread", "-DEMU_RACES")


@functools.cache
def library(source: str, expression: str, races: bool = False, extra: tuple[str, ...] = ()) -> ctypes.CDLL:
    """`expression` of CUDA `source` compiled into a shared library (kept in CACHE by the hash of its text);
    `extra`: more compiler flags (-DEMU_UCONTEXT: fibers switched by glibc's swapcontext)."""
    if CXX is None:
        raise EmulatedKernelError("no C++ compiler (g++) on PATH")
    unit = translation_unit(source, expression)
    flags = FLAGS + (RACE_FLAGS if races else ()) + extra
    headers = emulator_headers()
    key = hashlib.sha256("\n".join([unit, *headers, *flags, _compiler()]).encode()).hexdigest()[:24]
    so = _cache() / f"{key}.so"
    for attempt in range(2):
        if not _touch(so):
            _build(so, source, expression, flags, headers)
        try:
            lib = ctypes.CDLL(str(so))
            break
        except OSError:
            if so.exists() or attempt:
                raise
            # another test process pruned it between the two lines above: build it again
    lib.emu_launch.restype = ctypes.c_int
    return lib


def _build(so: Path, source: str, expression: str, flags: tuple[str, ...], headers: tuple[str, ...]) -> None:
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        src, obj, out = Path(tmp) / "unit.cpp", Path(tmp) / "unit.o", Path(tmp) / "unit.so"
        for _ in range(2):
            prebuilt = _prebuilt(flags, headers)
            src.write_text(translation_unit(source, expression, prebuilt / "emulator.h"))
            done = subprocess.run([CXX, *flags, "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
            if not done.returncode:
                done = subprocess.run([CXX, "-shared", str(obj), str(prebuilt / "runtime.o"), "-o", str(out)],
                                      capture_output=True, text=True)
            if not done.returncode or prebuilt.exists():
                break
            # another test process pruned the prebuilt emulator meanwhile: build it again
        if done.returncode:
            raise EmulatedKernelError(f"{expression} does not compile for the emulator:\n{done.stderr[-4000:]}")
        os.replace(out, so)  # atomic: parallel test workers may compile the same instantiation


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
PAGE = os.sysconf("SC_PAGE_SIZE")
PROT_NONE, PROT_RW, MAP_PRIVATE_ANONYMOUS = 0, 3, 0x22


def _prebuilt(flags: tuple[str, ...], headers: tuple[str, ...]) -> Path:
    """A folder (in CACHE) with what every unit compiled with `flags` shares, built once:
    - runtime.o: the emulator's runtime (gpu_emulator.h under EMU_RUNTIME), linked into every library;
    - emulator.h, which includes HEADER, beside its GCC precompiled form (.gch), which a unit starts from.
    A unit then compiles its kernel alone, not the scheduler, barriers and race checks with it (measured on a
    trivial kernel: ~0.9 s a unit before either, ~0.2 s with both). GCC reads the header itself where a unit's
    flags differ from the .gch's, so a refused one costs time, never a result. Looked up for every unit, not
    once a process: another test process may prune it in between."""
    key = hashlib.sha256("\n".join([str(HEADER), *headers, *flags, _compiler()]).encode()).hexdigest()[:24]
    folder = _cache() / f"emulator-{key}"
    if _touch(folder):
        return folder
    tmp = Path(tempfile.mkdtemp(dir=CACHE))
    try:
        stub, runtime = tmp / "emulator.h", tmp / "runtime.cpp"
        stub.write_text(f'#include "{HEADER}"\n')
        runtime.write_text(f'#define EMU_RUNTIME\n#include "{HEADER}"\n')
        for what, args in (("runtime", ["-c", str(runtime), "-o", str(tmp / "runtime.o")]),
                           ("header", ["-x", "c++-header", str(stub), "-o", f"{stub}.gch"])):
            done = subprocess.run([CXX, *flags, *args], capture_output=True, text=True)
            if done.returncode:
                raise EmulatedKernelError(f"the emulator's {what} does not compile:\n{done.stderr[-4000:]}")
        with contextlib.suppress(OSError):  # another test worker renamed its own first: the same bytes
            os.rename(tmp, folder)
        return folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def emulator_headers() -> tuple[str, ...]:
    """The texts of the emulator's headers: part of every cache key (read at each lookup: edited, they
    key new entries)."""
    return tuple(h.read_text() for h in sorted(HEADER.parent.glob("gpu_emulator*.h")))


@functools.cache
def _compiler() -> str:
    return subprocess.run([CXX, "--version"], capture_output=True, text=True).stdout.splitlines()[0]


@functools.cache
def _cache() -> Path:
    """CACHE, this user's alone (the libraries in it are loaded into the test process), less what went unused."""
    CACHE.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = CACHE.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise EmulatedKernelError(f"{CACHE} is not this user's alone: set GPU_EMULATOR_CACHE to a private folder")
    prune(CACHE, time.time() - UNUSED_FOR_S)
    return CACHE


def _touch(entry: Path) -> bool:
    """Whether `entry` is in the cache; if so, marked as used now (what prune goes by)."""
    try:
        os.utime(entry)
        return True
    except FileNotFoundError:
        return False


def prune(folder: Path, unused_since: float) -> None:
    """Removes the libraries and prebuilt emulators not used since `unused_since` (a time.time()): each
    change to a kernel adds its instantiations (~170 of ~50 KB), each change to the emulator's headers all
    of them and a ~35 MB prebuilt emulator per set of flags, and nothing else ever removed them. A
    library another process still has loaded stays mapped there; one unused for days is not about to be
    compiled against or loaded at the instant it goes, and if it were, library() builds it again."""
    for entry in folder.iterdir():
        # pch-: precompiled headers as c675ef0 kept them; tmp: a killed build's folder
        if not (entry.name.endswith(".so") or entry.name.startswith(("emulator-", "pch-", "tmp"))):
            continue
        with contextlib.suppress(OSError):  # another test worker pruned it first
            if entry.stat().st_mtime < unused_since:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


@dataclasses.dataclass
class _Staged:
    """A tensor argument's bytes in a mapping of their own, between pages no thread may touch, ending
    (to within the 16 bytes of its alignment) at the second: a read or write past the end faults, even
    one whose value is never used (a row loaded ahead past the last). Before the bytes (GUARD of them
    and more) and in the few after, guard bytes of the argument's own tag."""
    tensor: torch.Tensor
    index: int
    base: int
    size: int
    start: int
    nbytes: int

    @classmethod
    def of(cls, t: torch.Tensor, index: int) -> "_Staged":
        if not t.is_contiguous():
            raise EmulatedKernelError(f"a non-contiguous tensor {tuple(t.shape)} passed to a kernel")
        nbytes = t.numel() * t.element_size()
        size = -(-(GUARD + nbytes + 16) // PAGE) * PAGE + 2 * PAGE
        mapped = _libc.mmap(None, size, PROT_RW, MAP_PRIVATE_ANONYMOUS, -1, 0)
        if mapped in (None, ctypes.c_void_p(-1).value):
            raise MemoryError(f"mmap of {size} bytes: errno {ctypes.get_errno()}")
        base, end = mapped + PAGE, mapped + size - PAGE
        start = end - nbytes
        start -= (start - t.data_ptr()) % 16  # the alignment the wrappers chose vector widths by
        ctypes.memmove(base, _guard(base, end - base, index), end - base)
        ctypes.memmove(start, t.data_ptr(), nbytes)
        _libc.mprotect(mapped, PAGE, PROT_NONE)
        _libc.mprotect(end, PAGE, PROT_NONE)
        return cls(t, index, mapped, size, start, nbytes)

    def owns(self, address: int) -> bool:
        return self.base <= address < self.base + self.size

    def check(self, expression: str) -> None:
        """Raises if the kernel wrote a guard byte."""
        base, end = self.base + PAGE, self.base + self.size - PAGE
        want, now = _guard(base, end - base, self.index), ctypes.string_at(base, end - base)
        head, tail = self.start - base, self.start - base + self.nbytes
        if now[:head] != want[:head] or now[tail:] != want[tail:]:
            raise EmulatedKernelError(f"{expression} wrote outside argument {self.index} ({tuple(self.tensor.shape)} "
                                      f"{self.tensor.dtype})")

    def copy_back(self) -> None:
        ctypes.memmove(self.tensor.data_ptr(), self.start, self.nbytes)

    def release(self) -> None:
        _libc.munmap(self.base, self.size)


def _guard(address: int, size: int, index: int) -> bytes:
    """Guard bytes: a tag at even addresses, 0xff at odd ones, so that every aligned bf16, fp16 or fp32
    element read from them is a NaN (0xfftt, 0xffttfftt), and a value copied from another argument's
    guard (another tag) is a change."""
    tag = 0x81 + index % 0x7D  # its low 7 bits not zero (a NaN, not an infinity), its top bit set (fp32)
    pair = bytes([tag, 0xFF]) if address % 2 == 0 else bytes([0xFF, tag])
    return (pair * (size // 2 + 1))[:size]


class Emulator:
    """runtime.launch's stand-in. `seed` orders the fibers (threads) each scheduling round."""

    def __init__(self, seed: int = 0, races: bool = False, extra: tuple[str, ...] = ()):
        self.seed, self.races, self.extra = seed, races, extra
        self.launches: list[tuple[str, tuple, tuple]] = []

    def launch(self, file, expression, grid, block, args, shared_mem=0, max_regs=0) -> None:
        """runtime.launch's signature: a kernel of kernels/cuda/ (`max_regs` changes nothing here)."""
        self.run(runtime.source(file), expression, grid, block, args, shared_mem)

    def run(self, source: str, expression: str, grid, block, args, shared_mem: int = 0) -> None:
        lib = library(source, expression, self.races, self.extra)
        staged, values = [], []
        try:
            for a in args:
                if isinstance(a, torch.Tensor):
                    staged.append(_Staged.of(a, len(values)))
                    values.append(ctypes.c_uint64(staged[-1].start))
                elif type(a) in SCALARS:
                    values.append(SCALARS[type(a)](a.item()))
                else:
                    raise TypeError(f"kernel argument {a!r} must be a tensor or a runtime.i32/i64/f32 scalar")
            argv = (ctypes.c_void_p * len(values))(*(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values))
            sizes = (ctypes.c_int * len(values))(*(ctypes.sizeof(v) for v in values))
            grid3, block3 = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
            error = ctypes.create_string_buffer(512)
            rc = lib.emu_launch((ctypes.c_uint * 3)(*grid3), (ctypes.c_uint * 3)(*block3),
                                ctypes.c_ulonglong(shared_mem), argv, sizes, len(values), ctypes.c_ulonglong(self.seed),
                                error, len(error))
            if rc:
                why = error.value.decode()
                if (m := re.match(r"fault at address (0x[0-9a-f]+)", why)):
                    address = int(m.group(1), 16)
                    for s in staged:
                        if s.owns(address):
                            side = "past the end" if address >= s.start else "before the start"
                            why += f": {side} of argument {s.index} ({tuple(s.tensor.shape)} {s.tensor.dtype})"
                raise EmulatedKernelError(f"{expression} grid {grid3} block {block3}: {why}")
            for s in staged:  # every guard checked before any tensor changes
                s.check(expression)
            for s in staged:
                s.copy_back()
        finally:
            for s in staged:
                s.release()
        self.launches.append((expression, grid3, block3))


@dataclasses.dataclass(frozen=True)
class _Compiled:  # what runtime.resident reads of a compiled kernel
    num_regs: int
    max_threads_per_block: int = 1024


@contextlib.contextmanager
def emulated(monkeypatch, multiprocessors: int = 2, registers: int = 128, seed: int = 0, races: bool = False):
    """The fused wrappers on CPU tensors, launching the emulator: a GPU of `multiprocessors`, every
    kernel compiled to `registers` per thread (small grids, so blocks and warps stride over rows);
    `races`: shared memory checked for races (slower)."""
    emu = Emulator(seed, races)
    # torch.empty then fills with NaN, as a GPU's uninitialised memory would hold garbage: an element a
    # kernel failed to write shows, where CPU memory would often hold zeros or the right stale value
    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    monkeypatch.setattr(runtime, "launch", emu.launch)
    monkeypatch.setattr(runtime, "fused_available", lambda: True)  # runtime.supports then takes CPU tensors
    monkeypatch.setattr(runtime, "on_device", lambda t: t.device.type == "cpu")
    monkeypatch.setattr(runtime, "multiprocessors", lambda device: multiprocessors)
    monkeypatch.setattr(runtime, "_function", lambda *a, **k: _Compiled(registers))
    monkeypatch.setattr(runtime, "_shared_per_sm", lambda device: 228 * 1024)
    runtime.row_layout.cache_clear()
    try:
        yield emu
    finally:
        runtime.row_layout.cache_clear()
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
