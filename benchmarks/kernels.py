"""Fused-kernel benchmark.

    python -m benchmarks.kernels [--compile-only] [--no-compile] [--skip-step] [--reps 50]

On a GPU, per kernel and direction: achieved memory bandwidth (the fewest bytes the op must move:
each input read once, each output written once; the causal softmax reads only the lower triangle),
its fraction of the device's measured peak (a large device-to-device copy, bytes read + written),
and the speedup against torch eager and `torch.compile` of the same reference function. Then the
fused LM head + cross-entropy against eager `F.cross_entropy(h @ W.T)` (time and peak memory above
the inputs, forward + backward), and the training-step speedup of a ~350M GPT (24 layers, 1024 hidden,
16 heads, seq 2048, bf16, flash attention in both) with and without the kernels, with the model's
MFU by Megatron's FLOP formula over the dense bf16 peak of 989 TFLOP/s. All times are medians of
CUDA-event-timed repeats; the step comparison interleaves the two variants.
The last line is
`kernels_min_speedup_vs_eager=<x> kernels_min_bw_fraction=<f> xent_memory_ratio=<m> step_speedup=<s>`.
Without a GPU it says so and only compiles every kernel with nvcc (`--compile-only` does that anywhere).
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

import kernels
from kernels import compile_check, reference
from kernels.bias_gelu import FusedBiasGelu

DENSE_BF16_PEAK = 989e12


def compile_only() -> int:
    try:
        failures = compile_check.compile_all()
    except FileNotFoundError as e:  # no nvcc: nothing to check with, said in one line
        print(f"benchmarks.kernels: {e}", file=sys.stderr)
        return 2
    for (file, arch), err in failures.items():
        print(f"FAILED {file} {arch}: {err.splitlines()[0] if err else ''}")
    print(f"compiled {len(compile_check.runtime.SOURCES)} kernel sources for {', '.join(compile_check.ARCHES)}: "
          f"{'ok' if not failures else f'{len(failures)} failures'}")
    return 1 if failures else 0


def timed(fn, reps: int, queued: bool = False, inner: int = 10) -> float:
    """Median milliseconds per call over `reps` CUDA-event-timed repeats after warm-up.
    queued=True: the GPU first spins (torch.cuda._sleep) while the host queues `inner` calls behind
    it, so the events time the GPU work alone, not the Python launch cost (a training step hides
    that cost by running ahead of the GPU; the launch-overhead line reports it separately)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    inner = inner if queued else 1
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if queued:
            torch.cuda._sleep(50_000_000)  # ~25 ms of spinning: far longer than queueing `inner` calls
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / inner)
    return statistics.median(times)


def launch_overhead_us(reps: int = 2000) -> tuple[float, float]:
    """Host microseconds per call of fused vs eager LayerNorm forward on a tiny input (CPU-bound)."""
    import time
    x, w, b = (torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in ((8, 64), (64,), (64,)))
    out = []
    for fused in (True, False):
        for _ in range(50):
            kernels.layer_norm(x, w, b, fused=fused)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            kernels.layer_norm(x, w, b, fused=fused)
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / reps * 1e6)
    return out[0], out[1]


def peak_bandwidth(reps: int) -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    y = torch.empty_like(x)
    ms = timed(lambda: y.copy_(x), reps)
    return 2 * x.numel() / ms / 1e6  # GB/s


def compiled_for_replay(fn):
    """torch.compile of a reference whose backward direction_fns replays from one retained graph, which a
    compiled backward that donates its saved buffers refuses (torch >= 2.6: "compiled with non-empty
    donated buffers"): donation off."""
    import torch._functorch.config as functorch_config
    functorch_config.donated_buffer = False
    return torch.compile(fn, dynamic=False)


