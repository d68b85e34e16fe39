"""CuPy side of the fused kernels: compile the CUDA sources on first use, hand torch tensors to them
zero-copy through DLPack, and launch on torch's current CUDA stream.

Each (kernel, dtype, vector width, row layout) instantiation is its own small RawModule, compiled
lazily by NVRTC and kept in CuPy's on-disk cache, so a process compiles only what it launches."""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

SOURCE_DIR = Path(__file__).parent / "cuda"
SOURCES = ("bias_gelu.cu", "layer_norm.cu", "partial_sums.cu", "causal_softmax.cu", "cross_entropy.cu", "minhash.cu")
CUDA_TYPE = {torch.float32: "float", torch.bfloat16: "bf16", torch.float16: "fp16"}
NVRTC_OPTIONS = ("-std=c++17",)


def source(name: str) -> str:
    """The compilable text of one kernel file: the shared header, then the file."""
    return (SOURCE_DIR / "common.cuh").read_text() + "\n" + (SOURCE_DIR / name).read_text()


def fused_available() -> bool:
    """True when a CUDA device and CuPy are both usable; the torch reference paths are used otherwise."""
    return why_unavailable() is None


@functools.cache
def why_unavailable() -> str | None:
    """Why the fused kernels cannot run here, in a few words; None when they can."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import cupy
    except ImportError as e:
        return f"CuPy is not importable: {e}"
    if not cupy.is_available():  # e.g. a cupy-cuda13x wheel under a driver older than CUDA 13
        return "CuPy finds no usable CUDA device (its CUDA version may need a newer driver)"
    return None


def supports(*tensors: torch.Tensor) -> bool:
    """The fused path takes contiguous CUDA tensors of one of the three float types, all the same (an
    optional tensor left out, e.g. LayerNorm's bias=None, is the reference path's)."""
    first = tensors[0]
    return (all(t is not None for t in tensors) and fused_available() and first.dtype in CUDA_TYPE
            and first.numel() > 0 and all(on_device(t) and t.dtype == first.dtype and t.is_contiguous() for t in tensors))


def on_device(t: torch.Tensor) -> bool:
    """Whether a tensor is where the kernels run: a CUDA device (tests/gpu_emulator.py makes it the CPU)."""
    return t.is_cuda


@functools.cache
def _function(file: str, expression: str, device: int = 0, max_regs: int = 0):
    """The compiled kernel (a cupy.RawKernel), once per process and device; `max_regs`: NVRTC's
    register cap per thread (0: none), for launch-shape variants that trade registers for blocks."""
    import cupy
    options = NVRTC_OPTIONS + ((f"--maxrregcount={max_regs}",) if max_regs else ())
    with cupy.cuda.Device(device):
        module = cupy.RawModule(code=source(file), options=options, name_expressions=[expression])
        kernel = module.get_function(expression)
        kernel.kernel  # load it onto the device now, not inside the first (possibly captured) launch
    return kernel


@functools.cache
def _stream(pointer: int, device: int):
    import cupy
    import warnings
    with warnings.catch_warnings():  # Stream.from_external wants a __cuda_stream__ object; a pointer is what we have
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(pointer, device)


def _arg(value):
    """A tensor travels as its device pointer: zero-copy, like a DLPack view, but ~10x cheaper per call
    (cupy.from_dlpack costs microseconds per tensor, and a training step launches hundreds of kernels).
    Scalars must arrive as numpy scalars of the C parameter's exact type (i32/i64/f32 below): CuPy
    packs a Python int as 8 bytes and a float as a double, which shifts every later parameter."""
    if isinstance(value, torch.Tensor):
        return np.uint64(value.data_ptr())
    if isinstance(value, (int, float)):
        raise TypeError(f"kernel scalar {value!r} must be typed with runtime.i32/i64/f32")
    return value


def i32(v) -> np.int32:
    return np.int32(v)


def i64(v) -> np.int64:
    return np.int64(v)


def f32(v) -> np.float32:
    return np.float32(v)


def launch(file: str, expression: str, grid, block, args, shared_mem: int = 0, max_regs: int = 0) -> None:
    """Run one kernel on torch's current stream of the first tensor argument's device (CuPy loads a
    kernel for the current CUDA device, so a tensor on another GPU switches to it for the launch)."""
    import cupy
    device = next(a.device for a in args if isinstance(a, torch.Tensor)).index
    # the current stream's pointer, as inductor's launches read it: torch.cuda.current_stream built a
    # Stream object for it, ~7 us of the ~35 us a launch took on the host (H200)
    stream = _stream(torch._C._cuda_getCurrentRawStream(device), device)
    call = (tuple(grid), tuple(block), tuple(_arg(a) for a in args), shared_mem, stream)
    if cupy.cuda.runtime.getDevice() == device:
        _function(file, expression, device, max_regs).kernel(*call)
    else:
        with cupy.cuda.Device(device):
            _function(file, expression, device, max_regs).kernel(*call)


def as_cupy(t: torch.Tensor):
    """A CuPy view of a tensor through DLPack (16-bit floats as int16: CuPy has no bf16), for
    interoperating with CuPy code; the launches above pass raw pointers instead."""
    import cupy
    return cupy.from_dlpack((t.view(torch.int16) if t.dtype in (torch.bfloat16, torch.float16) else t).detach())


def aligned(t: torch.Tensor) -> torch.Tensor:
    """Contiguous and 16-byte aligned (a gradient can arrive as an offset view), copying only if not."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def vector_width(cols: int, *tensors: torch.Tensor) -> int:
    """16-byte accesses when every row starts 16-byte aligned; single elements otherwise (odd sizes)."""
    size = tensors[0].element_size()
    vec = 16 // size
    aligned = all(t.data_ptr() % 16 == 0 for t in tensors)
    return vec if aligned and cols % vec == 0 else 1


