"""Kernels without a GPU: the reference paths against plain torch, the model on either path, and every
CUDA source compiled by nvcc for sm_80 and sm_90 (a syntax error in a kernel cannot land)."""
from __future__ import annotations

import math
import shutil

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import compile_check
from trainer.config import ModelParams
from trainer.model import GPT


def test_bias_gelu_reference_is_the_tanh_formula():
    x, b = torch.randn(5, 33, dtype=torch.float64), torch.randn(33, dtype=torch.float64)
    u = x + b
    expected = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
    torch.testing.assert_close(kernels.bias_gelu(x, b), expected)


def test_layer_norm_reference_matches_nn_layernorm():
    ln = torch.nn.LayerNorm(48, eps=1e-5).double()
    torch.nn.init.normal_(ln.weight)
    torch.nn.init.normal_(ln.bias)
    x = torch.randn(3, 7, 48, dtype=torch.float64)
    torch.testing.assert_close(kernels.layer_norm(x, ln.weight, ln.bias, 1e-5), ln(x))


def test_causal_softmax_reference_has_megatron_semantics():
    x = torch.randn(2, 3, 6, 6)
    y = kernels.scaled_causal_softmax(x, 0.5)
    for r in range(6):  # row r: softmax of 0.5 * x over columns 0..r, zeros after
        torch.testing.assert_close(y[..., r, : r + 1], torch.softmax(0.5 * x[..., r, : r + 1], -1))
        assert (y[..., r, r + 1:] == 0).all()
    assert kernels.scaled_causal_softmax(x.bfloat16(), 0.5).dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"square \[\.\.\., sq, sq\] scores, got shape \(2, 3, 4\)"):
        kernels.scaled_causal_softmax(torch.randn(2, 3, 4))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_linear_cross_entropy_reference_matches_f_cross_entropy(reduction):
    h = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 50, (40,))
    t[::5] = -100
    loss = kernels.linear_cross_entropy(h, w, t, reduction=reduction)
    expected = F.cross_entropy(h @ w.t(), t, ignore_index=-100, reduction=reduction)
    torch.testing.assert_close(loss, expected)
    g1 = torch.autograd.grad(loss, [h, w])
    g2 = torch.autograd.grad(expected, [h, w])
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum'"):
        kernels.linear_cross_entropy(h, w, t, reduction="none")


def test_linear_cross_entropy_masks_targets_outside_the_vocabulary_as_megatron_does():
    """Megatron's vocab_parallel_cross_entropy masks a target no rank holds: predicted logit 0 after the
    max is subtracted, so the loss is logsumexp - max and the gradient the softmax (no -1 anywhere)."""
    h = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(10, 8, dtype=torch.float64)
    t = torch.tensor([3, 10, -1, 15, 0, -100])
    loss = kernels.linear_cross_entropy(h, w, t, reduction="sum")
    logits = h @ w.t()
    inside = F.cross_entropy(logits[[0, 4]], t[[0, 4]], reduction="sum")
    outside = (logits[1:4].logsumexp(-1) - logits[1:4].max(-1).values).sum()
    torch.testing.assert_close(loss, inside + outside)
    (dh,) = torch.autograd.grad(loss, h)
    torch.testing.assert_close(dh[1:4], logits[1:4].softmax(-1) @ w)


def test_linear_cross_entropy_refuses_targets_not_shaped_as_the_hidden_states_rows():
    h = torch.randn(4, 3, 8)  # [s, b, h]
    with pytest.raises(ValueError, match=r"targets of shape \(3, 4\) for hidden states of shape \(4, 3, 8\): "
                                         r"expected \(4, 3\)"):
        kernels.linear_cross_entropy(h, torch.randn(10, 8), torch.zeros(3, 4, dtype=torch.long))


