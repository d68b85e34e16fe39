"""Where each rank sits in the 3D layout, and the process groups built from it.

Rank order is (data, pipe, model) with model fastest: the tp ranks of one stage are adjacent (inside
a node, where tensor parallelism's per-layer all-reduces need NVLink), a replica's pipeline stages
are the next blocks of ranks (across nodes), data parallelism is outermost. MT-NLG: tp 8 x pp 35, replicas over the rest (2240 GPUs: dp 8).
"""
from __future__ import annotations

from typing import NamedTuple

import torch.distributed as dist

from trainer.config import ParallelParams

AXES = ["data", "pipe", "model"]  # slowest to fastest


class Coord(NamedTuple):
    data: int
    pipe: int
    model: int


def coord(rank: int, par: ParallelParams) -> Coord:
    return Coord(rank // (par.pp * par.tp), rank // par.tp % par.pp, rank % par.tp)


def rank_of(c: Coord, par: ParallelParams) -> int:
    return (c.data * par.pp + c.pipe) * par.tp + c.model


def process_topology(par: ParallelParams):
    """DeepSpeed's topology object with the same axis order (its pipeline grid looks axes up by name)."""
    from deepspeed.runtime.pipe.topology import ProcessTopology
    return ProcessTopology(axes=AXES, dims=[par.dp, par.pp, par.tp])


def tensor_group(par: ParallelParams):
    """This rank's tensor-parallel group (None when tp = 1). Every rank creates every group, in the
    same order, as torch.distributed requires."""
    if par.tp == 1:
        return None
    mine = None
    for first in range(0, par.world_size, par.tp):
        ranks = list(range(first, first + par.tp))
        group = dist.new_group(ranks=ranks)
        if dist.get_rank() in ranks:
            mine = group
    return mine