def direction_fns(fn, inputs, dy):
    """(forward, backward) callables; backward replays the retained graph of one forward."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    grads_of = [t for t in leaves if t.requires_grad]
    return (lambda: fn(*leaves)), (lambda: torch.autograd.grad(out, grads_of, dy, retain_graph=True))


def kernel_cases(dtype):
    n, h = 8 * 2048, 1024
    s = torch.tensor([], dtype=dtype).element_size()
    x4 = torch.randn(n, 4 * h, device="cuda", dtype=dtype)
    b4 = torch.randn(4 * h, device="cuda", dtype=dtype)
    x = torch.randn(n, h, device="cuda", dtype=dtype)
    w, b = torch.randn(h, device="cuda", dtype=dtype), torch.randn(h, device="cuda", dtype=dtype)
    batches, sq = 4 * 16, 2048
    scores = torch.randn(batches, sq, sq, device="cuda", dtype=dtype)
    tri = batches * sq * (sq + 1) // 2
    return [
        ("bias_gelu", FusedBiasGelu.apply, reference.bias_gelu, [x4, b4],
         2 * x4.numel() * s, 3 * x4.numel() * s),
        ("layer_norm", lambda *a: kernels.layer_norm(*a, eps=1e-5), lambda *a: reference.layer_norm(*a, eps=1e-5),
         [x, w, b], 2 * x.numel() * s, 3 * x.numel() * s),
        ("causal_softmax", lambda t: kernels.scaled_causal_softmax(t, 0.125),
         lambda t: reference.scaled_causal_softmax(t, 0.125), [scores],
         (tri + scores.numel()) * s, (2 * tri + scores.numel()) * s),
    ]


def bench_kernels(dtype, reps: int, peak: float, use_compile: bool) -> list[dict]:
    rows = []
    for name, fused, ref, inputs, fwd_bytes, bwd_bytes in kernel_cases(dtype):
        dy = torch.randn_like(ref(*inputs))
        variants = {"fused": fused, "eager": ref}
        if use_compile:
            variants["compile"] = compiled_for_replay(ref)
        times = {}
        for label, fn in variants.items():
            fwd, bwd = direction_fns(fn, inputs, dy)
            times[label] = (timed(fwd, reps, queued=True), timed(bwd, reps, queued=True))
        for i, (direction, nbytes) in enumerate([("fwd", fwd_bytes), ("bwd", bwd_bytes)]):
            ms = times["fused"][i]
            rows.append({"kernel": f"{name}.{direction}", "ms": ms, "gb_s": nbytes / ms / 1e6,
                         "bw_fraction": nbytes / ms / 1e6 / peak, "vs_eager": times["eager"][i] / ms,
                         "vs_compile": times["compile"][i] / ms if use_compile else float("nan")})
        del variants
        torch.cuda.empty_cache()
    return rows


def bench_cross_entropy(dtype, reps: int, peak: float, use_compile: bool) -> tuple[list[dict], float]:
    tokens, hidden, vocab = 8 * 2048, 1024, 50304
    h = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
    w = torch.randn(vocab, hidden, device="cuda", dtype=dtype) * 0.02
    t = torch.randint(0, vocab, (tokens,), device="cuda")
    s = h.element_size()

    def eager(h, w):
        return F.cross_entropy((h @ w.t()).float(), t)

    def fused(h, w):
        return kernels.linear_cross_entropy(h, w, t)

    def step(fn):
        leaves = [h.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)]
        return lambda: torch.autograd.grad(fn(*leaves), leaves)

    variants = {"fused": fused, "eager": eager}
    if use_compile:
        variants["compile"] = torch.compile(eager, dynamic=False)
    times, memory = {}, {}
    for label, fn in variants.items():
        run = step(fn)
        times[label] = timed(run, reps, queued=True, inner=2)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        memory[label] = torch.cuda.max_memory_allocated() - base
    # the two memory-bound kernels alone, on one chunk of logits: stats reads it, grad reads + writes it
    from kernels import runtime
    logits = torch.randn(2048, vocab, device="cuda", dtype=dtype)
    stats = [torch.empty(2048, device="cuda") for _ in range(3)]
    vec = runtime.vector_width(vocab, logits)

    def xent_kernels():
        runtime.launch("cross_entropy.cu", runtime.expression("xent_stats", dtype, vec), (2048,), (512,),
                       (logits, t[:2048], runtime.i64(0), *stats, runtime.i32(vocab)))
        runtime.launch("cross_entropy.cu", runtime.expression("xent_grad", dtype, vec), (2048,), (512,),
                       (logits, t[:2048], runtime.i64(0), stats[0], stats[1], runtime.i32(vocab)))
    ms_k = timed(xent_kernels, reps, queued=True)
    nbytes = 3 * logits.numel() * s
    rows = [{"kernel": "xent.kernels", "ms": ms_k, "gb_s": nbytes / ms_k / 1e6, "bw_fraction": nbytes / ms_k / 1e6 / peak,
             "vs_eager": float("nan"), "vs_compile": float("nan")},
            {"kernel": "linear_xent.fwd+bwd", "ms": times["fused"], "gb_s": float("nan"), "bw_fraction": float("nan"),
             "vs_eager": times["eager"] / times["fused"],
             "vs_compile": times["compile"] / times["fused"] if use_compile else float("nan")}]
    ratio = memory["fused"] / memory["eager"]
    print(f"xent peak memory above inputs (MiB): fused {memory['fused'] / 2**20:.0f}, eager "
          f"{memory['eager'] / 2**20:.0f}" + (f", compile {memory['compile'] / 2**20:.0f}" if use_compile else "")
          + f" -> ratio {ratio:.3f}")
    return rows, ratio


def megatron_flops(p, batch: int) -> float:
    """Megatron-LM's model FLOPs per iteration without activation recomputation (Narayanan et al. 2021)."""
    s, l, h, v = p.seq_len, p.n_layer, p.d_model, p.vocab_size
    return 72 * batch * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))


