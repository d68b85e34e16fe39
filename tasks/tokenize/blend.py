"""Pass `blend` (global) of stage tokenize: MT-NLG's weighted blend as Megatron's BlendedDataset.

Weights are given per dataset (params `tokenize.blend`, normalised to sum 1 and reported when they
did not), the token budget `train_tokens` gives train_tokens // seq_length samples, and each dataset's
epochs follow. Per dataset, as megatron-core's GPTDataset builds them for the same seed (sized for its
share plus 0.5%, as megatron-core's blend builder sizes them): a document index (all epochs shuffled
together, a short final epoch apart and last), a sample index (seq_length + 1 tokens per sample,
crossing document boundaries) and a shuffle index; then the blend index: which dataset and which of
its samples each training sample is, chosen as megatron-core's BlendedDataset chooses (the weights
normalised again, as it does). The same files and seed give megatron-core's samples, in its order.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import psutil

from tasks.core.config import PipelineParams
from tasks.core.errors import ConfigError, InputFileError
from tasks.core.stage import Context
from tasks.tokenize import indexed, indices
from tasks.tokenize.pieces import read_manifest

REPORT = "blend.json"
# MT-NLG's 15 datasets and weights in % (Smith et al. 2022, table 2), named as the documents' `dataset`
# column names them: the Pile's pile_set_name, Common Crawl by snapshot, and the two added datasets.
MTNLG_BLEND = (("Books3", 14.3), ("OpenWebText2", 19.3), ("StackExchange", 5.7), ("PubMed Abstracts", 2.9),
               ("Wikipedia (en)", 4.8), ("Gutenberg (PG-19)", 0.9), ("BookCorpus2", 1.0), ("NIH ExPorter", 0.2),
               ("Pile-CC", 9.4), ("ArXiv", 1.4), ("Github", 1.6), ("CC-2020-50", 13.0), ("CC-2021-04", 15.7),
               ("RealNews", 9.0), ("CC-Stories", 0.9))


def resolve_weights(p: PipelineParams, datasets: dict) -> tuple[list[str], np.ndarray, dict]:
    """(names, normalised weights, notes). Named datasets must exist and hold tokens; no blend given:
    every dataset by its share of the tokens."""
    t = p.tokenize
    if not datasets or not any(d["tokens"] >= indices.MIN_TOKENS for d in datasets.values()):
        raise InputFileError("tokenize: the input holds no documents: nothing to blend")
    entries = list(MTNLG_BLEND) if t.profile == "mt-nlg" else [(b.dataset, b.weight) for b in t.blend]
    if entries:
        where = f"tokenize.blend{' (profile mt-nlg)' if t.profile == 'mt-nlg' else ''}"
        missing = [name for name, _ in entries if name not in datasets or not datasets[name]["tokens"]]
        if missing:  # (a dataset whose documents are all empty is not there: they encode to no token)
            raise ConfigError(f"{where} names dataset(s) the input does not have: {', '.join(missing)}; "
                              f"datasets: {', '.join(sorted(datasets))}")
        chosen = [(name, float(w)) for name, w in entries if w > 0]  # one at least (TokenizeParams)
        named = {name for name, _ in entries}
        left_out = sorted(set(datasets) - named) + [name for name, w in entries if w == 0]
    else:
        chosen = [(name, float(d["tokens"])) for name, d in sorted(datasets.items())
                  if d["tokens"] >= indices.MIN_TOKENS]
        left_out = [name for name, d in sorted(datasets.items()) if d["tokens"] < indices.MIN_TOKENS]
    names = [n for n, _ in chosen]
    raw = np.array([w for _, w in chosen], dtype=np.float64)
    weights = indices.normalise_weights(raw)
    notes = {"weights_normalised": bool(abs(raw.sum() - 1.0) > 1e-9), "weights_given": raw.tolist(),
             "left_out": left_out}
    return names, weights, notes


def build_blend(tmp: Path, p: PipelineParams, ctx: Context) -> dict:
    t = p.tokenize
    datasets_dir = ctx.pass_dir("datasets")
    manifest = read_manifest(datasets_dir)
    names, weights, notes = resolve_weights(p, manifest["datasets"])
    num_samples = t.train_tokens // t.seq_length  # one at least (TokenizeParams)
    check_index_size(tmp, p, names, weights, manifest["datasets"], num_samples)
    # megatron-core's BlendedDataset normalises the builder's normalised weights again (the last bits
    # can differ, and with them a tie of the greedy choice)
    dataset_index, dataset_sample_index = indices.blending_indices(indices.normalise_weights(weights), num_samples)
    counts = np.bincount(dataset_index, minlength=len(names))
    rows = {}
    for i, name in enumerate(names):
        info = manifest["datasets"][name]
        ds = indexed.IndexedDataset(datasets_dir / info["prefix"])
        doc_index, sample_index, shuffle, epochs = indices.dataset_indices(
            ds.lengths, indices.dataset_samples(weights[i], num_samples), t.seq_length, t.seed)
        out = tmp / info["prefix"]
        out.mkdir()
        np.save(out / "document_index.npy", doc_index)
        np.save(out / "sample_index.npy", sample_index)
        np.save(out / "shuffle_index.npy", shuffle)
        rows[name] = {"prefix": info["prefix"], "target_share": float(weights[i]),
                      "realised_share": float(counts[i] / num_samples), "samples": int(counts[i]),
                      "epochs": float(counts[i]) * t.seq_length / info["tokens"], "index_epochs": epochs,
                      "tokens": info["tokens"], "documents": info["documents"]}
    np.save(tmp / "dataset_index.npy", dataset_index)
    np.save(tmp / "dataset_sample_index.npy", dataset_sample_index)
    # "order": the dataset numbers of dataset_index (JSON objects are written with sorted keys)
    report = {"samples": num_samples, "seq_length": t.seq_length, "train_tokens": t.train_tokens,
              "datasets": rows, "order": names, **notes}
    (tmp / REPORT).write_text(json.dumps(report, indent=1, sort_keys=True), encoding="utf-8")
    return {"blend": rows, "blend_order": names, "samples": num_samples, **notes}


def index_bytes(names, weights, datasets: dict, num_samples: int, seq_length: int) -> tuple[int, int, str]:
    """(bytes of every index file, bytes held at once while building, the dataset needing the most
    epochs): the blend's two arrays plus, per dataset, its document, sample and shuffle indices, as
    build_blend sizes them (a dataset is built for its share plus 0.5%, at least one epoch)."""
    blend = num_samples * (2 + 8)
    total, peak, worst, most = blend, 0, "", -1
    for name, w in zip(names, weights):
        info = datasets[name]
        epochs = indices.dataset_epochs(indices.dataset_samples(w, num_samples), info["tokens"], seq_length)
        rows = epochs * info["tokens"] // seq_length + 2
        size = 4 * info["documents"] * epochs + 16 * rows + 8 * rows
        total += size
        # a short final epoch is concatenated to the others (two copies at once); the sizes as int64
        peak = max(peak, size + 4 * info["documents"] * epochs + 8 * info["documents"])
        if epochs > most:
            worst, most = f"'{name}', {epochs:,} epochs of {info['tokens']:,} tokens", epochs
    return total, blend + peak, worst


def check_index_size(tmp: Path, p: PipelineParams, names, weights, datasets: dict, num_samples: int) -> None:
    """Refuse, before allocating, a token budget whose indices do not fit this machine's free memory or
    disk: a budget meant for a larger corpus otherwise ends in a MemoryError or a full disk."""
    total, peak, worst = index_bytes(names, weights, datasets, num_samples, p.tokenize.seq_length)
    memory, disk = psutil.virtual_memory().available, shutil.disk_usage(tmp).free
    for need, free, where in ((peak, memory, "free memory"), (total, disk, f"free disk at {tmp.parent}")):
        if need > free:
            raise ConfigError(f"tokenize.train_tokens ({p.tokenize.train_tokens:,}) needs blend indices of "
                              f"{need / 2**30:,.1f} GiB, more than the {free / 2**30:,.1f} GiB of {where}: the "
                              f"input is too small for this budget (most repeated: {worst}): lower train_tokens "
                              f"or add data")


class BlendedSamples:
    """The trainer's view of a finished blend: `len()` samples, `[k]` the k-th sample's seq_length + 1
    tokens (int64), read from the memory-mapped datasets; `seq_len` and `vocab_size` are what it was
    made with (the trainer checks them against the model)."""

    def __init__(self, blend_dir: Path, datasets_dir: Path):
        self.report = json.loads((Path(blend_dir) / REPORT).read_text(encoding="utf-8"))
        self.seq_len = int(self.report["seq_length"])
        self.vocab_size = int(read_manifest(Path(datasets_dir))["vocab_size"])
        self.names = self.report["order"]
        self.dataset_index = np.load(Path(blend_dir) / "dataset_index.npy", mmap_mode="r")
        self.dataset_sample_index = np.load(Path(blend_dir) / "dataset_sample_index.npy", mmap_mode="r")
        self.parts = []
        for name in self.names:
            prefix = self.report["datasets"][name]["prefix"]
            self.parts.append((indexed.IndexedDataset(Path(datasets_dir) / prefix),
                               *(np.load(Path(blend_dir) / prefix / f"{k}.npy", mmap_mode="r")
                                 for k in ("document_index", "sample_index", "shuffle_index"))))

    def __len__(self) -> int:
        return int(self.dataset_index.shape[0])

    def __getitem__(self, k: int) -> np.ndarray:
        ds, doc_index, sample_index, shuffle = self.parts[int(self.dataset_index[k])]
        s = int(shuffle[int(self.dataset_sample_index[k])])
        (p0, o0), (p1, o1) = sample_index[s], sample_index[s + 1]
        if p0 == p1:
            return ds.slice(int(doc_index[p0]), int(o0), int(o1 - o0 + 1)).astype(np.int64)
        pieces = [ds.slice(int(doc_index[p0]), int(o0), int(ds.lengths[doc_index[p0]]) - int(o0))]
        pieces += [ds[int(doc_index[q])] for q in range(p0 + 1, p1)]
        pieces.append(ds.slice(int(doc_index[p1]), 0, int(o1) + 1))
        return np.concatenate(pieces).astype(np.int64)
