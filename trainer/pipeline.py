"""The GPT of trainer/model.py as a DeepSpeed pipeline: the same modules, listed as layer specs.

    [word embedding] [positions] [block] x n_layer [final LayerNorm] [word embedding as LM head]

The word embedding is one TiedLayerSpec: the first stage looks tokens up in it, the last stage uses
it as the LM head, and DeepSpeed sums its gradient across the two stages after every batch. The loss
(DeepSpeed's `loss_fn(outputs, labels)` on the last stage) is the tied module's fused head +
vocab-parallel cross-entropy, so the last stage never holds the full logits. Layers are split into
stages evenly by parameter count (DeepSpeed's partition_method="parameters"), by layer count ("uniform") or
by transformer blocks ("blocks": type:Block, as Megatron-DeepSpeed splits GPT); a split that would leave a
stage with parameters of one kind only (an embedding alone) is refused before launch (one_group_stage).
"""
from __future__ import annotations

from collections.abc import Iterator

import torch.nn as nn

from trainer.config import ModelParams, ParallelParams
from trainer.model import Block, LayerNorm, PositionEmbedding, WordEmbedding, init_parameters
from trainer.topology import process_topology

TIED = "embed"


def layer_specs(p: ModelParams, group=None) -> list:
    from deepspeed.pipe import LayerSpec, TiedLayerSpec
    return [TiedLayerSpec(TIED, WordEmbedding, p, group),
            LayerSpec(PositionEmbedding, p),
            *(LayerSpec(Block, p, group) for _ in range(p.n_layer)),
            LayerSpec(LayerNorm, p.d_model, p.layernorm_eps, p.fused_kernels),
            TiedLayerSpec(TIED, WordEmbedding, p, group, forward_fn=WordEmbedding.enter_head)]


def plain_name(layer: int, n_layer: int) -> str:
    """The plain GPT's name for pipeline layer `layer` (its module prefix in GPT.state_dict())."""
    if layer in (0, n_layer + 3):
        return "wte"
    if layer == 1:
        return "wpe"
    if layer == n_layer + 2:
        return "ln_f"
    return f"blocks.{layer - 2}"


def plain_modules(pipe: nn.Module, n_layer: int) -> Iterator[tuple[str, nn.Module]]:
    """(plain GPT module name, module) for every module this stage holds: what the layout-independent
    initialisation (and a layout-independent checkpoint) is keyed by."""
    for child_name, child in pipe.named_children():
        if child_name == "tied_modules":
            roots = [("wte", child[TIED])] if TIED in child else []
        elif child_name.isdigit():
            roots = [(plain_name(int(child_name), n_layer), child)]
        else:
            continue
        for prefix, root in roots:
            for sub_name, module in root.named_modules():
                yield (f"{prefix}.{sub_name}" if sub_name else prefix), module


LAYERS = ("WordEmbedding", "PositionEmbedding", "Block", "LayerNorm", "WordEmbedding")  # as layer_specs lists them


def layer_names(p: ModelParams) -> list[str]:
    return [*LAYERS[:2], *[LAYERS[2]] * p.n_layer, *LAYERS[3:]]


def layer_parameters(p: ModelParams, tp: int) -> list[int]:
    """The parameters each layer spec holds on one tensor-parallel rank, as DeepSpeed counts them to split the
    stages by parameters: column-parallel weights and biases and the vocabulary are split, a row-parallel
    layer's bias and the LayerNorms are whole. (The engine checks this against DeepSpeed's own split.)"""
    d, v = p.d_model, p.vocab_size // tp
    block = 2 * d + (3 * d * d + 3 * d) // tp + d * d // tp + d + 2 * d + (4 * d * d + 4 * d) // tp + 4 * d * d // tp + d
    return [v * d, p.seq_len * d, *[block] * p.n_layer, 2 * d, v * d]


def partition_method(par: ParallelParams) -> str:
    """DeepSpeed's name for the layout's partition: `blocks` is Megatron-DeepSpeed's type:transformer."""
    return "type:Block" if par.partition == "blocks" else par.partition


def stage_parts(p: ModelParams, par: ParallelParams) -> list[int]:
    """The first layer of each stage (and the end), as DeepSpeed's PipelineModule will split them."""
    from deepspeed.runtime.utils import partition_balanced, partition_uniform
    names = layer_names(p)
    if par.partition == "uniform":
        return list(partition_uniform(num_items=len(names), num_parts=par.pp))
    weights = [int(n == "Block") for n in names] if par.partition == "blocks" else layer_parameters(p, par.tp)
    return [int(x) for x in partition_balanced(weights=weights, num_parts=par.pp)]


def one_group_stage(p: ModelParams, par: ParallelParams) -> str | None:
    """Why a stage of this split would hold parameters of one kind only (matrices, which take weight decay, or
    biases and LayerNorms, which do not); None when each holds both. DeepSpeed drops such a stage's empty
    parameter group, and ZeRO-1's gradient norm, one all-reduce per group across the stages, then hangs at the
    first step (fp32, fp16) or fails in bf16 ("stack expects a non-empty TensorList"): a stage with a block, or
    with the final LayerNorm and an embedding, is fine. Megatron-DeepSpeed splits by transformer layers."""
    if par.pp == 1:
        return None
    names, parts = layer_names(p), stage_parts(p, par)
    for s in range(par.pp):
        held = names[parts[s]:parts[s + 1]]
        matrices = any(n != "LayerNorm" for n in held)
        vectors = any(n in ("Block", "LayerNorm") for n in held)
        if not (matrices and vectors):
            lacks = "biases or LayerNorms (no-decay parameters)" if matrices else "matrices (weight-decayed parameters)"
            return (f"pp {par.pp} with partition {par.partition!r} leaves stage {s} with no {lacks} "
                    f"({', '.join(held) or 'no layer'}): DeepSpeed drops its empty parameter group, and ZeRO-1 hangs "
                    f"at the first step; use partition 'blocks' (each stage an equal share of the blocks, as "
                    f"Megatron-DeepSpeed) or fewer stages")
    return None


def build_pipeline(p: ModelParams, par: ParallelParams, group=None, seed: int = 0):
    """This rank's stage of the pipeline, initialised exactly as GPT(p, seed=seed) would be."""
    from deepspeed.pipe import PipelineModule
    pipe = PipelineModule(layers=layer_specs(p, group), topology=process_topology(par),
                          partition_method=partition_method(par), activation_checkpoint_interval=int(par.recompute),
                          checkpointable_layers=["Block"],  # not the embeddings: their input is tokens
                          base_seed=seed)  # only printed (no seed_layers: init_parameters seeds), so truthfully
    if list(pipe.parts) != stage_parts(p, par):  # plan() refused a one-group stage from this prediction
        raise RuntimeError(f"DeepSpeed split the stages at {list(pipe.parts)}, trainer.pipeline.stage_parts "
                           f"predicted {stage_parts(p, par)}")
    init_parameters(plain_modules(pipe, p.n_layer), p, seed)
    if TIED in pipe.tied_modules:  # the loss is computed on the last stage, which holds the head
        pipe.loss_fn = pipe.tied_modules[TIED].lm_loss
    return pipe
