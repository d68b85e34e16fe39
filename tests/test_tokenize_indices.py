"""The Megatron-format writer/reader and the blend/sample indices against megatron-core itself
(its `IndexedDataset` and the compiled `helpers_cpp`, installed as a test extra)."""
from __future__ import annotations

import numpy as np
import pytest

from tasks.tokenize import indexed, indices

helpers_cpp = pytest.importorskip("megatron.core.datasets.helpers_cpp")
# MT-NLG's blend (weight %, issue #11), fifteen datasets
MTNLG = [14.3, 19.3, 5.7, 2.9, 4.8, 0.9, 1.0, 0.2, 9.4, 1.4, 1.6, 13.0, 15.7, 9.0, 0.9]


def megatron_blend(weights, size):
    dataset_index = np.zeros(size, dtype=np.int16)
    sample_index = np.zeros(size, dtype=np.int64)
    helpers_cpp.build_blending_indices(dataset_index, sample_index, np.asarray(weights, np.float64),
                                       len(weights), size, False)
    return dataset_index, sample_index


@pytest.mark.parametrize("weights,size", [
    (MTNLG, 1_000_000),
    ([0.5, 0.5], 1001),                # exact ties every other step: the first dataset wins
    ([1, 1, 1], 9999),
    ([0.7, 0.0, 0.3], 5000),           # a zero weight never gets a sample
    ([1e-6, 1 - 1e-6], 200_000),
    ([0.123456789, 0.2, 0.3, 0.376543211], 123_457),
])
def test_blending_indices_identical_to_megatron(weights, size):
    w = indices.normalise_weights(weights)
    ours = indices.blending_indices(w, size)
    theirs = megatron_blend(w, size)
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])


def test_blend_shares_follow_weights():
    w = indices.normalise_weights(MTNLG)
    dataset_index, _ = indices.blending_indices(w, 100_000)
    shares = np.bincount(dataset_index, minlength=len(w)) / 100_000
    assert np.abs(shares - w).max() < 1e-4


@pytest.mark.parametrize("bad", [[], [0, 0], [1, -1], [1, float("nan")]])
def test_blend_weights_refused(bad):
    with pytest.raises(ValueError, match="blend weights must be finite, non-negative and not all zero"):
        indices.normalise_weights(bad)


@pytest.mark.parametrize("seq_length,epochs", [(8, 1), (16, 3), (2048, 2), (5, 4)])
def test_sample_index_identical_to_megatron(seq_length, epochs):
    rng = np.random.default_rng(seq_length)
    sizes = rng.integers(1, 300, size=400).astype(np.int32)
    sizes[::37] = 1  # one-token documents
    doc_index = indices.document_index(sizes.size, epochs, np.random.RandomState(7))
    ours = indices.sample_index(sizes, doc_index, seq_length)
    theirs = helpers_cpp.build_sample_idx_int64(sizes, doc_index.astype(np.int32), seq_length, epochs,
                                                int(sizes.sum()), True, 1)
    np.testing.assert_array_equal(ours, theirs)


def test_samples_cover_the_token_stream_with_one_token_overlap():
    sizes = np.array([5, 3, 9, 1, 7], dtype=np.int64)
    doc_index = indices.document_index(5, 2, np.random.RandomState(1))
    stream = np.concatenate([np.arange(sizes[d]) + 100 * d for d in doc_index])
    idx = indices.sample_index(sizes, doc_index, seq_length=4)
    for k in range(idx.shape[0] - 1):
        (p0, o0), (p1, o1) = idx[k], idx[k + 1]
        start = sizes[doc_index[:p0]].sum() + o0
        end = sizes[doc_index[:p1]].sum() + o1
        assert end - start == 4  # 5 tokens: start..end inclusive
        assert len(stream[start:end + 1]) == 5


def test_document_index_shuffles_all_epochs_together_and_a_short_final_one_apart():
    a = indices.document_index(1000, 3, np.random.RandomState(5))
    assert a.dtype == np.int32 and (np.bincount(a) == 3).all()
    assert sorted(a[:1000]) != list(range(1000))  # the epochs are mixed, as Megatron shuffles them
    np.testing.assert_array_equal(a, indices.document_index(1000, 3, np.random.RandomState(5)))
    b = indices.document_index(1000, 3, np.random.RandomState(5), separate_final=True)
    assert sorted(b[2000:]) == list(range(1000)) and (np.bincount(b[:2000]) == 2).all()


