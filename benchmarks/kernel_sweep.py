"""Launch-shape sweep of the fused kernels, for choosing their defaults on a GPU.

    python -m benchmarks.kernel_sweep [--reps 20] [--json sweep.json] [--compile layer_norm ...]

At the sizes of `benchmarks.kernels` (the ~350M model at 8 x 2048 tokens, bf16), each kernel runs
under several launch shapes: row layouts (a warp or a block per row, vectors per thread, block size,
blocks per multiprocessor, LayerNorm's streamed forward, its backward's rows per iteration, shared
memory accumulators and register caps) for LayerNorm and the causal softmax; rows in flight, row
chunks and their order for the bias + GeLU backward; and the partial-sum kernel both backwards end
with, alone at each one's shape, against torch's sum and cast. Each shape is first checked against the
float64 reference (relative error of the output and of every gradient; bf16 passes at <= 1e-2), then timed as
`benchmarks.kernels` times (median of CUDA-event-timed repeats with the launches queued behind a GPU
spin), with torch eager timed in the same run. The row marked `now` is the wrappers' current
default. A shape that fails to compile or launch is reported, not fatal.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

import kernels
from benchmarks.kernels import compiled_for_replay, direction_fns, peak_bandwidth, timed
from kernels import reference, runtime
from kernels.bias_gelu import BACKWARD, FusedBiasGelu, Tiling
from kernels.causal_softmax import FusedCausalSoftmax
from kernels.causal_softmax import layouts as softmax_layouts
from kernels.layer_norm import FusedLayerNorm
from kernels.layer_norm import layouts as layer_norm_layouts

UNCAPPED = 1 << 20  # blocks per multiprocessor: no cap, one grid-stride step (rows / rows per block)


# The bias-GeLU backward's tilings and the LayerNorm forward's shapes the sweep times beside the default
# (compiled by the nvcc check: kernels.bias_gelu.BACKWARD_TILINGS, runtime.every_instantiation). The
# forward's uncapped shapes give each warp one row, no grid-stride loop (blocks dealt out as others
# finish), where the default's single wave left 16384 rows to 2640 warps on the H100 (94 registers:
# 5 blocks of 4 warps per multiprocessor), 6 or 7 rows each: in the last row's time 544 warps work.
# Its next row now waits as loaded, not as floats (79 registers on sm_90: 6 blocks, 3168 warps); the
# shapes capped at 5 blocks (the earlier occupancy) and at 72 registers (71, no spill: 7 blocks), and
# the rows balanced over the rounds (RowLayout.balance: 683 blocks of 6 rows a warp, no sixth round of 544).
GELU_BWD = [BACKWARD, Tiling(threads_per_sm=512), Tiling(threads_per_sm=2048), Tiling(rows=2),
            Tiling(threads=256), Tiling(interleaved=False), Tiling(prefetch=True)]
LN_FWD = [("block", 1, 128, None, {}), ("warp", 4, 128, None, {"stream": True}),
          ("warp", 4, 256, None, {"stream": True}), ("warp", 4, 128, None, {}),
          ("warp", 4, 128, UNCAPPED, {}), ("warp", 4, 128, UNCAPPED, {"stream": True}),
          ("warp", 4, 128, 5, {"stream": True}), ("warp", 4, 128, None, {"stream": True, "max_regs": 72}),
          ("warp", 4, 128, None, {"stream": True, "balance": True})]

# The LayerNorm backward's shapes beside the default, as (kind, slots, threads, blocks per SM cap,
# RowLayout's variant fields): fewer threads with more slots, a cap on resident blocks, two rows per
# iteration, dgamma/dbeta accumulated in shared memory, register caps that buy resident blocks, and
# a warp per row with its accumulators in shared memory (no block barrier; on sm_90, 104 registers
# uncapped: 4 blocks of 128 per multiprocessor, 16 rows in flight against the default's 8), and
# `stream`: the next row's x and dy loaded before this row's two block reductions and held as loaded
# through them (sm_90: 72 registers, 7 blocks of 128; capped at 64, 8 blocks with 4-8 bytes spilled;
# a warp per row, 168: 3 blocks of 128, 12 rows worked on and 12 more loading); and the rows balanced
# over the blocks (1024 blocks of 16 rows, not 1056 of 15 or 16; streamed, 911 of 17 or 18).
# Each (warp, slots, rows, shared_acc, stream) is in runtime.BACKWARD_VARIANTS, which the nvcc check compiles.
LN_BWD = [("block", 1, 128, None, {}), ("block", 2, 64, None, {}), ("block", 1, 128, 4, {}),
          ("block", 1, 128, None, {"rows": 2}), ("block", 1, 128, None, {"rows": 2, "shared_acc": True}),
          ("block", 1, 128, None, {"shared_acc": True, "max_regs": 48}),
          ("block", 1, 128, None, {"shared_acc": True, "max_regs": 40}),
          ("block", 1, 128, None, {"rows": 2, "shared_acc": True, "max_regs": 64}),
          ("block", 2, 64, None, {"rows": 2, "shared_acc": True, "max_regs": 128}),
          ("warp", 4, 128, None, {"shared_acc": True}),
          ("warp", 4, 128, None, {"shared_acc": True, "max_regs": 96}),
          ("warp", 4, 64, None, {"shared_acc": True, "max_regs": 96}),
          ("block", 1, 128, None, {"stream": True}), ("block", 1, 128, None, {"stream": True, "max_regs": 64}),
          ("block", 1, 128, None, {"stream": True, "shared_acc": True, "max_regs": 64}),
          ("warp", 4, 128, None, {"stream": True, "shared_acc": True}),
          ("block", 1, 128, None, {"balance": True}), ("block", 1, 128, None, {"stream": True, "balance": True})]


def shape(file: str, kernel: str, dtype, vec: int, slots: int, warp: bool, threads: int, per_sm: int | None = None,
          **variant):
    """A row layout with blocks per multiprocessor from the compiled kernel's registers, or `per_sm`
    when given below that (UNCAPPED: a block per row group); `variant`: RowLayout's other fields."""
    lay = runtime.resident(file, kernel, dtype, runtime.RowLayout(vec, slots, warp, threads, **variant))
    if lay is None:
        raise RuntimeError(f"{threads} threads exceed what {kernel} can launch")
    if per_sm == UNCAPPED or (per_sm is not None and per_sm < lay.per_sm):
        lay = dataclasses.replace(lay, per_sm=per_sm)
    return lay


