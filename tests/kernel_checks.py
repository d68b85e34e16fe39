"""The fused kernels against their torch references, one check per kernel, on a device: "cuda" for
tests/test_kernels_gpu.py, "cpu" for tests/test_kernels_emulated.py (the same CUDA code in the emulator).

Error measures: fp32, max |fused - ref| / max(1, max |ref|) <= 1e-5 against a float64 reference;
bf16/fp16, ||fused - ref|| / ||ref|| <= 1e-2 against the float64 reference of the same rounded inputs.
Every check draws fresh random inputs; outputs come from torch.empty, so an element a kernel failed to
write shows up as garbage or NaN."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels
from kernels import reference, runtime
from kernels.bias_gelu import BACKWARD, FusedBiasGelu
from kernels.cross_entropy import FusedLinearCrossEntropy

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str, fp32_tol: float = 1e-5) -> None:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), f"{what}: non-finite values"
    if dtype == torch.float32:
        err = ((out - ref).abs().max() / ref.abs().max().clamp(min=1)).item()
        assert err <= fp32_tol, f"{what}: fp32 max error {err:.2e}"
    else:
        err = ((out - ref).norm() / ref.norm().clamp(min=1e-12)).item()
        assert err <= 1e-2, f"{what}: {dtype} relative error {err:.2e}"


def grads(fn, inputs, dy):
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    y = fn(*leaves)
    y.backward(dy)
    return y.detach(), [t.grad for t in leaves]


def as64(ts):
    return [t.detach().double() for t in ts]


def tiling_id(t) -> str:
    return f"rows{t.rows}-{'interleaved' if t.interleaved else 'contiguous'}" + ("-prefetch" if t.prefetch else "")


def bias_gelu_tiling(device, dtype, tiling, rows, cols):
    """Forward and one backward tiling; a prefetching tiling does the same arithmetic in the same order
    as the default (the same chunks): the same bytes."""
    x = torch.randn(rows, cols, device=device, dtype=dtype)
    b = torch.randn(cols, device=device, dtype=dtype)
    dy = torch.randn_like(x)
    y, (dx, db) = grads(lambda *a: FusedBiasGelu.apply(*a, tiling), [x, b], dy)
    ry, (rdx, rdb) = grads(reference.bias_gelu, as64([x, b]), dy.double())
    close(y, ry, dtype, "bias_gelu y")
    close(dx, rdx, dtype, f"bias_gelu dx ({tiling})")
    close(db, rdb, dtype, f"bias_gelu dbias ({tiling})")
    if tiling.prefetch:
        _, same = grads(lambda *a: FusedBiasGelu.apply(*a, BACKWARD), [x, b], dy)
        assert torch.equal(dx, same[0]) and torch.equal(db, same[1]), f"prefetching changed the bytes ({tiling})"


def layer_norm(device, dtype, rows, cols):
    x = torch.randn(rows, cols, device=device, dtype=dtype) * 3 + 1
    w = torch.randn(cols, device=device, dtype=dtype)
    b = torch.randn(cols, device=device, dtype=dtype)
    dy = torch.randn_like(x)
    y, (dx, dw, db) = grads(lambda *a: kernels.layer_norm(*a, eps=1e-5), [x, w, b], dy)
    ry, (rdx, rdw, rdb) = grads(lambda *a: reference.layer_norm(*a, eps=1e-5), as64([x, w, b]), dy.double())
    for name, out, ref in [("y", y, ry), ("dx", dx, rdx), ("dgamma", dw, rdw), ("dbeta", db, rdb)]:
        close(out, ref, dtype, f"layer_norm {name}")


def fits_a_warp(dtype, cols: int, slots: int) -> bool:
    """Whether a row of `cols` (in the vectors runtime.vector_width gives an aligned row) fits a warp of
    `slots` vectors per lane."""
    return cols // runtime.vector_width(cols, torch.empty(cols, dtype=dtype)) <= 32 * slots


def pairwise(variants, dtypes, shapes) -> list[tuple]:
    """(variant, dtype, shape) cases in which every pair that runs (variant and dtype, variant and shape,
    dtype and shape) appears at least once: a Latin square (variant i, shape j: dtype i + j) less the
    cases that do not run (a row too wide for a warp variant), then a case for each pair those left out.
    A third of the full product's cases."""
    def runs(v, d, shape):
        return not v[0] or fits_a_warp(d, shape[1], v[1])
    cases = [(v, dtypes[(i + j) % len(dtypes)], shape) for i, v in enumerate(variants)
             for j, shape in enumerate(shapes) if runs(v, dtypes[(i + j) % len(dtypes)], shape)]
    runnable = [(v, d, shape) for v in variants for d in dtypes for shape in shapes if runs(v, d, shape)]
    for a, b in ((0, 1), (0, 2), (1, 2)):
        for c in runnable:
            if not any(x[a] == c[a] and x[b] == c[b] for x in cases):
                cases.append(c)
    return cases