@dataclass(frozen=True)
class RowLayout:
    """How a row of `cols` elements sits in registers: `slots` vectors per thread, one warp per row
    (`warp`, several rows per block) or one block of `threads` per row. `per_sm`: blocks resident per
    multiprocessor (from the compiled kernel's registers); launches are one such wave, grid-striding.
    `stream` (the LayerNorm forward): its variant that reads the affine parameters from cache for
    every row instead of holding them in registers, and keeps the next row's loads in flight; (the
    LayerNorm backward, one row per iteration) its variant that keeps the next row's x and dy loads
    in flight through this row's reductions.
    `rows` (the LayerNorm backward, block layout): rows per iteration; `shared_acc` (the LayerNorm
    backward): its dgamma/dbeta accumulators in shared memory rather than registers (with `warp`,
    gamma read from cache too). `max_regs`: a register cap for the compiler (0: none), which buys
    resident blocks. `balance`: rows beyond one wave are spread evenly over the fewest rounds that hold
    them, in fewer blocks than fit, rather than a last round with a fraction of the warps at work
    (16384 rows for 3168 warps: 2732 warps of 6 rows each, not 5 full rounds and 544 warps in a sixth)."""
    vec: int
    slots: int
    warp: bool
    threads: int
    per_sm: int = 1
    stream: bool = False
    rows: int = 1
    shared_acc: bool = False
    max_regs: int = 0
    balance: bool = False

    def grid(self, rows: int, multiprocessors: int) -> int:
        per_block = (self.threads // 32 if self.warp else 1) * self.rows
        blocks, resident = math.ceil(rows / per_block), multiprocessors * self.per_sm
        if self.balance and blocks > resident:  # each block then takes the same number of row groups, or one less
            return math.ceil(blocks / math.ceil(blocks / resident))
        return max(1, min(blocks, resident))


@functools.cache
def row_layout(file: str, kernel: str, dtype: torch.dtype, cols: int, vec: int, max_slots: int, device: int = 0,
               max_threads: int = 256, warp_slots: int = 1, long_warp: str = "stream",
               long_warp_regs: int = 0) -> RowLayout | None:
    """Rows of at most 32 vectors: a warp each, 8 warps per block (shuffle-only reductions). Up to
    32 * `warp_slots` vectors: a warp each still, that many slots per lane, 4 warps per block, in
    the variant `long_warp` names (a row's registers leave no room for the rest): "stream", the
    forward's, which reads the affine parameters from cache and keeps the next row's loads in
    flight, or "shared_acc", the LayerNorm backward's, with its accumulators in shared memory;
    `long_warp_regs`: a register cap for it (0: none). Longer rows: a block each, of at most
    `max_threads` threads while more slots per thread are allowed (more independent loads per
    thread, more blocks per multiprocessor), up to 1024 at `max_slots`. None when a row does not
    fit in registers (the reference path is used)."""
    if warp_slots not in (1, 2, 4):  # the long-row warp layouts every_instantiation lists for the nvcc check
        raise ValueError(f"warp_slots must be 1, 2 or 4, not {warp_slots}")
    if long_warp not in ("stream", "shared_acc"):
        raise ValueError(f"long_warp must be 'stream' or 'shared_acc', not {long_warp!r}")
    nvec = cols // vec
    if nvec <= 32:
        lay = RowLayout(vec, 1, True, 256)
    elif nvec <= 32 * warp_slots:
        lay = RowLayout(vec, 2 if nvec <= 64 else 4, True, 128, max_regs=long_warp_regs, **{long_warp: True})
    else:
        for slots in (1, 2, 4, 8):
            if slots > max_slots:
                return None
            threads = block_threads(nvec, slots)
            if threads <= max_threads or (slots == max_slots and threads <= 1024):
                break
        lay = RowLayout(vec, slots, False, threads)
    return resident(file, kernel, dtype, lay, device)


def block_threads(nvec: int, slots: int) -> int:
    """Threads of a block holding a row of `nvec` vectors, `slots` per thread: whole warps."""
    return 32 * math.ceil(math.ceil(nvec / slots) / 32)


def resident(file: str, kernel: str, dtype: torch.dtype, lay: RowLayout, device: int = 0) -> RowLayout | None:
    """The layout with `per_sm` set from the compiled kernel's registers (and shared accumulators);
    None when its block is larger than the compiled kernel can launch."""
    compiled = _function(file, expression(kernel, dtype, lay), device, lay.max_regs)
    if lay.threads > compiled.max_threads_per_block:
        return None
    per_sm = max(1, min(2048 // lay.threads, 65536 // max(1, compiled.num_regs * lay.threads)))
    if lay.shared_acc:  # the CUDA runtime reserves 1 KB of shared memory per block
        per_sm = max(1, min(per_sm, _shared_per_sm(device) // (backward_shared_bytes(lay, 0) + 1024)))
    return dataclasses.replace(lay, per_sm=per_sm)


def backward_shared_bytes(lay: RowLayout, cols: int) -> int:
    """The LayerNorm backward's dynamic shared memory: its accumulators with `shared_acc`, else, a
    warp per row, the block's dgamma and dbeta rows it folds its warps into."""
    return 4 * (2 * lay.slots * lay.vec * lay.threads if lay.shared_acc else 2 * cols if lay.warp else 0)


@functools.cache
def _shared_per_sm(device: int) -> int:
    import cupy
    return cupy.cuda.runtime.deviceGetAttribute(81, device)  # cudaDevAttrMaxSharedMemoryPerMultiprocessor


# spelt for every launch; typed: an argument True is not 1 (a RowLayout's fields are not told apart so:
# they are built as bools)
@functools.lru_cache(maxsize=None, typed=True)
def expression(kernel: str, dtype: torch.dtype, layout: RowLayout | int, *more: int | bool) -> str:
    """The template instantiation for a kernel, as NVRTC and nvcc both spell it: a row layout, or a
    vector width and any further parameters (ints, or bools spelled true/false)."""
    if isinstance(layout, RowLayout):  # the variants' parameters only where set (defaults elsewhere)
        if kernel == "layer_norm_bwd":  # ROWS, SHARED_ACC, PREFETCH
            if layout.stream and layout.rows > 1:
                raise ValueError("the LayerNorm backward prefetches one row, not several: stream with rows > 1")
            more = ([layout.rows, layout.shared_acc, True] if layout.stream else
                    [layout.rows, layout.shared_acc] if layout.rows > 1 or layout.shared_acc else [])
        else:  # a forward's STREAM (the LayerNorm's)
            if layout.rows > 1 or layout.shared_acc:
                raise ValueError(f"rows and shared_acc are the LayerNorm backward's, not {kernel}'s")
            more = [True] if layout.stream else []
        return expression(kernel, dtype, layout.vec, layout.slots, layout.warp, *more)
    return f"{kernel}<{', '.join([CUDA_TYPE[dtype], *(str(v).lower() for v in (layout, *more))])}>"


@functools.cache
def _properties(index: int):
    """A CUDA device's properties, looked up once: the launches ask for them on every call."""
    return torch.cuda.get_device_properties(index)


def _of(device: torch.device):
    return _properties(device.index if device.index is not None else torch.cuda.current_device())


def multiprocessors(device: torch.device) -> int:
    return _of(device).multi_processor_count


def capability(device: torch.device) -> tuple[int, int]:
    properties = _of(device)
    return properties.major, properties.minor


# (warp per row, slots, rows, shared accumulators, next row in flight) of the LayerNorm backward
# variants benchmarks/kernel_sweep.py measures beside the wrappers' choice (compiled by the nvcc check
# like the layouts the wrappers pick)
BACKWARD_VARIANTS = ((False, 1, 2, False, False), (False, 1, 2, True, False), (False, 1, 1, True, False),
                     (False, 2, 2, True, False), (True, 2, 1, True, False), (True, 4, 1, True, False),
                     (False, 1, 1, False, True), (False, 1, 1, True, True), (True, 4, 1, True, True))


def every_instantiation() -> dict[str, list[str]]:
    """Each source file and the instantiations the wrappers can ask of it, and the LayerNorm backward
    variants of the launch-shape sweep (used by the nvcc check)."""
    from kernels.bias_gelu import BACKWARD_TILINGS  # bias_gelu and cross_entropy import this module
    from kernels.cross_entropy import SCALE_DTYPES, scale_expression
    out: dict[str, list[str]] = {}
    for dtype in CUDA_TYPE:
        full = 16 // torch.tensor([], dtype=dtype).element_size()
        for vec in sorted({full, 1}):
            out.setdefault("bias_gelu.cu", []).append(expression("bias_gelu_fwd", dtype, vec))
            out["bias_gelu.cu"] += [t.expression(dtype, vec) for t in BACKWARD_TILINGS]
            out.setdefault("cross_entropy.cu", []).extend(
                expression(k, dtype, vec) for k in ("xent_stats", "xent_grad"))
            layouts = [RowLayout(vec, 1, True, 256)] + [RowLayout(vec, s, False, 0) for s in (1, 2, 4, 8)]
            for lay in layouts:
                for k in ("layer_norm", "causal_softmax"):
                    out.setdefault(f"{k}.cu", []).append(expression(f"{k}_fwd", dtype, lay))
                    if lay.slots <= 4:
                        out[f"{k}.cu"].append(expression(f"{k}_bwd", dtype, lay))
            out["layer_norm.cu"] += [expression("layer_norm_fwd", dtype, RowLayout(vec, s, True, 128, stream=stream))
                                     for s in (2, 4) for stream in (True, False)]  # warp_slots=4; unstreamed: the sweep's
            out["layer_norm.cu"] += [expression("layer_norm_bwd", dtype, RowLayout(vec, s, w, 0, rows=r, shared_acc=a,
                                                                                   stream=p))
                                     for w, s, r, a, p in BACKWARD_VARIANTS]
    out["cross_entropy.cu"] += [scale_expression(held, dtype, vec) for held, dtype in SCALE_DTYPES
                                for vec in sorted({16 // torch.tensor([], dtype=held).element_size(), 1})]
    from kernels import partial_sums
    out["partial_sums.cu"] = [partial_sums.expression(dtype) for dtype in CUDA_TYPE]
    out["minhash.cu"] = ["minhash_signatures"]  # dedup's signatures (tasks/dedup/gpu.py): integers only
    return out
