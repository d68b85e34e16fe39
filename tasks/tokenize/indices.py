"""The index arrays of Megatron's GPTDataset and BlendedDataset, built with numba-compiled loops.

- blending_indices: for each sample of the blend, the dataset it comes from and that dataset's sample
  number. Greedy, as megatron-core's helpers.cpp `build_blending_indices`: sample i goes to the
  dataset with the largest error `weight * max(i, 1) - samples_taken` (the first on ties), in the
  same double arithmetic, so the choices are identical to Megatron's. MT-NLG's run is ~132M samples:
  a Python loop per sample would take minutes, the compiled loop takes about a second.
- document_index: a dataset's documents repeated once per epoch, each epoch shuffled on its own.
- sample_index: where each sample of seq_length + 1 tokens starts (position in the document index,
  offset in that document); samples cross document boundaries. The same walk as helpers.cpp
  `build_sample_idx` (drop_last_partial_sequence, add_extra_token_to_sequence = 1).
- shuffle_index: a permutation of the samples.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def _blend(weights, size, dataset_index, dataset_sample_index):
    taken = np.zeros(weights.shape[0], dtype=np.int64)
    for i in range(size):
        at = max(float(i), 1.0)
        best = 0
        best_error = weights[0] * at - float(taken[0])
        for d in range(1, weights.shape[0]):
            error = weights[d] * at - float(taken[d])
            if error > best_error:
                best_error = error
                best = d
        dataset_index[i] = best
        dataset_sample_index[i] = taken[best]
        taken[best] += 1


def normalise_weights(weights) -> np.ndarray:
    """Weights as float64 summing to 1 (Megatron normalises the same way)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"blend weights must be finite, non-negative and not all zero, got {list(weights)}")
    return w / w.sum()


def blending_indices(weights, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset_index int16 [size], dataset_sample_index int64 [size]) for normalised `weights`."""
    w = np.ascontiguousarray(weights, dtype=np.float64)
    if w.size > np.iinfo(np.int16).max:
        raise ValueError(f"at most {np.iinfo(np.int16).max} datasets can be blended, got {w.size}")
    dataset_index = np.zeros(size, dtype=np.int16)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    _blend(w, size, dataset_index, dataset_sample_index)
    return dataset_index, dataset_sample_index


def document_index(documents: int, epochs: int, seed: int) -> np.ndarray:
    """Document ids for `epochs` passes, each pass in its own random order (int64)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    return np.concatenate([rng.permutation(documents) for _ in range(epochs)]) if epochs else np.zeros(0, np.int64)


@numba.njit(cache=True)
def _samples(sizes, doc_index, seq_length, num_samples, out):
    doc_pos = 0
    offset = 0
    out[0, 0] = 0
    out[0, 1] = 0
    for s in range(1, num_samples + 1):
        remaining = seq_length + 1
        while remaining != 0:
            length = sizes[doc_index[doc_pos]] - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1  # the last token of a sample starts the next one
                remaining = 0
            else:
                if doc_pos == doc_index.shape[0] - 1:
                    offset = sizes[doc_index[doc_pos]] - 1
                    break
                doc_pos += 1
                offset = 0
        out[s, 0] = doc_pos
        out[s, 1] = offset


def sample_index(sizes: np.ndarray, doc_index: np.ndarray, seq_length: int) -> np.ndarray:
    """[num_samples + 1, 2] int64: sample k spans from (doc_index position, offset) row k to row k+1,
    seq_length + 1 tokens in all. num_samples = (tokens in doc_index - 1) // seq_length."""
    if seq_length < 1:
        raise ValueError(f"seq_length must be >= 1, got {seq_length}")
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    doc_index = np.ascontiguousarray(doc_index, dtype=np.int64)
    tokens = int(sizes[doc_index].sum()) if doc_index.size else 0
    num_samples = max(0, (tokens - 1) // seq_length)
    out = np.zeros((num_samples + 1, 2), dtype=np.int64)
    if num_samples:
        _samples(sizes, doc_index, seq_length, num_samples, out)
    return out


def shuffle_index(num_samples: int, seed: int) -> np.ndarray:
    return np.random.Generator(np.random.PCG64(seed)).permutation(num_samples)


def epochs_needed(samples: int, tokens_per_epoch: int, seq_length: int) -> int:
    """Fewest epochs whose tokens give `samples` samples of seq_length + 1 (overlapping by one token)."""
    if samples <= 0:
        return 0
    if tokens_per_epoch <= 1:
        raise ValueError("a dataset with fewer than 2 tokens cannot fill a sample")
    return -(-(samples * seq_length + 1) // tokens_per_epoch)
