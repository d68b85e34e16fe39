"""Dropout's two random streams, as Megatron keeps them under tensor parallelism.

- The default stream drops activations outside the tensor-parallel regions (embeddings, the attention and
  MLP outputs). Those activations are replicated on a replica's tensor-parallel ranks, so their masks
  must agree there: the stream is seeded by (seed, replica, pipeline stage), the same on the ranks of a
  stage and different across stages and replicas (Megatron adds 100 x the pipeline rank).
- The tensor-parallel stream drops attention probabilities, which each rank holds for its own heads
  only: seeded by the rank's tensor-parallel coordinate too (Megatron's seed + 2718 + tp rank), so two
  ranks' heads do not share one mask. It lives in DeepSpeed's RNG tracker, whose activation
  checkpointing saves and restores it around a recompute as it does the default stream.
"""
from __future__ import annotations

import contextlib
import hashlib

import torch

from trainer.topology import Coord

TRACKER_NAME = "model-parallel-rng"  # DeepSpeed's (and Megatron's) name for the tensor-parallel stream


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") % 2**63


def tracker():
    from deepspeed.runtime.activation_checkpointing import checkpointing
    return checkpointing.get_cuda_rng_tracker()


def seed_streams(seed: int, c: Coord) -> None:
    """Seed this rank's default stream and (re)create its tensor-parallel stream."""
    torch.manual_seed(_seed(seed, "default", c.data, c.pipe))
    t = tracker()
    t.reset()
    t.add(TRACKER_NAME, _seed(seed, "tensor-parallel", c.data, c.pipe, c.model))


def tensor_parallel_region(active: bool):
    """Draw from the tensor-parallel stream inside (when `active`: training with dropout over split heads)."""
    return tracker().fork(TRACKER_NAME) if active else contextlib.nullcontext()


def tracker_state() -> dict[str, torch.Tensor]:
    """The tensor-parallel stream's state for a checkpoint (none before seed_streams)."""
    states = tracker().get_states()
    return {"tensor_parallel": states[TRACKER_NAME]} if TRACKER_NAME in states else {}


def restore_tracker_state(state: torch.Tensor) -> None:
    states = tracker().get_states()
    states[TRACKER_NAME] = state
    tracker().set_states(states)