@pytest.mark.parametrize("samples", [100, 230, 260, 590])  # 1 epoch; 2.3 (final apart); 2.6 (not); 5.9
def test_dataset_indices_identical_to_megatron_cores(samples):
    from megatron.core.datasets.gpt_dataset import _build_document_index, _build_shuffle_index
    rng = np.random.default_rng(samples)
    sizes = rng.integers(1, 60, size=90).astype(np.int32)  # ~2,700 tokens: ~100 samples of 27 + 1 a pass
    seq = 27
    doc, sample, shuffle, epochs = indices.dataset_indices(sizes, samples, seq, seed=1234)
    tokens = int(sizes.sum())
    megatron_epochs = 1  # GPTDataset._get_num_epochs: passes until samples x seq + 1 tokens
    while megatron_epochs * tokens < samples * seq + 1:
        megatron_epochs += 1
    assert epochs == megatron_epochs
    sans_final = ((epochs - 1) * tokens - 1) // seq
    separate = epochs > 1 and samples - sans_final < int(0.8 * ((tokens - 1) // seq))
    state = np.random.RandomState(1234)
    their_doc = _build_document_index(np.arange(sizes.size, dtype=np.int32), epochs, state, separate)
    their_sample = helpers_cpp.build_sample_idx_int64(sizes, their_doc, seq, epochs, tokens, True, 1)
    total = their_sample.shape[0] - 1
    their_shuffle = _build_shuffle_index(sans_final if separate else total, total, state)
    np.testing.assert_array_equal(doc, their_doc)
    np.testing.assert_array_equal(sample, their_sample)
    np.testing.assert_array_equal(shuffle, their_shuffle)


def test_epochs_needed():
    assert indices.epochs_needed(10, tokens_per_epoch=100, seq_length=20) == 3  # 201 tokens
    assert indices.epochs_needed(0, 100, 20) == 0


def _documents(rng, n, vocab):
    return [rng.integers(0, vocab, size=int(k), dtype=np.int64) for k in rng.integers(0, 50, size=n)]


@pytest.mark.parametrize("vocab", [50257, 70000])
def test_written_datasets_open_in_megatron_core(tmp_path, vocab):
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronIndexed
    rng = np.random.default_rng(0)
    docs = _documents(rng, 300, vocab)
    dtype = indexed.token_dtype(vocab)
    assert dtype == (np.uint16 if vocab < 65500 else np.int32)
    with indexed.IndexedWriter(tmp_path / "part", dtype) as w:
        w.add_documents(docs[:100])
        w.add_documents(docs[100:])
    theirs = MegatronIndexed(str(tmp_path / "part"))
    ours = indexed.IndexedDataset(tmp_path / "part")
    assert len(theirs) == len(ours) == 300
    for i, d in enumerate(docs):
        np.testing.assert_array_equal(theirs[i], d)
        np.testing.assert_array_equal(ours[i], d)
    np.testing.assert_array_equal(theirs.document_indices, np.arange(301))


def test_merged_pieces_equal_one_written_dataset(tmp_path):
    rng = np.random.default_rng(1)
    parts = [_documents(rng, n, 1000) for n in (10, 0, 25)]  # an empty piece too
    for k, docs in enumerate(parts):
        with indexed.IndexedWriter(tmp_path / f"p{k}", np.uint16) as w:
            w.add_documents(docs)
    with indexed.IndexedWriter(tmp_path / "merged", np.uint16) as w:
        for k in range(3):
            piece = indexed.IndexedDataset(tmp_path / f"p{k}")
            w.add_raw(piece.bin_path, piece.lengths)
    with indexed.IndexedWriter(tmp_path / "direct", np.uint16) as w:
        w.add_documents([d for docs in parts for d in docs])
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"merged{suffix}").read_bytes() == (tmp_path / f"direct{suffix}").read_bytes()


def test_broken_index_files_are_refused(tmp_path):
    with indexed.IndexedWriter(tmp_path / "ok", np.uint16) as w:
        w.add_documents([np.arange(10)])
    (tmp_path / "bad.idx").write_bytes(b"NOTANIDX" + (tmp_path / "ok.idx").read_bytes()[8:])
    (tmp_path / "bad.bin").write_bytes((tmp_path / "ok.bin").read_bytes())
    with pytest.raises(indexed.IndexFileError, match="bad header"):
        indexed.IndexedDataset(tmp_path / "bad")
    (tmp_path / "ok.bin").write_bytes((tmp_path / "ok.bin").read_bytes()[:-2])
    with pytest.raises(indexed.IndexFileError, match="holds 18 bytes but the .idx counts 20"):
        indexed.IndexedDataset(tmp_path / "ok")


def test_building_a_datasets_indices_holds_no_more_than_the_memory_check_counts():
    """The sample index took an int64 copy of the int32 document index and sizes[doc_index] whole: the build held
    twice what check_index_size allows for (a budget between the two was OOM-killed instead of refused)."""
    import tracemalloc

    from tasks.tokenize.blend import index_bytes
    sizes = np.random.default_rng(0).integers(50, 400, size=300_000).astype(np.int32)  # short documents
    seq, tokens = 2048, int(sizes.sum())
    num_samples = 3 * tokens // seq
    _, estimate, _ = index_bytes(["d"], [1.0], {"d": {"tokens": tokens, "documents": len(sizes)}}, num_samples, seq)
    indices.dataset_indices(sizes[:1000], 10, seq, 1)  # numba's compilation, outside the count
    tracemalloc.start()
    try:
        indices.blending_indices(np.array([1.0]), num_samples)
        *_, epochs = indices.dataset_indices(sizes, indices.dataset_samples(1.0, num_samples), seq, 1234)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert epochs == 4 and peak <= 1.05 * estimate, (peak, estimate)
