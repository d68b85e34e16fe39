"""The index arrays of Megatron's GPTDataset and BlendedDataset, built with numba-compiled loops.

- blending_indices: for each sample of the blend, the dataset it comes from and that dataset's sample
  number. Greedy, as megatron-core's helpers.cpp `build_blending_indices`: sample i goes to the
  dataset with the largest error `weight * max(i, 1) - samples_taken` (the first on ties), in the
  same double arithmetic, so the choices are identical to Megatron's. MT-NLG's run is ~132M samples:
  a Python loop per sample would take minutes, the compiled loop takes about a second.
- dataset_indices: a dataset's document, sample and shuffle indices as megatron-core's GPTDataset builds
  them (`_build_document_sample_shuffle_indices`), so the same files and seed give the same samples:
  - document_index: the documents repeated once per epoch, all epochs shuffled together by one
    numpy RandomState(seed); when the last epoch supplies under 80% of an epoch's samples it is
    shuffled apart and put last (`separate_final_epoch`), so every full epoch is read before it;
  - sample_index: where each sample of seq_length + 1 tokens starts (position in the document index,
    offset in that document); samples cross document boundaries. The same walk as helpers.cpp
    `build_sample_idx` (drop_last_partial_sequence, add_extra_token_to_sequence = 1);
  - shuffle_index: a permutation of the samples by the same RandomState (the final epoch's apart).
  Every dataset's RandomState starts from the same seed, as in Megatron.
"""
from __future__ import annotations

import math

import numba
import numpy as np

SURPLUS = 0.005  # megatron-core builds each blended dataset for ceil(ceil(samples x weight) x 1.005) samples
FINAL_EPOCH = 0.8  # a last epoch giving fewer than this share of an epoch's samples is shuffled apart


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


def dataset_samples(weight: float, samples: int) -> int:
    """The samples megatron-core builds a blended dataset for: its share of the blend plus 0.5%."""
    return int(math.ceil(math.ceil(samples * weight) * (1 + SURPLUS)))


def document_index(documents: int, epochs: int, state: np.random.RandomState, separate_final: bool = False) -> np.ndarray:
    """Document ids for `epochs` passes (int32), shuffled together by `state`; with `separate_final` the
    last pass is shuffled on its own and put last (megatron-core's `_build_document_index`)."""
    if separate_final and epochs > 1:
        return np.concatenate([document_index(documents, epochs - 1, state), document_index(documents, 1, state)])
    out = np.tile(np.arange(documents, dtype=np.int32), epochs)
    state.shuffle(out)
    return out


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


_PIECE = 1 << 18  # 2 MiB of sizes at a time


def sample_index(sizes: np.ndarray, doc_index: np.ndarray, seq_length: int) -> np.ndarray:
    """[num_samples + 1, 2] int64: sample k spans from (doc_index position, offset) row k to row k+1,
    seq_length + 1 tokens in all. num_samples = (tokens in doc_index - 1) // seq_length."""
    if seq_length < 1:
        raise ValueError(f"seq_length must be >= 1, got {seq_length}")
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    # the document index as it is (int32) and its tokens summed in pieces: an int64 copy and sizes[doc_index]
    # whole held 16 more bytes per document-epoch, twice what check_index_size counts (OOM-killed, not refused)
    doc_index = np.ascontiguousarray(doc_index)
    tokens = sum(int(sizes[doc_index[lo:lo + _PIECE]].sum()) for lo in range(0, doc_index.size, _PIECE))
    num_samples = max(0, (tokens - 1) // seq_length)
    out = np.zeros((num_samples + 1, 2), dtype=np.int64)
    if num_samples:
        _samples(sizes, doc_index, seq_length, num_samples, out)
    return out


def shuffle_index(first: int, total: int, state: np.random.RandomState) -> np.ndarray:
    """The first `first` samples shuffled, then the rest shuffled apart (megatron-core's `_build_shuffle_index`)."""
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    head = np.arange(first, dtype=dtype)
    state.shuffle(head)
    if first == total:
        return head
    tail = np.arange(first, total, dtype=dtype)
    state.shuffle(tail)
    return np.concatenate([head, tail])


def dataset_epochs(samples: int, tokens: int, seq_length: int) -> int:
    """The passes megatron-core's GPTDataset makes over a dataset of `tokens` for `samples`: at least one."""
    return max(1, epochs_needed(samples, tokens, seq_length))


def dataset_indices(sizes: np.ndarray, samples: int, seq_length: int, seed: int):
    """(document_index, sample_index, shuffle_index, epochs) of a dataset of documents `sizes` read for
    `samples` samples, as megatron-core's GPTDataset builds them with `random_seed` = seed."""
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    tokens = int(sizes.sum())
    epochs = dataset_epochs(samples, tokens, seq_length)
    separate, sans_final = False, 0
    if epochs > 1:
        sans_final = ((epochs - 1) * tokens - 1) // seq_length
        separate = samples - sans_final < int(FINAL_EPOCH * ((tokens - 1) // seq_length))
    state = np.random.RandomState(seed)
    doc_index = document_index(len(sizes), epochs, state, separate)
    sample_idx = sample_index(sizes, doc_index, seq_length)
    total = sample_idx.shape[0] - 1
    return doc_index, sample_idx, shuffle_index(sans_final if separate else total, total, state), epochs


MIN_TOKENS = 2  # a sample is seq_length + 1 tokens overlapping the next by one: fewer never makes one


def epochs_needed(samples: int, tokens_per_epoch: int, seq_length: int) -> int:
    """Fewest epochs whose tokens give `samples` samples of seq_length + 1 (overlapping by one token)."""
    if samples <= 0:
        return 0
    if tokens_per_epoch < MIN_TOKENS:
        raise ValueError(f"a dataset with fewer than {MIN_TOKENS} tokens cannot fill a sample")
    return -(-(samples * seq_length + 1) // tokens_per_epoch)