def _vocab_parallel_rank(rank: int, init: str, queue) -> None:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.manual_seed(0)
    h = torch.randn(12, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(10, 8, dtype=torch.float64)
    t = torch.tensor([0, 9, 4, 5, -100, 1, 2, 3, 6, 7, 8, 5])
    shard = w[rank * 5:(rank + 1) * 5].clone().requires_grad_(True)
    loss = kernels.linear_cross_entropy(h, shard, t, group=dist.group.WORLD, vocab_start=rank * 5)
    loss.backward()
    dh = h.grad.clone()
    dist.all_reduce(dh)  # what the column-parallel region's backward does
    # numpy, pickled by value: a tensor travels as a shared-memory handle that the parent must open
    # while this process is still alive, and it exits right after (ConnectionResetError, now and then)
    queue.put((rank, (loss.item(), dh.numpy(), shard.grad.numpy())))
    dist.destroy_process_group()


def test_vocab_parallel_reference_equals_the_whole_vocabulary():
    from tests.ranks import run_ranks
    got = run_ranks(_vocab_parallel_rank)
    torch.manual_seed(0)
    h = torch.randn(12, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(10, 8, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 9, 4, 5, -100, 1, 2, 3, 6, 7, 8, 5])
    loss = F.cross_entropy(h @ w.t(), t, ignore_index=-100)
    loss.backward()
    for rank in (0, 1):
        assert got[rank][0] == pytest.approx(loss.item(), rel=1e-12)
        torch.testing.assert_close(torch.from_numpy(got[rank][1]), h.grad)
        torch.testing.assert_close(torch.from_numpy(got[rank][2]), w.grad[rank * 5:(rank + 1) * 5])


def test_model_is_the_same_function_with_and_without_fused_kernels():
    p = ModelParams(n_layer=2, n_head=4, d_model=64, vocab_size=96, seq_len=16)
    torch.manual_seed(0)
    a, b = GPT(p), GPT(p.model_copy(update={"fused_kernels": False, "attention": "softmax"}))
    b.load_state_dict(a.state_dict())
    tokens = torch.randint(0, 96, (3, 17))
    la, lb = a(tokens[:, :-1], tokens[:, 1:]), b(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(la, lb)
    assert a(tokens[:, :-1]).shape == (3, 16, 96)
    assert la.item() == pytest.approx(math.log(96), rel=0.05), "a fresh model predicts near-uniformly"


def test_softmax_attention_scales_fp16_scores_in_the_matmul_as_megatron():
    """attention='softmax' computes the scores as Megatron's baddbmm(alpha=1/sqrt(head dim)): fp16 scores of
    q . k about 2e5 (2.5e4 scaled) are finite; q @ k^T first overflowed to inf and the softmax gave NaN."""
    from trainer.model import Attention
    p = ModelParams(n_layer=1, n_head=1, d_model=64, vocab_size=96, seq_len=8, attention="softmax")
    att = {a: Attention(p.model_copy(update={"attention": a})).half() for a in ("softmax", "sdpa")}
    att["sdpa"].load_state_dict(att["softmax"].state_dict())
    x = torch.full((1, 8, 64), 56.0, dtype=torch.float16)  # q = k = 56 per feature: q . k = 64 * 56^2 = 200704
    for a in att.values():
        with torch.no_grad():
            a.qkv.weight.zero_(), a.qkv.bias.zero_()
            a.qkv.weight[:128].fill_(1 / 64)  # q and k: the mean of x's features
            a.qkv.weight[128:].copy_(torch.eye(64))
            a.proj.weight.copy_(torch.eye(64))  # left uninitialised by the layer (GPT initialises it)
    out = att["softmax"](x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), att["sdpa"](x).float(), rtol=1e-2, atol=1e-2)


def test_model_params_refuse_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="n_head 5 does not divide d_model 64"):
        ModelParams(n_head=5, d_model=64)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) not installed")
def test_every_kernel_source_compiles_with_nvcc_for_sm80_and_sm90():
    assert compile_check.compile_all(("sm_80", "sm_90")) == {}


def test_the_compile_check_without_nvcc_says_so_in_one_line(monkeypatch, capsys):
    """Without the CUDA toolkit `benchmarks.kernels --compile-only` (and, with no GPU, the plain command)
    ended in a FileNotFoundError traceback."""
    from benchmarks import kernels as bench

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    assert bench.main(["--compile-only"]) == 2
    out, err = capsys.readouterr()
    assert err == "benchmarks.kernels: nvcc not found on PATH: install the CUDA toolkit to compile the kernels\n"


def test_compile_check_reports_a_broken_kernel(tmp_path, monkeypatch):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc (CUDA toolkit) not installed")
    from kernels import runtime
    broken = tmp_path / "cuda"
    shutil.copytree(runtime.SOURCE_DIR, broken)
    text = (broken / "bias_gelu.cu").read_text().replace("store_vec<T, VEC>(y + i * VEC, a);", "store_vec<T, VEC>(y + i * VEC, a)")
    (broken / "bias_gelu.cu").write_text(text)
    monkeypatch.setattr(runtime, "SOURCE_DIR", broken)
    monkeypatch.setattr(runtime, "every_instantiation", lambda: {"bias_gelu.cu": ["bias_gelu_fwd<float, 4>"]})
    failures = compile_check.compile_all(("sm_80",))
    assert list(failures) == [("bias_gelu.cu", "sm_80")] and "error" in failures[("bias_gelu.cu", "sm_80")]


