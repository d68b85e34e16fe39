"""LSH bands as datasketch derives them; band keys; components against scipy; MT-NLG's priority rule."""
from __future__ import annotations

import numpy as np
import pytest
from datasketch.lsh import _optimal_param
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from tasks.dedup.components import components, representatives
from tasks.dedup.lsh import band_keys, optimal_bands
from tasks.dedup.minhash import signatures


@pytest.mark.parametrize("threshold,num_perm", [(0.8, 128), (0.9, 128), (0.5, 64), (0.7, 256)])
def test_bands_and_rows_are_datasketchs(threshold, num_perm):
    assert optimal_bands(threshold, num_perm) == _optimal_param(threshold, num_perm, 0.5, 0.5)


def test_bands_that_miss_pairs_at_the_threshold_are_named_with_a_choice_that_finds_them():
    """20 x 6 suits 0.8; with threshold 0.5 alone changed it found 36% of the pairs at 0.52, without a word."""
    from tasks.core.config import parse_params
    from tasks.dedup.lsh import candidate_probability
    from tasks.dedup.stage import warnings
    assert warnings({}, parse_params({})) == []  # 20 x 6 at 0.8: 99.8%
    (said,) = warnings({}, parse_params({"dedup": {"threshold": 0.5}}))
    assert said == ("dedup: 20 bands x 6 rows find a pair at the threshold 0.5 with probability 27%: 73% of such "
                    "near-duplicates are never compared; bands: 42, rows: 3 find 99%")
    assert candidate_probability(0.5, 42, 3) >= 0.99 > candidate_probability(0.5, 32, 4)
    # sampled: pairs at the threshold share a band about as often as the formula says
    rng = np.random.default_rng(0)
    sig = rng.integers(0, 2**32, size=(2, 4000, 126), dtype=np.uint64)
    sig[1] = np.where(rng.random((4000, 126)) < 0.5, sig[0], sig[1])  # each value equal with chance 0.5
    keys = [band_keys(s, 42, 3) for s in sig]
    assert abs((keys[0] == keys[1]).any(axis=1).mean() - candidate_probability(0.5, 42, 3)) < 0.01


def test_band_keys_collide_exactly_on_equal_bands():
    docs = ["the quick brown fox jumps over the lazy dog " * 5, "the quick brown fox jumps over the lazy dog " * 5,
            "the quick brown fox jumps over the lazy cat " * 5, "something else entirely, nothing alike at all here"]
    sig = signatures(docs, num_perm=128)
    keys = band_keys(sig, 16, 8)
    assert keys.shape == (4, 16) and (keys[0] == keys[1]).all() and not (keys[0] == keys[3]).any()
    for band in range(16):  # a key is equal exactly when the band's values are
        same = (sig[0, band * 8:(band + 1) * 8] == sig[2, band * 8:(band + 1) * 8]).all()
        assert same == (keys[0, band] == keys[2, band])
    assert len(set(band_keys(np.zeros((1, 128), np.uint32), 16, 8)[0])) == 16  # the band index is mixed in
    with pytest.raises(ValueError, match="need 136 permutations"):
        band_keys(sig, 17, 8)


@pytest.mark.parametrize("seed", range(5))
def test_components_match_scipy(seed):
    rng = np.random.default_rng(seed)
    n = 2000
    edges = rng.integers(0, n, size=(rng.integers(0, 2500), 2))
    labels = components(n, edges)
    graph = coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    count, ref = connected_components(graph, directed=False)
    assert len(np.unique(labels)) == count
    pairs = {(a, b) for a, b in zip(labels, ref)}
    assert len(pairs) == count  # the same partition
    assert all(labels[i] <= i for i in range(n)) and (labels[labels] == labels).all()  # label = smallest member


def test_a_long_chain_and_no_edges():
    n = 100_000
    chain = np.stack([np.arange(n - 1), np.arange(1, n)], axis=1)[::-1]
    assert (components(n, chain) == 0).all()
    assert (components(5, np.empty((0, 2), np.int64)) == np.arange(5)).all()


def test_the_highest_priority_dataset_keeps_its_copy_then_the_first_in_the_input():
    labels = np.array([0, 0, 0, 3, 3, 5, 6, 6])
    priority = np.array([2, 0, 0, 1, 1, 0, 0, 0])  # 0 = highest quality
    keep = representatives(labels, priority)  # nodes in the input's order: shards by name, then rows
    assert keep.tolist() == [1, 1, 1, 3, 3, 5, 6, 6]


@pytest.mark.parametrize("order", [(0, 1, 2), (0, 2, 1), (2, 0, 1), (1, 0, 2)])
def test_a_bucket_links_every_verified_pair_whatever_the_order(order):
    """A={0..99}, B={20..119}, C={0..119}: J(A,C) = J(B,C) = 0.83 >= 0.8 > J(A,B) = 0.67. Comparing a
    member only with the first match (or only with unmatched members) leaves B or A apart from C."""
    from tasks.dedup.graph import _link
    from tasks.dedup.minhash import shingle_sets

    sets = [np.arange(0, 100), np.arange(20, 120), np.arange(0, 120)]
    hashes = np.concatenate([sets[i] for i in order]).astype(np.uint32)
    offsets = np.cumsum([0] + [len(sets[i]) for i in order]).astype(np.int64)
    s, off = shingle_sets(hashes, offsets)
    edges, checked, rejected = _link(3, np.arange(3), np.array([0, 3]), np.arange(3), s, off, 0.8, 256, True)
    assert len(set(components(3, edges).tolist())) == 1 and rejected <= 1  # A-B only if checked before C joins them
    edges, _, _ = _link(3, np.arange(3), np.array([0, 3]), np.arange(3), s, off, 0.8, 1, True)
    assert len(set(components(3, edges).tolist())) < 3  # one centre: the first member's matches only


def test_a_pair_rejected_in_one_band_is_not_checked_again_in_the_next():
    """A pair below the threshold shares many bands (templated pages): each band checked it again, 2.4 checks
    per distinct pair and ~60% of the components pass on 3,040 templated pages."""
    from tasks.dedup.graph import _link
    from tasks.dedup.minhash import shingle_sets
    sets = [np.arange(0, 100), np.arange(50, 150), np.arange(1000, 1100)]  # J(A,B) = 0.33, C apart
    s, off = shingle_sets(np.concatenate(sets).astype(np.uint32), np.cumsum([0, 100, 100, 100]).astype(np.int64))
    bands = 20  # the pair A-B in each of 20 bands' buckets, C with A in every other one
    members = np.concatenate([[0, 1] if b % 2 else [0, 1, 2] for b in range(bands)])
    starts = np.cumsum([0] + [2 if b % 2 else 3 for b in range(bands)])
    edges, checked, rejected = _link(3, members, starts, np.arange(3), s, off, 0.8, 256, True)
    assert len(edges) == 0 and (checked, rejected) == (3, 3)  # A-B, A-C, B-C once each
