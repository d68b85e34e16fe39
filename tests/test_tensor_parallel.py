"""Tensor-parallel layers on 2 gloo ranks against plain nn.Linear / nn.Embedding / F.cross_entropy on
the same weights: outputs and every gradient match (the core of the engine's parity, issue #12)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainer import tensor_parallel as tp


def _rank(rank: int, init: str, queue) -> None:
    import torch.distributed as dist

    import kernels
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    group = dist.group.WORLD
    torch.manual_seed(0)  # the same full weights and inputs on both ranks
    d, hidden, vocab = 8, 32, 64
    x = torch.randn(3, 5, d, dtype=torch.float64)
    w1, b1 = torch.randn(hidden, d, dtype=torch.float64), torch.randn(hidden, dtype=torch.float64)
    w2, b2 = torch.randn(d, hidden, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    emb = torch.randn(vocab, d, dtype=torch.float64)
    tokens = torch.randint(0, vocab, (3, 5))
    diffs = {}

    def err(a, b):
        return float((a - b).abs().max())

    # MLP: column-parallel -> gelu -> row-parallel, against the plain two linears
    col = tp.ColumnParallelLinear(d, hidden, group).double()
    row = tp.RowParallelLinear(hidden, d, group).double()
    col.load_full(w1, b1)
    row.load_full(w2, b2)
    xp = x.clone().requires_grad_(True)
    y = row(F.gelu(col(xp)))
    y.square().sum().backward()
    xr = x.clone().requires_grad_(True)
    w1r, b1r, w2r, b2r = (t.clone().requires_grad_(True) for t in (w1, b1, w2, b2))
    yr = F.linear(F.gelu(F.linear(xr, w1r, b1r)), w2r, b2r)
    yr.square().sum().backward()
    half = slice(rank * hidden // 2, (rank + 1) * hidden // 2)
    diffs["mlp out"] = err(y, yr)
    diffs["mlp dx"] = err(xp.grad, xr.grad)
    diffs["col dW"] = err(col.weight.grad, w1r.grad[half])
    diffs["col db"] = err(col.bias.grad, b1r.grad[half])
    diffs["row dW"] = err(row.weight.grad, w2r.grad[:, half])
    diffs["row db"] = err(row.bias.grad, b2r.grad)

    # a gathered column-parallel output is the whole linear
    gathered = tp.ColumnParallelLinear(d, hidden, group, gather_output=True).double()
    gathered.load_full(w1, b1)
    xg = x.clone().requires_grad_(True)
    out = gathered(xg)
    (out * torch.arange(hidden, dtype=torch.float64)).sum().backward()
    xr2 = x.clone().requires_grad_(True)
    (F.linear(xr2, w1, b1) * torch.arange(hidden, dtype=torch.float64)).sum().backward()
    diffs["gather out"] = err(out, F.linear(x, w1, b1))
    diffs["gather dx"] = err(xg.grad, xr2.grad)

    # vocab-parallel embedding and the tied vocab-parallel LM head loss
    embed = tp.VocabParallelEmbedding(vocab, d, group).double()
    embed.load_full(emb)
    h = embed(tokens)
    targets = torch.randint(0, vocab, (15,))
    loss = kernels.linear_cross_entropy(tp.copy_to_region(h.reshape(15, d), group), embed.weight, targets,
                                        group=group, vocab_start=embed.vocab_start)
    loss.backward()
    embr = emb.clone().requires_grad_(True)
    hr = F.embedding(tokens, embr)
    lossr = F.cross_entropy(hr.reshape(15, d) @ embr.t(), targets)
    lossr.backward()
    diffs["embed out"] = err(h, hr)
    diffs["loss"] = abs(loss.item() - lossr.item())
    diffs["tied dW"] = err(embed.weight.grad, embr.grad[embed.vocab_start:embed.vocab_start + vocab // 2])
    queue.put((rank, diffs))
    dist.destroy_process_group()


def test_tensor_parallel_layers_match_plain_layers_on_two_ranks():
    from tests.ranks import run_ranks
    for rank, diffs in run_ranks(_rank).items():
        for what, d in diffs.items():
            assert d < 1e-10, f"rank {rank}: {what} differs by {d}"


def test_single_rank_layers_are_plain_layers_and_bad_splits_are_refused():
    torch.manual_seed(1)
    w, b = torch.randn(6, 4), torch.randn(6)
    col, row = tp.ColumnParallelLinear(4, 6), tp.RowParallelLinear(6, 4)
    col.load_full(w, b)
    row.load_full(w.t().contiguous(), b[:4])
    x = torch.randn(2, 4)
    torch.testing.assert_close(col(x), F.linear(x, w, b))
    torch.testing.assert_close(row(col(x)), F.linear(F.linear(x, w, b), w.t(), b[:4]))
    assert tp.padded_vocab(50257, 1) == tp.padded_vocab(50257, 8) == 51200 and tp.padded_vocab(50257, 3) == 52224
    with pytest.raises(ValueError, match="output features 6 is not divisible by the tensor-parallel size 4"):
        tp._split(6, 4, "output features")


def _gpt_rank(rank: int, init: str, queue) -> None:
    import torch.distributed as dist

    from trainer.config import ModelParams
    from trainer.model import GPT
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    p = ModelParams(n_layer=2, n_head=4, d_model=32, vocab_size=128, seq_len=16, attention="softmax",
                    fused_kernels=False)
    torch.manual_seed(0)
    full = GPT(p).double()
    sharded = GPT(p, group=dist.group.WORLD).double()
    tp.load_full_state(sharded, full.state_dict())
    tokens = torch.randint(0, 128, (3, 17))
    losses = []
    for model in (full, sharded):
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        losses.append(loss.item())
    diffs = {"loss": abs(losses[0] - losses[1])}
    modules = dict(sharded.named_modules())
    full_grads = {k: v.grad for k, v in full.named_parameters()}
    for key, param in sharded.named_parameters():
        mod_name, name = key.rsplit(".", 1)
        diffs[key] = float((param.grad - tp.local_part(modules[mod_name], name, full_grads[key])).abs().max())
    logits = sharded(tokens[:, :-1])  # gathered over the vocabulary slices
    diffs["logits"] = float((logits - full(tokens[:, :-1])).abs().max())
    queue.put((rank, diffs))
    dist.destroy_process_group()


def test_gpt_with_tensor_parallel_two_matches_one_rank():
    """The whole model at tp = 2 (heads, MLP, vocabulary split) against tp = 1 on the same weights."""
    from tests.ranks import run_ranks
    for rank, diffs in run_ranks(_gpt_rank).items():
        assert len(diffs) > 20
        for what, d in diffs.items():
            assert d < 1e-10, f"rank {rank}: {what} differs by {d}"


def _dropout_rank(rank: int, init: str, queue) -> None:
    import os

    import torch.distributed as dist
    from deepspeed.runtime.activation_checkpointing import checkpointing

    from trainer import rng
    from trainer.config import ModelParams
    from trainer.model import GPT
    from trainer.topology import Coord
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    group = dist.group.WORLD
    p = ModelParams(n_layer=2, n_head=4, d_model=32, vocab_size=128, seq_len=16, attention="softmax",
                    fused_kernels=False, dropout=0.2)
    model = GPT(p, group=group, seed=0).double().train()
    masks = []
    model.blocks[0].attn.drop.register_forward_hook(
        lambda mod, inp, out: masks.append((out == 0) & (inp[0] != 0)) if inp[0].dim() == 4 else None)
    tokens = torch.randint(0, 128, (3, 16), generator=torch.Generator().manual_seed(0))
    rng.seed_streams(1234, Coord(data=0, pipe=0, model=rank))
    logits = model(tokens)
    found = {}
    # attention probabilities: each rank drops over its own heads, from its own stream
    heads = [torch.empty_like(masks[0]) for _ in range(2)]
    dist.all_gather(heads, masks[0].contiguous())
    found["heads' masks differ"] = not torch.equal(heads[0], heads[1])
    found["dropped fraction"] = float(masks[0].float().mean())
    # everything outside the regions is replicated: the same masks, so the same logits on both ranks
    both = [torch.empty_like(logits) for _ in range(2)]
    dist.all_gather(both, logits.contiguous())
    found["logits agree"] = torch.equal(both[0], both[1])
    # a recompute (DeepSpeed's activation checkpointing) draws the same masks, in both streams
    x = model.wte(tokens[:, :8]).detach().requires_grad_(True)
    grads = []
    for recompute in (False, True):
        rng.seed_streams(99, Coord(data=0, pipe=0, model=rank))
        model.zero_grad()
        block = model.blocks[1]
        out = checkpointing.checkpoint(block, x) if recompute else block(x)
        out.square().sum().backward()
        grads.append([q.grad.clone() for q in block.parameters()])
    found["recompute's gradients"] = max(float((a - b).abs().max()) for a, b in zip(*grads))
    queue.put((rank, found))
    dist.destroy_process_group()


def test_dropout_under_tensor_parallelism_draws_as_megatron():
    """Attention dropout at tp = 2 drew one mask for both ranks' heads (one default stream seeded alike on
    both); now each rank's heads draw from its own stream, the replicated activations' masks agree, and
    DeepSpeed's activation checkpointing recomputes the same masks."""
    from tests.ranks import run_ranks
    for rank, found in run_ranks(_dropout_rank).items():
        assert found["heads' masks differ"] and found["logits agree"], (rank, found)
        assert 0.1 < found["dropped fraction"] < 0.3, (rank, found)
        assert found["recompute's gradients"] == 0.0, (rank, found)