def bench_step(reps: int, batch: int, with_compile: bool = False) -> float:
    from trainer.config import ModelParams
    from trainer.model import GPT
    p = ModelParams(n_layer=24, n_head=16, d_model=1024, vocab_size=50304, seq_len=2048)
    torch.manual_seed(0)
    tokens = torch.randint(0, p.vocab_size, (batch, p.seq_len + 1), device="cuda")
    setups = {}
    variants = [("fused", True, False), ("torch", False, False)] + ([("torch.compile", False, True)] if with_compile else [])
    for label, fused, compiled in variants:
        model = GPT(p.model_copy(update={"fused_kernels": fused})).to("cuda", torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        forward = torch.compile(model) if compiled else model

        def step(forward=forward, opt=opt):
            loss = forward(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        setups[label] = step
    times = {label: [] for label in setups}
    for _ in range(3):  # interleaved rounds
        for label, step in setups.items():
            times[label].append(timed(step, reps))
    ms = {k: statistics.median(v) for k, v in times.items()}
    flops = megatron_flops(p, batch)
    for label in setups:
        tflops = flops / ms[label] / 1e9
        print(f"step 350M bf16 batch {batch}x{p.seq_len} {label}: {ms[label]:.1f} ms, "
              f"{batch * p.seq_len / ms[label] * 1e3:,.0f} tokens/s, {tflops:.0f} TFLOP/s, MFU {tflops * 1e12 / DENSE_BF16_PEAK:.3f}")
    return ms["torch"] / ms["fused"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile-only", action="store_true", help="only compile every kernel with nvcc")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    ap.add_argument("--skip-step", action="store_true", help="skip the 350M training-step comparison")
    ap.add_argument("--step-compile", action="store_true",
                    help="also time the plain model under torch.compile in the step comparison")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8, help="sequences per training step")
    args = ap.parse_args(argv)
    if args.compile_only:
        return compile_only()
    if not kernels.fused_available():
        print("no CUDA GPU with CuPy here: checking that every kernel compiles (nvcc) instead")
        return compile_only()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    peak = peak_bandwidth(args.reps)
    print(f"measured peak memory bandwidth (device copy): {peak:,.0f} GB/s")
    fused_us, eager_us = launch_overhead_us()
    print(f"host time per LayerNorm call on a tiny input: fused {fused_us:.0f} us, eager {eager_us:.0f} us")
    rows = []
    for dtype in (torch.bfloat16,):
        rows += bench_kernels(dtype, args.reps, peak, not args.no_compile)
        xent_rows, ratio = bench_cross_entropy(dtype, args.reps, peak, not args.no_compile)
        rows += xent_rows
    print(f"{'kernel':<22}{'ms':>9}{'GB/s':>9}{'of peak':>9}{'vs eager':>10}{'vs compile':>12}")
    for r in rows:
        print(f"{r['kernel']:<22}{r['ms']:>9.3f}{r['gb_s']:>9.0f}{r['bw_fraction']:>9.2f}{r['vs_eager']:>10.2f}"
              f"{r['vs_compile']:>12.2f}")
    losers = [r["kernel"] for r in rows if r["vs_compile"] < 1]
    print("slower than torch.compile: " + (", ".join(losers) if losers else "none"))
    step = float("nan") if args.skip_step else bench_step(max(3, args.reps // 10), args.batch, args.step_compile)
    speedups = [r["vs_eager"] for r in rows if r["vs_eager"] == r["vs_eager"]]
    fractions = [r["bw_fraction"] for r in rows if r["bw_fraction"] == r["bw_fraction"]]
    print(f"kernels_min_speedup_vs_eager={min(speedups):.2f} kernels_min_bw_fraction={min(fractions):.2f} "
          f"xent_memory_ratio={ratio:.3f} step_speedup={step:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
