"""Pass 1 of dedup (sharded, one per input shard): per document its id, dataset, exact key (a 64-bit
hash of the normalised word sequence), MinHash signature and, for verification, its shingles (hashes in
document order; the components pass makes sets of the candidates' only). Signatures are stored
permutation-major, so a band's values are one contiguous run of the file.
Later passes address documents by a global index: the input shards in name order, rows in order."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tasks.core.config import PipelineParams
from tasks.core.errors import ConfigError
from tasks.core.passes import Shard, ShardStats, savez
from tasks.core.schema import iter_batches, text_bytes
from tasks.core.stage import Context, input_files, shard_per_file
from tasks.decontaminate.ngram_index import B, _fmix
from tasks.dedup.fused import sign_words
from tasks.dedup.minhash import _unit_hashes, shingle_hashes, signatures_of


def plan_signatures(p: PipelineParams, ctx: Context) -> list[Shard]:
    return shard_per_file(input_files(ctx), ".npz")


def exact_keys(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(64-bit key of each document's normalised word sequence, whether it has any word): a
    polynomial in the words' 64-bit hashes, position-weighted, finalised with the word count."""
    h64, doc = _unit_hashes(texts, "word")
    words = np.bincount(doc, minlength=len(texts)) if len(doc) else np.zeros(len(texts), np.int64)
    keys = np.zeros(len(texts), dtype=np.uint64)
    has = words > 0
    if has.any():
        first = np.concatenate([[0], np.cumsum(words)[:-1]])
        pos = np.arange(len(h64)) - first[doc]
        with np.errstate(over="ignore"):
            powers = np.cumprod(np.full(int(words.max()), B, dtype=np.uint64), dtype=np.uint64)
            sums = np.add.reduceat(h64 * powers[pos], first[has])
            keys[has] = _fmix(sums * B + words[has].astype(np.uint64))
    return keys, has


def use_gpu(device: str) -> bool:
    if device == "cpu":
        return False
    from tasks.dedup.gpu import available

    if device == "gpu" and not available():
        raise ConfigError("dedup.device is gpu but no CUDA GPU with CuPy is usable here")
    return available()


def sign_shard(shard: Shard, tmp: Path, p: PipelineParams, ctx: Context) -> ShardStats:
    d, st = p.dedup, ShardStats()
    gpu = use_gpu(d.device)
    ids, names, codes, keys, has, sigs, sets, set_lens = [], {}, [], [], [], [], [], []
    for batch in iter_batches(Path(shard.inputs[0]), ["id", "text", "dataset"], d.batch_docs):
        texts = batch.column("text").to_pylist()
        st.docs_in += len(texts)
        st.bytes_in += text_bytes(batch)
        ids += batch.column("id").to_pylist()
        codes += [names.setdefault(x, len(names)) for x in batch.column("dataset").to_pylist()]
        if d.shingle == "word":  # on a GPU, the CPU pass only hashes the shingles (0 permutations)
            sig, k, words, s, so = sign_words(texts, d.ngram, 0 if gpu else d.num_perm, d.seed)
            h = words > 0
        else:
            k, h = exact_keys(texts)
            s, so = shingle_hashes(texts, d.ngram, d.shingle)
            sig = None if gpu else signatures_of(s, so, d.num_perm, d.seed)
        if gpu:
            from tasks.dedup.gpu import signatures_gpu

            sig = signatures_gpu(s, so, d.num_perm, d.seed)
        keys.append(k)
        has.append(h)
        sigs.append(sig)
        if d.verify:
            sets.append(s)
            set_lens.append(np.diff(so))
    n = len(ids)
    has_words = np.concatenate(has) if has else np.zeros(0, bool)
    lens = np.concatenate(set_lens) if set_lens else np.zeros(n if d.verify else 0, np.int64)
    with open(tmp, "wb") as fh:
        savez(fh, ids=np.array([x.encode("utf-8") for x in ids], dtype=bytes) if ids else np.zeros(0, "S1"),
                 datasets=np.array(json.dumps(list(names))), codes=np.asarray(codes, dtype=np.int32),
                 exact=np.concatenate(keys) if keys else np.zeros(0, np.uint64), has_words=has_words,
                 # permutation-major on disk (the same [docs, num_perm] array to np.load): a band's
                 # columns are contiguous, so each bucket shard maps its bands' bytes only
                 sig=np.asfortranarray(np.concatenate(sigs) if sigs else np.zeros((0, d.num_perm), np.uint32)),
                 shingles=np.concatenate(sets) if sets else np.zeros(0, np.uint32),
                 shingle_offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
    st.docs_out = n
    st.extra = {"docs_without_words": int(n - has_words.sum())}
    return st


def signature_files(ctx: Context) -> list[Path]:
    return sorted((ctx.pass_dir("signatures") / "shards").glob("*.npz"))


def read(f: Path, *keys: str) -> list[np.ndarray]:
    with np.load(f) as z:
        return [z[k] for k in keys]


def shard_datasets(f: Path) -> list[str]:
    with np.load(f) as z:
        return json.loads(str(z["datasets"]))