def describe(lay) -> str:
    if isinstance(lay, Tiling):
        return "rows {rows} t{threads} {threads_per_sm}/SM".format(**dataclasses.asdict(lay)) + (
            " interleaved" if lay.interleaved else "") + (" prefetch" if lay.prefetch else "")
    per = "uncapped" if lay.per_sm == UNCAPPED else f"{lay.per_sm}/SM"
    return f"{'warp' if lay.warp else 'block'} s{lay.slots} t{lay.threads} {per}" + (" stream" if lay.stream else "") + (
        f" r{lay.rows}" if lay.rows > 1 else "") + (" smem-acc" if lay.shared_acc else "") + (
        f" regs{lay.max_regs}" if lay.max_regs else "") + (" balanced" if lay.balance else "")


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm().clamp(min=1e-12)).item()


def check(fn, ref, inputs, dy) -> float:
    """The largest relative error over the output and every gradient, against float64."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    y = fn(*leaves)
    y.backward(dy)
    leaves64 = [t.detach().double().requires_grad_(True) for t in inputs]
    y64 = ref(*leaves64)
    y64.backward(dy.double())
    errs = [rel_error(y, y64)] + [rel_error(a.grad, b.grad) for a, b in zip(leaves, leaves64)]
    return max(errs)


def cases(dtype):
    """Per kernel: (name, inputs, eager reference, [(direction, launch shape or its label, fused fn or
    the error that building it raised)], the default (forward, backward) shapes, fwd bytes, bwd bytes)."""
    s = torch.tensor([], dtype=dtype).element_size()
    n, h = 8 * 2048, 1024
    x4, b4 = torch.randn(n, 4 * h, device="cuda", dtype=dtype), torch.randn(4 * h, device="cuda", dtype=dtype)
    x, w, b = (torch.randn(*sz, device="cuda", dtype=dtype) for sz in ((n, h), (h,), (h,)))
    batches, sq = 4 * 16, 2048
    scores = torch.randn(batches, sq, sq, device="cuda", dtype=dtype)
    tri = batches * sq * (sq + 1) // 2

    gelu = [("fwd", "grid-stride", FusedBiasGelu.apply)]
    gelu += [("bwd", t, (lambda t: lambda a, c: FusedBiasGelu.apply(a, c, t))(t)) for t in GELU_BWD]

    f, vec = "layer_norm.cu", runtime.vector_width(h, x, w, b)
    ln_now = layer_norm_layouts(x, w, b)
    ln = []
    for direction, kernel, specs in (("fwd", "layer_norm_fwd", LN_FWD), ("bwd", "layer_norm_bwd", LN_BWD)):
        for kind, slots, threads, per_sm, variant in specs:
            ln.append((direction, kernel, vec, slots, kind == "warp", threads, per_sm, variant))

    f2, vec2 = "causal_softmax.cu", runtime.vector_width(sq, scores)
    sm_now = softmax_layouts(scores)
    sm_fwd = [("block", 2, 128, None), ("block", 4, 64, None)]
    sm_bwd = [("block", 1, 256, None)]
    sm = [("fwd", "causal_softmax_fwd", vec2, sl, k == "warp", t, p, {}) for k, sl, t, p in sm_fwd]
    sm += [("bwd", "causal_softmax_bwd", vec2, sl, k == "warp", t, p, {}) for k, sl, t, p in sm_bwd]

    def row_variants(file, now, specs, make):
        out = []
        for direction, kernel, v, slots, warp, threads, per_sm, variant in specs:
            try:
                lay = shape(file, kernel, dtype, v, slots, warp, threads, per_sm, **variant)
            except Exception as e:  # noqa: BLE001 - reported in the table
                out.append((direction, f"{'warp' if warp else 'block'} s{slots} t{threads}", e))
                continue
            if any(d == direction and other == lay for d, other, _ in out):
                continue  # a spec that comes out the same as an earlier one (a cap above the registers' limit)
            fwd, bwd = (lay, now[1]) if direction == "fwd" else (now[0], lay)
            out.append((direction, lay, make(fwd, bwd)))
        return out

    ln_variants = row_variants(f, ln_now, ln, lambda fw, bw: lambda a, g, c: FusedLayerNorm.apply(a, g, c, 1e-5, fw, bw))
    sm_variants = row_variants(f2, sm_now, sm, lambda fw, bw: lambda t: FusedCausalSoftmax.apply(t, 0.125, fw, bw))
    return [
        ("bias_gelu", [x4, b4], reference.bias_gelu, gelu, ("grid-stride", BACKWARD), 2 * x4.numel() * s, 3 * x4.numel() * s),
        ("layer_norm", [x, w, b], lambda *a: reference.layer_norm(*a, eps=1e-5), ln_variants, ln_now,
         2 * x.numel() * s, 3 * x.numel() * s),
        ("causal_softmax", [scores], lambda t: reference.scaled_causal_softmax(t, 0.125), sm_variants, sm_now,
         (tri + scores.numel()) * s, (2 * tri + scores.numel()) * s),
    ]


def sweep(dtype, reps: int, peak: float, compiled: list[str]) -> list[dict]:
    rows = []
    for name, inputs, eager, variants, now, fwd_bytes, bwd_bytes in cases(dtype):
        dy = torch.randn_like(eager(*inputs))
        eager_ms = [timed(fn, reps, queued=True) for fn in direction_fns(eager, inputs, dy)]
        if name in compiled:  # torch.compile of the reference, timed as a variant (what Triton reaches)
            fn = compiled_for_replay(eager)
            variants = [("fwd", "torch.compile", fn), ("bwd", "torch.compile", fn)] + variants
        for direction, lay, fn in variants:
            i = 0 if direction == "fwd" else 1
            row = {"kernel": f"{name}.{direction}", "shape": lay if isinstance(lay, str) else describe(lay),
                   "now": lay == now[i], "eager_ms": eager_ms[i]}
            try:
                if isinstance(fn, Exception):
                    raise fn
                row["error"] = check(fn, eager, inputs, dy)
                row["ms"] = timed(direction_fns(fn, inputs, dy)[i], reps, queued=True)
                row["of_peak"] = (fwd_bytes if i == 0 else bwd_bytes) / row["ms"] / 1e6 / peak
                row["vs_eager"] = eager_ms[i] / row["ms"]
            except Exception as e:  # noqa: BLE001 - one failed shape does not end the sweep
                row["failed"] = failure(e)
            rows.append(row)
            print(line(row), flush=True)
        torch.cuda.empty_cache()
    for name in ("layer_norm", "bias_gelu"):
        try:
            rows.append(partial_sums_row(name, dtype, reps, peak))
        except Exception as e:  # noqa: BLE001 - reported like a failed shape
            rows.append({"kernel": f"{name}.parts", "shape": "partial rows summed", "now": True, "failed": failure(e)})
        print(line(rows[-1]), flush=True)
    return rows


def partial_sums_row(name: str, dtype, reps: int, peak: float) -> dict:
    """A backward's last step alone: its fp32 partial sums ([2, blocks, 1024] of the LayerNorm's
    default layout, [1, row chunks, 4096] of the bias-GeLU's default tiling) added up by
    kernels/partial_sums.py, against torch's sum + cast."""
    from kernels.partial_sums import sum_partials
    n, h = 8 * 2048, 1024
    if name == "layer_norm":
        x, w, b = torch.empty(n, h, device="cuda", dtype=dtype), *(torch.empty(h, device="cuda", dtype=dtype)
                                                                     for _ in range(2))
        shape = (2, layer_norm_layouts(x, w, b)[1].grid(n, runtime.multiprocessors(x.device)), h)
    else:
        vec = 16 // torch.tensor([], dtype=dtype).element_size()
        shape = (1, BACKWARD.geometry(n, 4 * h, vec, runtime.multiprocessors(torch.device("cuda")))[2], 4 * h)
    parts = torch.randn(*shape, device="cuda")
    row = {"kernel": f"{name}.parts", "shape": f"{shape[0]} x sum of {shape[1]} rows", "now": True,
           "eager_ms": timed(lambda: parts.sum(1).to(dtype), reps, queued=True)}
    row["error"] = rel_error(sum_partials(parts, dtype), parts.double().sum(1))
    row["ms"] = timed(lambda: sum_partials(parts, dtype), reps, queued=True)
    row["of_peak"] = (parts.numel() * 4 + shape[0] * shape[2] * torch.empty((), dtype=dtype).element_size()
                      ) / row["ms"] / 1e6 / peak
    row["vs_eager"] = row["eager_ms"] / row["ms"]
    return row