def test_every_layout_the_wrappers_can_launch_is_in_the_nvcc_check(monkeypatch):
    """The launch policy (layouts() in kernels/layer_norm.py and kernels/causal_softmax.py) and the list the
    nvcc check compiles (runtime.every_instantiation) are written apart; a layout the policy can pick
    that the list lacks would reach users uncompiled by CI. Row widths from 1 to 2100 elements, every
    dtype, and the wide rows of real models; compilation is skipped (no GPU needed)."""
    from kernels import runtime
    from kernels.causal_softmax import layouts as softmax_layouts
    from kernels.layer_norm import layouts as layer_norm_layouts
    monkeypatch.setattr(runtime, "supports", lambda *tensors: True)
    monkeypatch.setattr(runtime, "resident", lambda file, kernel, dtype, lay, device=0: lay)
    runtime.row_layout.cache_clear()  # no fake layout may outlive this test (GPU runs share the process)
    try:
        listed = runtime.every_instantiation()
        missing = set()
        for dtype in runtime.CUDA_TYPE:
            for cols in [*range(1, 2101), 4095, 4096, 8191, 8192, 12288, 16384, 20480, 32768]:
                x = torch.empty(1, cols, dtype=dtype)
                picks = [("layer_norm.cu", ("layer_norm_fwd", "layer_norm_bwd"), layer_norm_layouts(x, x[0], x[0])),
                         ("causal_softmax.cu", ("causal_softmax_fwd", "causal_softmax_bwd"), softmax_layouts(x))]
                for file, names, lay in picks:
                    for name, one in zip(names, lay or ()):
                        if runtime.expression(name, dtype, one) not in listed[file]:
                            missing.add(runtime.expression(name, dtype, one))
        assert not missing, f"launchable but not compiled by the nvcc check: {sorted(missing)[:5]}"
    finally:
        runtime.row_layout.cache_clear()


def test_the_sweeps_variants_are_in_the_nvcc_check():
    """benchmarks/kernel_sweep.py times LayerNorm and bias-GeLU variants compiled by NVRTC at run time; the
    nvcc check compiles each, so a variant that does not build is found in CI, not on a lent GPU."""
    from benchmarks.kernel_sweep import GELU_BWD, LN_BWD, LN_FWD
    from kernels import runtime
    listed = runtime.every_instantiation()
    for dtype in runtime.CUDA_TYPE:
        vec = 16 // torch.tensor([], dtype=dtype).element_size()
        for kernel, specs in (("layer_norm_fwd", LN_FWD), ("layer_norm_bwd", LN_BWD)):
            for kind, slots, threads, _, variant in specs:
                lay = runtime.RowLayout(vec, slots, kind == "warp", threads, **variant)
                assert runtime.expression(kernel, dtype, lay) in listed["layer_norm.cu"], (kernel, lay)
        for t in GELU_BWD:
            assert t.expression(dtype, vec) in listed["bias_gelu.cu"], t
    from kernels.bias_gelu import Tiling
    assert Tiling(prefetch=True).expression(torch.bfloat16, 8) == "bias_gelu_bwd<bf16, 8, 1, true, true>"
    assert Tiling().expression(torch.bfloat16, 8) == "bias_gelu_bwd<bf16, 8, 1, true>"
    assert runtime.expression("layer_norm_bwd", torch.bfloat16, runtime.RowLayout(8, 1, False, 128, rows=2, shared_acc=True)) \
        == "layer_norm_bwd<bf16, 8, 1, false, 2, true>"
    assert runtime.expression("layer_norm_bwd", torch.bfloat16, runtime.RowLayout(8, 4, True, 128, shared_acc=True)) \
        == "layer_norm_bwd<bf16, 8, 4, true, 1, true>"
    assert runtime.expression("layer_norm_bwd", torch.bfloat16, runtime.RowLayout(8, 1, False, 128, stream=True)) \
        == "layer_norm_bwd<bf16, 8, 1, false, 1, false, true>"
    assert runtime.expression("layer_norm_fwd", torch.bfloat16, runtime.RowLayout(8, 4, True, 128, stream=True)) \
        == "layer_norm_fwd<bf16, 8, 4, true, true>"
    # expression is cached: a bool and an int of one value are spelt apart
    assert [runtime.expression("k", torch.bfloat16, 8, *more) for more in ((1, True), (True, 1))] \
        == ["k<bf16, 8, 1, true>", "k<bf16, 8, true, 1>"]
    with pytest.raises(ValueError, match="rows and shared_acc are the LayerNorm backward's"):
        runtime.expression("layer_norm_fwd", torch.bfloat16, runtime.RowLayout(8, 4, True, 128, stream=True, rows=2))
    with pytest.raises(ValueError, match="prefetches one row"):
        runtime.expression("layer_norm_bwd", torch.bfloat16, runtime.RowLayout(8, 1, False, 128, stream=True, rows=2))