def layer_norm_backward_variant(device, dtype, warp, slots, rows_per_step, shared_acc, prefetch, rows, cols):
    """One backward variant, one block per multiprocessor (blocks and warps take several rows each: the
    rows a prefetching variant loaded in an earlier iteration); prefetching gives the bytes of the same
    layout without."""
    from kernels.layer_norm import FusedLayerNorm, layouts
    x = torch.randn(rows, cols, device=device, dtype=dtype) * 3 + 1
    w, b = (torch.randn(cols, device=device, dtype=dtype) for _ in range(2))
    dy = torch.randn_like(x)
    fwd, default = layouts(x, w, b)
    nvec = cols // default.vec
    if warp and not fits_a_warp(dtype, cols, slots):
        pytest.skip(f"a row of {nvec} vectors does not fit a warp of {slots} slots")
    threads = 128 if warp else runtime.block_threads(nvec, slots)
    lay = runtime.resident("layer_norm.cu", "layer_norm_bwd", dtype, dataclasses.replace(
        default, slots=slots, warp=warp, threads=threads, rows=rows_per_step, shared_acc=shared_acc, stream=prefetch,
        max_regs=96 if warp else 64))
    lay = dataclasses.replace(lay, per_sm=1)
    _, (dx, dw, db) = grads(lambda *a: FusedLayerNorm.apply(*a, 1e-5, fwd, lay), [x, w, b], dy)
    _, (rdx, rdw, rdb) = grads(lambda *a: reference.layer_norm(*a, eps=1e-5), as64([x, w, b]), dy.double())
    for name, out, ref in [("dx", dx, rdx), ("dgamma", dw, rdw), ("dbeta", db, rdb)]:
        close(out, ref, dtype, f"layer_norm {name} ({lay})")
    if prefetch:  # the same grid (per_sm) as the layout without, so the same rows per block
        plain = dataclasses.replace(lay, stream=False)
        _, same = grads(lambda *a: FusedLayerNorm.apply(*a, 1e-5, fwd, plain), [x, w, b], dy)
        for name, out, ref in zip(("dx", "dgamma", "dbeta"), (dx, dw, db), same):
            assert torch.equal(out, ref), f"layer_norm {name}: prefetching changed the bytes ({lay})"


def partial_sums(device, dtype, sums, parts, cols):
    from kernels.partial_sums import sum_partials
    p = torch.randn(sums, parts, cols, device=device, dtype=torch.float32)
    out = sum_partials(p, dtype)
    assert out.shape == (sums, cols) and out.dtype == dtype
    close(out, p.double().sum(1), dtype, f"partial sums {sums} x {parts} x {cols}")
    assert torch.equal(sum_partials(p, dtype), out)


def causal_softmax(device, dtype, shape):
    x = torch.randn(shape, device=device, dtype=dtype) * 4
    dy = torch.randn_like(x)
    scale = 0.125
    y, (dx,) = grads(lambda t: kernels.scaled_causal_softmax(t, scale), [x], dy)
    ry, (rdx,) = grads(lambda t: reference.scaled_causal_softmax(t, scale), as64([x]), dy.double())
    close(y, ry, dtype, "softmax y")
    close(dx, rdx, dtype, "softmax dx")
    above = reference.causal_mask(shape[-2], shape[-1], x.device)
    assert (y[..., above] == 0).all() and (dx[..., above] == 0).all(), "zeros above the diagonal"


