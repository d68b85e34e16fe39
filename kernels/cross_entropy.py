"""Fused LM head + softmax cross-entropy, chunked over tokens so the [tokens, vocab] logits are never
materialised. Per chunk: logits = hidden @ weight.T (cuBLAS), one kernel for each row's max and sum of
exponentials, the vocab-parallel combination in torch collectives, one kernel overwriting the logits
with the scaled gradient, then the two gradient matmuls. The gradients are finished in forward (the
loss is the graph's last op) and scaled by the incoming gradient in backward, as Liger's kernel does.
fp16 defers the per-token factor (1/tokens for the mean): softmax / tokens underflows fp16 before a
loss scale can reach it, so there the kernel writes the unscaled gradient, the gradients accumulate
in fp32, and backward applies the factor with the incoming (loss-scaled) gradient. The weight gradient
sums over every chunk, so in bf16 too it is accumulated in fp32 and rounded to bf16 once, in backward
(as Megatron's fp32 wgrad accumulation sums): summed in bf16, its error grew with the number of chunks
(3x the unchunked error at 64 chunks). On CUDA cuBLAS adds each chunk's product into it in fp32
(add_product), so no product is rounded to the inputs' dtype either."""
from __future__ import annotations

import torch
import torch.distributed as dist

from kernels import reference, runtime

FILE = "cross_entropy.cu"


def default_chunk(tokens: int, vocab: int, hidden: int) -> int:
    """Chunks whose logits are about 4x the hidden activations they come from, and at least 1024 rows
    so the matmuls stay efficient."""
    return max(1024, min(tokens, 4 * tokens * hidden // max(vocab, 1)))


class FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, ignore_index, reduction, chunk, group, vocab_start, grad_enabled):
        # grad_enabled: the caller's torch.is_grad_enabled() (forward itself always runs without grad).
        # autocast off inside: the out= matmuls below do not autocast, so all three follow the inputs' dtype
        with torch.autocast("cuda", enabled=False):
            return FusedLinearCrossEntropy._forward(ctx, hidden, weight, target, ignore_index, reduction, chunk,
                                                    group, vocab_start, grad_enabled)

    @staticmethod
    def _forward(ctx, hidden, weight, target, ignore_index, reduction, chunk, group, vocab_start, grad_enabled):
        tokens, cols = hidden.shape[0], weight.shape[0]
        valid = target != ignore_index
        scale = valid.float()
        factor = 1 / valid.sum().clamp(min=1) if reduction == "mean" else torch.ones((), device=hidden.device)
        deferred = hidden.dtype == torch.float16  # the factor waits for backward, gradients held in fp32
        if not deferred:
            scale = scale * factor
        # under no_grad (evaluation) only the loss is computed: no gradient kernel, no gradient matmuls
        need_hidden = grad_enabled and hidden.requires_grad
        need_weight = grad_enabled and weight.requires_grad
        held = torch.float32 if deferred else hidden.dtype
        grad_hidden = torch.empty(hidden.shape, dtype=held, device=hidden.device) if need_hidden else None
        grad_weight = (torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)  # a sum over chunks
                       if need_weight else None)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        inside = (target >= vocab_start) & (target < vocab_start + cols)  # in this rank's slice
        threads = 512
        for start in range(0, tokens, chunk):
            stop = min(tokens, start + chunk)
            h, t, n = hidden[start:stop], target[start:stop], stop - start
            logits = h @ weight.t()
            vec = runtime.vector_width(cols, logits)
            row_max = torch.empty(n, dtype=torch.float32, device=h.device)
            sums = torch.empty(2, n, dtype=torch.float32, device=h.device)  # summed over the ranks at once
            sum_exp, picked = sums
            runtime.launch(FILE, runtime.expression("xent_stats", logits.dtype, vec), (n,), (threads,),
                           (logits, t, runtime.i64(vocab_start), row_max, sum_exp, picked, runtime.i32(cols)))
            if group is not None:
                local_max = row_max.clone()
                dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
                sum_exp *= torch.exp(local_max - row_max)
            # the target's logit less the row's max, 0 on the ranks whose slice does not hold the target:
            # summed over the ranks, a target in no slice (outside the vocabulary, or a negative other than
            # ignore_index) counts as the row's max, as Megatron's vocab-parallel loss masks it. Taken
            # unshifted, it needed a word of which rank holds it (one more collective a call) and its own
            # sum (one more a chunk); now two a chunk, where Megatron makes three
            picked.sub_(row_max).masked_fill_(~inside[start:stop], 0.0)
            if group is not None:
                dist.all_reduce(sums, group=group)
            log_sum = sum_exp.log()
            lse = row_max + log_sum
            loss += ((log_sum - picked) * scale[start:stop]).sum()
            if not (need_hidden or need_weight):
                continue
            runtime.launch(FILE, runtime.expression("xent_grad", logits.dtype, vec), (n,), (threads,),
                           (logits, t, runtime.i64(vocab_start), lse, scale[start:stop].contiguous(), runtime.i32(cols)))
            if grad_hidden is not None:  # this chunk's own rows, written once
                if deferred:  # fp16 products of the unscaled gradient (no underflow), held in fp32
                    grad_hidden[start:stop] = logits @ weight
                else:
                    torch.mm(logits, weight, out=grad_hidden[start:stop])
            if grad_weight is not None:  # every chunk's product added into fp32
                add_product(grad_weight, logits.t(), h)
            del logits  # before the next chunk's logits are allocated: one chunk alive at a time
        ctx.save_for_backward(grad_hidden, grad_weight, factor if deferred else None)
        ctx.dtypes = hidden.dtype, weight.dtype
        return loss * factor if deferred else loss

    @staticmethod
    @torch.autograd.function.once_differentiable  # the gradients are constants computed in forward
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight, factor = ctx.saved_tensors
        grad_loss = grad_loss.float()
        if factor is not None:  # fp16: the deferred factor, with the loss scale
            grad_loss = grad_loss * factor
        return (None if grad_hidden is None else scaled(grad_hidden, grad_loss, ctx.dtypes[0]),
                None if grad_weight is None else scaled(grad_weight, grad_loss, ctx.dtypes[1]),
                None, None, None, None, None, None, None)