def test_row_layout_refuses_warp_slots_the_nvcc_check_does_not_list():
    from kernels import runtime
    with pytest.raises(ValueError, match="warp_slots must be 1, 2 or 4"):
        runtime.row_layout("layer_norm.cu", "layer_norm_fwd", torch.float32, 1024, 4, 8, 0, warp_slots=8)
    with pytest.raises(ValueError, match="long_warp must be 'stream' or 'shared_acc'"):
        runtime.row_layout("layer_norm.cu", "layer_norm_bwd", torch.float32, 1024, 4, 4, 0, warp_slots=4, long_warp="x")


def test_the_backwards_long_warp_layouts_are_in_the_nvcc_check(monkeypatch):
    """Adopting the warp-per-row backward with shared accumulators (if the sweep picks it) is a change of
    row_layout's arguments in kernels/layer_norm.py; every layout it then gives is compiled already."""
    from kernels import runtime
    monkeypatch.setattr(runtime, "resident", lambda file, kernel, dtype, lay, device=0: lay)
    runtime.row_layout.cache_clear()
    try:
        listed = runtime.every_instantiation()["layer_norm.cu"]
        for dtype in runtime.CUDA_TYPE:
            vec = 16 // torch.tensor([], dtype=dtype).element_size()
            for cols in range(vec * 33, vec * 129, vec):
                lay = runtime.row_layout("layer_norm.cu", "layer_norm_bwd", dtype, cols, vec, 4, 0, warp_slots=4,
                                         long_warp="shared_acc", long_warp_regs=96)
                assert lay.warp and lay.shared_acc and not lay.stream and lay.max_regs == 96, lay
                assert runtime.expression("layer_norm_bwd", dtype, lay) in listed, lay
    finally:
        runtime.row_layout.cache_clear()


def test_the_partial_sum_kernel_takes_warps_for_about_ilp_loads_a_thread():
    """The LayerNorm's ~1056 partial rows keep 1024-thread blocks; the bias-GeLU's 264 take 9 warps (its
    512 blocks then fit one wave on the H100); a block never has less than a warp or more than 1024."""
    from kernels import partial_sums, runtime
    per_warp = 32 // partial_sums.COLS * partial_sums.ILP  # partial rows a warp has in flight
    assert [partial_sums.threads(n) for n in (1, per_warp, per_warp + 1, 264, 1056, 10 ** 6)] == \
        [32, 32, 64, 288, 1024, 1024]
    assert partial_sums.expression(torch.bfloat16) in runtime.every_instantiation()["partial_sums.cu"]


def test_a_balanced_grid_gives_every_block_the_same_rows_or_one_less():
    """RowLayout.balance (a sweep variant): 16384 rows of a warp each for 132 multiprocessors x 6 blocks
    of 4 warps (3168 warps) take 683 blocks of 6 rows a warp, not 792 blocks with a sixth round of 544
    warps; within one wave nothing changes."""
    import dataclasses

    from kernels import runtime
    lay = runtime.RowLayout(8, 4, True, 128, per_sm=6, stream=True)
    even = dataclasses.replace(lay, balance=True)
    assert (lay.grid(16384, 132), even.grid(16384, 132)) == (792, 683)
    assert even.grid(100, 132) == lay.grid(100, 132) == 25 and even.grid(4 * 792, 132) == 792
    for rows in (16384, 16385, 50000, 131072):
        blocks = even.grid(rows, 132)
        groups = -(-rows // 4)  # rows a block's warps take at a time
        per_block = [len(range(b, groups, blocks)) for b in range(blocks)]
        assert max(per_block) - min(per_block) <= 1 and max(per_block) == -(-groups // (132 * 6)), rows
