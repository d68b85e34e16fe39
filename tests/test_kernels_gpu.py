"""The fused CuPy kernels against their torch references on a GPU (skipped without one); the checks
shared with tests/test_kernels_emulated.py (the same CUDA code, emulated on the CPU) are in
tests/kernel_checks.py, with its error measures."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import reference, runtime
from kernels.bias_gelu import BACKWARD_TILINGS, FusedBiasGelu
from kernels.cross_entropy import FusedLinearCrossEntropy
from tests import kernel_checks as check
from tests.kernel_checks import DTYPES, as64, close, grads

pytestmark = pytest.mark.skipif(not kernels.fused_available(), reason="needs a CUDA GPU and CuPy")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4096, 4096), (3, 7, 1000), (5, 1001), (37, 24)])
def test_bias_gelu(dtype, shape):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    b = torch.randn(shape[-1], device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    y, (dx, db) = grads(FusedBiasGelu.apply, [x, b], dy)
    ry, (rdx, rdb) = grads(reference.bias_gelu, as64([x, b]), dy.double())
    close(y, ry, dtype, "bias_gelu y")
    close(dx, rdx, dtype, "bias_gelu dx")
    close(db, rdb, dtype, "bias_gelu dbias")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tiling", BACKWARD_TILINGS, ids=check.tiling_id)
@pytest.mark.parametrize("rows,cols", [(1037, 4096), (300, 1000), (33, 1001)])
def test_bias_gelu_backward_tilings(dtype, tiling, rows, cols):
    """Every backward tiling the sweep times, at row counts that leave chunks uneven and widths that
    leave vectors or a block's threads idle."""
    check.bias_gelu_tiling("cuda", dtype, tiling, rows, cols)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(4096, 1024), (37, 4096), (64, 1000), (33, 1001), (16, 20480), (8, 96),
                                       (300, 512), (5, 264), (64, 101)])
def test_layer_norm(dtype, rows, cols):
    check.layer_norm("cuda", dtype, rows, cols)
    assert runtime._function.cache_info().currsize > 0, "the fused path must have launched"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("warp,slots,rows_per_step,shared_acc,prefetch", runtime.BACKWARD_VARIANTS)
@pytest.mark.parametrize("rows,cols", [(1037, 1024), (33, 1001), (300, 512)])
def test_layer_norm_backward_variants(dtype, warp, slots, rows_per_step, shared_acc, prefetch, rows, cols):
    """The backward variants the sweep times (several rows per iteration, shared-memory accumulators,
    a warp per row, a register cap, the next row in flight), at an odd row count (a last iteration with
    a row past the end, a warp of a block with no row) and odd widths."""
    check.layer_norm_backward_variant("cuda", dtype, warp, slots, rows_per_step, shared_acc, prefetch, rows, cols)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sums,parts,cols", [(2, 1, 1024), (2, 7, 33), (2, 1023, 1000), (2, 1056, 1024),
                                             (2, 2049, 96), (1, 264, 4096), (1, 5, 4100)])
def test_partial_sums(dtype, sums, parts, cols):
    """A backward's partial gradient rows added up (the LayerNorm's dgamma and dbeta, the bias-GeLU's
    dbias): partial counts below, just under and past a block's rows in flight (128 streams x 8 loads),
    and widths that leave a block's lanes without a column."""
    check.partial_sums("cuda", dtype, sums, parts, cols)


