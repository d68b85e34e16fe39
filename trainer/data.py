"""What a step trains on: samples [consumed, consumed + global batch) of the blend, in blend order, each
replica taking its contiguous share. The data position is the count of consumed samples, so a resumed
run (at any layout) sees exactly the samples the uninterrupted run would have seen."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol

import numpy as np
import torch


class Samples(Protocol):
    seq_len: int  # tokens a sample trains on (it holds seq_len + 1)
    vocab_size: int  # token ids are below this

    def __len__(self) -> int: ...
    def __getitem__(self, k: int) -> np.ndarray: ...


class MockSamples:
    """Deterministic random tokens (Megatron's --mock-data): for smoke runs and benchmarks without a blend."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int = 0):
        self.n, self.seq_len, self.vocab_size, self.seed = n, seq_len, vocab, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> np.ndarray:
        if not 0 <= k < self.n:
            raise IndexError(k)
        return np.random.default_rng((self.seed, k)).integers(0, self.vocab_size, self.seq_len + 1, dtype=np.int64)


class HeldSamples:
    """`samples`, of which a read at or past `limit` waits until the process is killed: an operator drill
    (trainer.run.launch_and_kill) stops the run at a chosen step, whatever the machine's speed."""

    def __init__(self, samples: Samples, limit: int):
        self.samples, self.limit = samples, limit
        self.seq_len, self.vocab_size = samples.seq_len, samples.vocab_size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, k: int) -> np.ndarray:
        if k >= self.limit:
            threading.Event().wait()  # forever: the drill kills every rank here
        return self.samples[k]


def samples_before_step(step: int, s, par, seq_len: int) -> int:
    """The samples consumed by the steps before `step` (1-based), batch ramp-up included."""
    from trainer.schedule import global_batch
    consumed = 0
    for _ in range(step - 1):
        consumed += global_batch(consumed, s, par, seq_len)
    return consumed


def open_blend(blend_dir: Path, datasets_dir: Path) -> Samples:
    from tasks.tokenize.blend import BlendedSamples
    return BlendedSamples(blend_dir, datasets_dir)


def check_fits(samples: Samples, seq_len: int, vocab_size: int) -> None:
    """The data must be what the model reads: samples of its context length, token ids in its
    vocabulary (an id past it would fail deep in the embedding as an index error)."""
    from tasks.core.errors import ConfigError
    if samples.seq_len != seq_len:
        raise ConfigError(f"the data's samples hold {samples.seq_len} tokens but the model's seq_len is {seq_len}")
    if samples.vocab_size > vocab_size:
        raise ConfigError(f"the data's vocabulary ({samples.vocab_size} tokens) does not fit the model's "
                          f"vocab_size {vocab_size}")


def replica_batch(samples: Samples, start: int, rows: int, replica: int, replicas: int) -> torch.Tensor:
    """This replica's share [rows / replicas, seq + 1] of the global batch starting at sample `start`."""
    per = rows // replicas
    first = start + replica * per
    return torch.from_numpy(np.stack([samples[k] for k in range(first, first + per)]))
