"""The GPT of trainer/model.py as a DeepSpeed pipeline: the same modules, listed as layer specs.

    [word embedding] [positions] [block] x n_layer [final LayerNorm] [word embedding as LM head]

The word embedding is one TiedLayerSpec: the first stage looks tokens up in it, the last stage uses
it as the LM head, and DeepSpeed sums its gradient across the two stages after every batch. The loss
(DeepSpeed's `loss_fn(outputs, labels)` on the last stage) is the tied module's fused head +
vocab-parallel cross-entropy, so the last stage never holds the full logits. Layers are split into
stages evenly by parameter count (DeepSpeed's partition_method="parameters").
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


def build_pipeline(p: ModelParams, par: ParallelParams, group=None, seed: int = 0):
    """This rank's stage of the pipeline, initialised exactly as GPT(p, seed=seed) would be."""
    from deepspeed.pipe import PipelineModule
    pipe = PipelineModule(layers=layer_specs(p, group), topology=process_topology(par),
                          partition_method=par.partition, activation_checkpoint_interval=int(par.recompute),
                          checkpointable_layers=["Block"],  # not the embeddings: their input is tokens
                          base_seed=seed)  # only printed (no seed_layers: init_parameters seeds), so truthfully
    init_parameters(plain_modules(pipe, p.n_layer), p, seed)
    if TIED in pipe.tied_modules:  # the loss is computed on the last stage, which holds the head
        pipe.loss_fn = pipe.tied_modules[TIED].lm_loss
    return pipe