@pytest.mark.parametrize("rows,cols", [(2048, 256), (4096, 1024)])
def test_layer_norm_gradients_are_the_same_bytes_every_run(rows, cols):
    """The partial dgamma/dbeta sums are folded in a fixed order (warps in order, then the partial rows'),
    so a rerun on the same device gives the same bytes (how many partials there are depends on the
    device's multiprocessors): 256 bf16 features take the warp-per-row layout, 1024 the block one."""
    x, dy = (torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w, b = (torch.randn(cols, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    runs = [grads(lambda *a: kernels.layer_norm(*a, eps=1e-5), [x, w, b], dy) for _ in range(3)]
    for y, gs in runs[1:]:
        assert torch.equal(y, runs[0][0]) and all(torch.equal(g, g0) for g, g0 in zip(gs, runs[0][1]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 4, 128, 128), (3, 257, 257), (1, 2, 2048, 2048), (1, 1, 4096, 4096), (2, 5, 5)])
def test_causal_softmax(dtype, shape):
    check.causal_softmax("cuda", dtype, shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,vocab,hidden,chunk", [(1000, 50304, 256, 384), (777, 1001, 64, 100), (64, 128, 32, 4096)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_linear_cross_entropy(dtype, tokens, vocab, hidden, chunk, reduction):
    check.linear_cross_entropy("cuda", dtype, tokens, vocab, hidden, chunk, reduction)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cross_entropy_weight_gradient_keeps_its_precision_over_chunks(dtype):
    check.weight_gradient_over_chunks("cuda", dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_backward_multiplies_the_incoming_gradient_in_fp32(dtype, monkeypatch):
    """DeepSpeed's backward passes 1/gradient-accumulation-steps to the loss: the gradients at 1/3 are the
    gradients forward held (the weight's in fp32) times fp32's 1/3, rounded once (torch's bf16 * CUDA
    0-dim fp32 rounded 1/3 to 0.33398 first: every gradient x1.0018). Not the gradients at 1 times 1/3:
    in bf16 that rounds the fp32 weight gradient twice."""
    from kernels import cross_entropy
    h = torch.randn(777, 64, device="cuda", dtype=dtype)
    w = torch.randn(1001, 64, device="cuda", dtype=dtype) * 0.1
    t = torch.randint(0, 1001, (777,), device="cuda")
    held, scaled = [], cross_entropy.scaled
    monkeypatch.setattr(cross_entropy, "scaled", lambda g, factor, out: held.append(g.clone()) or scaled(g, factor, out))

    third = torch.tensor(1 / 3, device="cuda")
    _, at_third = grads(lambda h, w: FusedLinearCrossEntropy.apply(h, w, t, -100, "mean", 256, None, 0, True),
                        [h, w], third)
    assert [g.dtype for g in held] == [dtype, torch.float32]  # backward scales the hidden gradient, then the weight's
    for g, got in zip(held, at_third):
        assert torch.equal(got, (g.float() * third).to(dtype))


def test_fp16_cross_entropy_gradients_survive_many_tokens_under_a_loss_scale():
    """fp16 training: 1/tokens x softmax (~1e-9 here) is below fp16's smallest number, so a gradient
    finished in forward loses every non-target logit's share; the fused loss defers 1/tokens to backward,
    where the loss scale comes in. Rows of words that are never a target have only that share."""
    tokens, vocab, hidden = 8192, 50304, 64
    h = torch.randn(tokens, hidden, device="cuda", dtype=torch.float16)
    w = torch.randn(vocab, hidden, device="cuda", dtype=torch.float16) * 0.05
    t = torch.randint(0, vocab, (tokens,), device="cuda")
    t[::7] = -100
    scale = torch.tensor(1024.0, device="cuda")  # a loss scale, as fp16 training's loss scaler applies

    def fused(h, w):
        return FusedLinearCrossEntropy.apply(h, w, t, -100, "mean", 2048, None, 0, True)

    loss, (dh, dw) = grads(fused, [h, w], scale)
    rloss, (rdh, rdw) = grads(lambda h, w: reference.linear_cross_entropy(h, w, t), as64([h, w]), scale.double())
    close(loss, rloss, torch.float16, "xent loss")
    close(dh, rdh, torch.float16, "xent dhidden")
    close(dw, rdw, torch.float16, "xent dweight")
    never = torch.ones(vocab, dtype=torch.bool, device="cuda")
    never[t[t >= 0]] = False
    close(dw[never], rdw[never], torch.float16, "xent dweight of never-target rows")


def test_fused_paths_refuse_what_they_cannot_take():
    x = torch.randn(8, 16, 32, device="cuda").transpose(1, 2)  # not contiguous: reference path, same result
    b = torch.randn(16, device="cuda")
    torch.testing.assert_close(kernels.bias_gelu(x, b), reference.bias_gelu(x, b))
    x, w = torch.randn(8, 64, device="cuda"), torch.randn(64, device="cuda")
    for weight, bias in ((w, None), (None, w), (None, None)):  # LayerNorm without its affine parts
        torch.testing.assert_close(kernels.layer_norm(x, weight, bias), F.layer_norm(x, (64,), weight, bias))
    with pytest.raises(ValueError, match="square"):
        kernels.scaled_causal_softmax(torch.randn(2, 3, 4, device="cuda"))


@pytest.mark.parametrize("dtype,attention", [(torch.float32, "softmax"), (torch.float32, "sdpa"),
                                             (torch.bfloat16, "softmax"), (torch.float16, "sdpa")])
def test_training_step_matches_reference(dtype, attention):
    """tests/kernel_checks.py's training_step, on the GPU."""
    before = runtime._function.cache_info().currsize
    check.training_step("cuda", dtype, attention)
    assert runtime._function.cache_info().currsize > before or before > 0


def test_cross_entropy_under_no_grad_and_autocast_and_fp16():
    h = torch.randn(300, 64, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(1001, 64, device="cuda", dtype=torch.bfloat16) * 0.1).requires_grad_(True)
    t = torch.randint(0, 1001, (300,), device="cuda")
    ref = reference.linear_cross_entropy(h.double(), w.detach().double(), t)
    with torch.no_grad():  # evaluation: the loss alone, no gradient work
        close(kernels.linear_cross_entropy(h, w, t), ref, torch.bfloat16, "no_grad loss")
    w32 = w.detach().float().requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.bfloat16):  # fp32 weights under autocast: matmuls follow the inputs
        loss = kernels.linear_cross_entropy(h.float(), w32, t)
    loss.backward()
    assert w32.grad.dtype == torch.float32 and torch.isfinite(w32.grad).all()
    close(loss, ref, torch.bfloat16, "autocast loss")  # the matmuls in bf16, as autocast runs them
    h16, w16 = h.half(), w.detach().half().requires_grad_(True)  # fp16 takes the fused path too
    loss16 = kernels.linear_cross_entropy(h16, w16, t)
    assert "Fused" in type(loss16.grad_fn).__name__
    loss16.backward()
    assert w16.grad.dtype == torch.float16
    # t on the CPU is moved, not passed as a host pointer
    close(kernels.linear_cross_entropy(h, w.detach(), t.cpu()), ref, torch.bfloat16, "cpu targets")


def test_empty_inputs_and_double_backward():
    b = torch.randn(64, device="cuda")
    assert kernels.bias_gelu(torch.randn(0, 64, device="cuda"), b).shape == (0, 64)
    x = torch.randn(8, 64, device="cuda", requires_grad=True)
    y = kernels.bias_gelu(x, b)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()  # once_differentiable: a second derivative is refused, not silently zero


@pytest.mark.parametrize("num_perm", [128, 1024, 7])
def test_minhash_signatures_on_the_gpu_are_bit_identical(num_perm):
    import random

    import numpy as np

    from tasks.dedup.gpu import signatures_gpu
    from tasks.dedup.minhash import shingle_hashes, signatures_of

    rng = random.Random(num_perm)
    words = [f"w{i}" for i in range(300)]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 3000))) for _ in range(200)] + ["", "a b"]
    hashes, offsets = shingle_hashes(docs, 5)
    assert np.array_equal(signatures_gpu(hashes, offsets, num_perm, 3), signatures_of(hashes, offsets, num_perm, 3))