def add_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc (fp32) += a @ b. For 16-bit a and b on CUDA, cuBLAS adds the product into acc in fp32 (addmm
    with out_dtype): the product is never rounded to 16 bits, and no [vocab, hidden] temporary is
    written and read again. On the H200 at the benchmark's shape (13 chunks of 1334 x 50304 x 1024, bf16)
    that took 0.246 ms a chunk against 0.367 for the 16-bit product added into fp32, with 1.3e-6 relative
    error against float64 instead of 1.7e-3. Elsewhere the 16-bit product is added: the CPU has no such
    kernel, and torch's bf16 GEMM with an fp32 output refuses GPUs before sm_80 (the kernels themselves
    keep a bf16 path there)."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b)
    elif a.is_cuda and (a.dtype == torch.float16 or runtime.capability(a.device) >= (8, 0)):
        torch.ops.aten.addmm.dtype_out(acc, a, b, torch.float32, out=acc)
    else:
        acc += a @ b


# (held, parameter) dtypes of the backward's scaling: the weight gradient is held in fp32, the hidden one
# in fp32 for fp32 and fp16, in bf16 for bf16
SCALE_DTYPES = ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16),
                (torch.float32, torch.float16))


def scale_expression(held: torch.dtype, out: torch.dtype, vec: int) -> str:
    return f"xent_scale<{runtime.CUDA_TYPE[held]}, {runtime.CUDA_TYPE[out]}, {vec}>"


def scaled(held: torch.Tensor, factor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """held x factor (0-dim) multiplied in fp32, in `dtype`. Not torch's `held * factor`: on CUDA it rounds
    a 0-dim fp32 tensor to a bf16 operand's dtype before multiplying (1/3 -> 0.33398)."""
    out = torch.empty(held.shape, dtype=dtype, device=held.device)
    vec = runtime.vector_width(held.numel(), held, out)
    n_vec = held.numel() // vec
    blocks = max(1, min(-(-n_vec // 256), runtime.multiprocessors(held.device) * 16))
    runtime.launch(FILE, scale_expression(held.dtype, dtype, vec), (blocks,), (256,),
                   (held, out, factor.to(held.device, torch.float32).contiguous(), runtime.i64(n_vec)))
    return out


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *,
                         ignore_index: int = -100, reduction: str = "mean", chunk: int | None = None,
                         group: dist.ProcessGroup | None = None, vocab_start: int = 0,
                         fused: bool = True) -> torch.Tensor:
    """Mean (or summed) cross-entropy of `hidden @ weight.T` against `target`, over tokens whose target
    is not `ignore_index`. `weight` is this rank's vocabulary slice [vocab_local, hidden] starting at
    `vocab_start`; `group` is the tensor-parallel group (None: the whole vocabulary is here). The
    gradient reaching `hidden` is this rank's partial sum: the caller's tensor-parallel region all-reduces it.
    A target in no rank's slice (other than `ignore_index`) is masked as Megatron's vocab-parallel loss
    masks it: its loss is log sum exp(logits - max), its gradient the softmax. Under CUDA autocast the
    head's matmuls run in autocast's dtype."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):  # [b, s] targets of [s, b, h] states: a wrong loss
        raise ValueError(f"targets of shape {tuple(target.shape)} for hidden states of shape {tuple(hidden.shape)}: "
                         f"expected {tuple(hidden.shape[:-1])}")
    if hidden.is_cuda and torch.is_autocast_enabled("cuda"):  # the head's matmul as autocast would run it
        low = torch.get_autocast_dtype("cuda")
        hidden, weight = hidden.to(low), weight.to(low)
    hidden2 = hidden.reshape(-1, hidden.shape[-1])
    target1 = target.reshape(-1)
    if fused and runtime.supports(hidden2, weight) and hidden2.is_contiguous():
        target1 = target1.to(hidden2.device, torch.int64).contiguous()
        chunk = chunk or default_chunk(hidden2.shape[0], weight.shape[0], weight.shape[1])
        return FusedLinearCrossEntropy.apply(hidden2, weight, target1, ignore_index, reduction, chunk, group,
                                             vocab_start, torch.is_grad_enabled())
    return reference.linear_cross_entropy(hidden2, weight, target1, ignore_index=ignore_index,
                                          reduction=reduction, group=group, vocab_start=vocab_start)