def failure(e: Exception) -> str:
    """A shape's failure as its row says it: the exception's type and first line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:100]


def line(r: dict) -> str:
    head = f"{r['kernel']:<20}{r['shape'] + (' (now)' if r['now'] else ''):<36}"
    if "failed" in r:
        return head + "failed: " + r["failed"]
    return head + f"{r['ms']:>8.4f}{r['of_peak']:>8.2f}{r['vs_eager']:>9.2f}{r['error']:>10.1e}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", help="also write every row to this file")
    ap.add_argument("--compile", nargs="*", default=[], metavar="KERNEL",
                    help="also time torch.compile of these kernels' references (bias_gelu layer_norm causal_softmax)")
    args = ap.parse_args(argv)
    if not kernels.fused_available():
        print("kernel_sweep: no CUDA GPU with CuPy here")
        return 1
    peak = peak_bandwidth(args.reps)
    print(f"device: {torch.cuda.get_device_name()}, peak (device copy) {peak:,.0f} GB/s")
    print(f"{'kernel':<20}{'launch shape':<36}{'ms':>8}{'of peak':>8}{'vs eager':>9}{'rel err':>10}")
    rows = sweep(torch.bfloat16, args.reps, peak, args.compile)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "peak_gb_s": peak, "rows": rows}, fh, indent=1)
    bad = [r for r in rows if r.get("error", 0) > 1e-2]
    for r in bad:
        print(f"WRONG: {r['kernel']} {r['shape']}: relative error {r['error']:.1e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