def cross_entropy_inputs(device, dtype, tokens, vocab, hidden):
    """(hidden, weight, targets, incoming gradient) of a cross-entropy check."""
    h = torch.randn(tokens, hidden, device=device, dtype=dtype)
    w = torch.randn(vocab, hidden, device=device, dtype=dtype) * 0.1
    t = torch.randint(0, vocab, (tokens,), device=device)
    t[::7] = -100  # ignored positions: no loss, no gradient
    t[3::11], t[5::13] = vocab + 5, -1  # in no slice: masked, as Megatron masks them
    g = torch.tensor(1 / 3, device=device)  # an incoming gradient that is not 1 (nor exact in bf16)
    return h, w, t, g


def linear_cross_entropy(device, dtype, tokens, vocab, hidden, chunk, reduction):
    h, w, t, g = cross_entropy_inputs(device, dtype, tokens, vocab, hidden)

    def fused(h, w):
        return FusedLinearCrossEntropy.apply(h, w, t, -100, reduction, chunk, None, 0, True)

    def ref(h, w):
        return reference.linear_cross_entropy(h, w, t, reduction=reduction)

    loss, (dh, dw) = grads(fused, [h, w], g)
    rloss, (rdh, rdw) = grads(ref, as64([h, w]), g.double())
    close(loss, rloss, dtype, "xent loss")
    close(dh, rdh, dtype, "xent dhidden")
    close(dw, rdw, dtype, "xent dweight")


def weight_gradient_over_chunks(device, dtype):
    """The LM head's weight gradient sums every chunk's product: in 64 chunks it is as close to the
    float64 reference as in one (summed in bf16 it was 3x further off, and further with more chunks)."""
    h, w, t, g = cross_entropy_inputs(device, dtype, 256, 64, 32)
    _, (_, ref) = grads(lambda h, w: reference.linear_cross_entropy(h, w, t), as64([h, w]), g.double())
    errors = {}
    for chunk in (256, 4):
        _, (_, dw) = grads(lambda h, w: FusedLinearCrossEntropy.apply(h, w, t, -100, "mean", chunk, None, 0, True),
                           [h, w], g)
        assert dw.dtype == dtype
        errors[chunk] = ((dw.double() - ref).norm() / ref.norm()).item()
    assert errors[4] <= 1.25 * errors[256], f"{dtype} dweight relative error: {errors[4]:.2e} in 64 chunks, " \
                                            f"{errors[256]:.2e} in one"


def training_step(device, dtype, attention):
    """A training step of a small GPT with every fused kernel in use (forward, backward, clipping, an SGD
    update) equals the same step on the torch path: the loss, each parameter's gradient and the
    parameters after the update. (Adam's first step is lr * sign(grad), so it would turn rounding-level
    differences of near-zero gradients into full-size ones; SGD keeps the comparison meaningful.)"""
    from trainer.config import ModelParams
    from trainer.model import GPT
    p = ModelParams(n_layer=2, n_head=4, d_model=256, vocab_size=1000, seq_len=128, attention=attention)
    torch.manual_seed(0)
    models = {f: GPT(p.model_copy(update={"fused_kernels": f})).to(device, dtype) for f in (True, False)}
    models[True].load_state_dict(models[False].state_dict())
    tokens = torch.randint(0, 1000, (4, 129), device=device)
    results = {}
    for fused, model in models.items():
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(tokens[:, :-1], tokens[:, 1:])
        assert ("Fused" in type(loss.grad_fn).__name__) == fused, "the fused model's loss must come from the fused head"
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        grads = {k: v.grad.detach().clone() for k, v in model.named_parameters()}
        opt.step()
        results[fused] = (loss.detach(), grads, {k: v.detach().clone() for k, v in model.named_parameters()})
    close(results[True][0], results[False][0], dtype, "loss")
    for name in results[False][1]:
        got, ref = results[True][1][name].double(), results[False][1][name].double()
        rel = ((got - ref).norm() / ref.norm().clamp(min=1e-12)).item()
        assert rel <= (1e-4 if dtype == torch.float32 else 1e-2), f"grad {name}: relative error {rel:.2e}"
        close(results[True][2][name], results[False][2][name], dtype, f"after step {name}")
