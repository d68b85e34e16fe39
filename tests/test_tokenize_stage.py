"""Stage tokenize end to end on hand-made decontaminated shards: the tokenizer, Megatron datasets that
megatron-core opens, the blend, its samples, the suite, and the bad inputs the issue names."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tasks.core.config import parse_params
from tasks.core.errors import InputFileError
from tasks.core.runner import adopt_outputs, run_stage
from tasks.core.schema import write_docs
from tasks.tokenize import indexed, tokenizer
from tasks.tokenize.blend import BlendedSamples
from tasks.tokenize.pieces import read_manifest
from tasks.validation import validate_stage

WORDS = "the model was trained on web text books code and encyclopedia articles with many tokens".split()


def doc(i: int, dataset: str, text: str) -> dict:
    return {"id": f"{dataset}/{i}", "text": text, "dataset": dataset, "url": "", "crawl": "", "lang": "en",
            "lang_score": 1.0}


def corpus(seed: int = 0) -> list[list[dict]]:
    rng = np.random.default_rng(seed)

    def text(n):
        return " ".join(rng.choice(WORDS, size=n))
    a = [doc(i, "web", text(int(rng.integers(5, 120)))) for i in range(60)]
    a[3]["text"] = "literal <|endoftext|> inside a page, naïve café 東京 🚀"  # text, not a boundary
    a[4]["text"] = text(600)  # longer than a sample
    b = [doc(i, "Wikipedia (en)", text(int(rng.integers(20, 60)))) for i in range(15)]
    c = [doc(i, "books", text(int(rng.integers(200, 300)))) for i in range(5)]
    return [a[:30] + b, a[30:] + c]  # two shards, datasets mixed


def run(tmp_path: Path, shards=None, **tokenize) -> tuple[dict, object]:
    data = tmp_path / "data"
    shutil.rmtree(data, ignore_errors=True)
    (data / "decontaminate/shards").mkdir(parents=True)
    for k, docs in enumerate(corpus() if shards is None else shards):
        write_docs(data / f"decontaminate/shards/s{k}.parquet", docs)
    settings = {"vocab_size": 300, "seq_length": 16, "train_tokens": 12000, "seed": 3,
                "blend": [{"dataset": "web", "weight": 2}, {"dataset": "Wikipedia (en)", "weight": 1},
                          {"dataset": "books", "weight": 1}], **tokenize}
    p = parse_params({"paths": {"data_dir": str(data)}, "tokenize": settings})
    adopt_outputs(p, "decontaminate")
    return run_stage("tokenize", p), p


def test_datasets_open_in_megatron_and_samples_follow_the_blend(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronIndexed
    stats, p = run(tmp_path)
    validate_stage("tokenize", p)
    root = tmp_path / "data/tokenize"
    tok = tokenizer.load(root / "tokenizer/tokenizer.json")
    eod = tokenizer.eod_id(tok)
    manifest = json.loads((root / "datasets/datasets.json").read_text())
    by_dataset = {}
    for docs in corpus():
        for d in docs:
            by_dataset.setdefault(d["dataset"], []).append(d["text"])
    for name, texts in by_dataset.items():
        ds = MegatronIndexed(str(root / "datasets" / manifest["datasets"][name]["prefix"]))
        assert len(ds) == len(texts)
        for i, t in enumerate(texts):  # every document: its tokens, then exactly one end-of-document token
            expected = tok.encode(t, add_special_tokens=False).ids if "<|endoftext|>" not in t else None
            got = ds[i].tolist()
            assert got[-1] == eod and eod not in got[:-1]
            if expected is not None:
                assert got[:-1] == expected
            assert tok.decode(got[:-1]) == t
    assert stats["weights_normalised"] is True and stats["weights_given"] == [2.0, 1.0, 1.0]
    blend = stats["blend"]
    assert blend["web"]["target_share"] == pytest.approx(0.5)
    for row in blend.values():
        assert abs(row["realised_share"] - row["target_share"]) <= 1 / stats["samples"] + 1e-12
    assert blend["books"]["epochs"] > 1  # a small dataset with a large weight is repeated

    samples = BlendedSamples(root / "blend", root / "datasets")
    assert len(samples) == stats["samples"] == 12000 // 16
    streams = {}
    for name, row in blend.items():  # each dataset's epoch-ordered token stream, from its document index
        ds = indexed.IndexedDataset(root / "datasets" / row["prefix"])
        doc_index = np.load(root / "blend" / row["prefix"] / "document_index.npy")
        streams[name] = (np.concatenate([ds[int(d)] for d in doc_index]), doc_index, ds)
    dataset_index = np.load(root / "blend/dataset_index.npy")
    names = stats["blend_order"]
    for k in range(0, len(samples), 7):
        sample = samples[k]
        assert sample.shape == (17,)
        stream, doc_index, ds = streams[names[dataset_index[k]]]
        # the sample is a window of seq_length + 1 consecutive tokens of its dataset's stream
        windows = np.lib.stride_tricks.sliding_window_view(stream, 17)
        assert (windows == sample).all(axis=1).any()


class _Tokenizer:  # what megatron-core's GPTDataset asks of a tokenizer here
    def __init__(self, eod: int, vocab: int):
        self.eod, self.vocab_size, self.unique_identifiers = eod, vocab, {"class": "stage-tokenizer"}


def _megatron_samples(prefixes, weights, seed, seq, samples, eod, vocab, cache, rank, init, queue):
    """One gloo rank (megatron-core's builder wants a process group): its blended GPTDataset's samples."""
    import torch.distributed as dist
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=1)
    config = GPTDatasetConfig(random_seed=seed, sequence_length=seq, split="100,0,0", blend=(prefixes, weights),
                              tokenizer=_Tokenizer(eod, vocab), path_to_cache=cache, reset_position_ids=False,
                              reset_attention_mask=False, eod_mask_loss=False)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [samples, 0, 0], lambda: True, config).build()
    items = [train[k] for k in range(samples)]
    queue.put((rank, np.stack([np.concatenate([x["tokens"].numpy(), x["labels"].numpy()[-1:]]) for x in items])))
    dist.destroy_process_group()


@pytest.mark.parametrize("train_tokens", [12000, 40000])  # books: ~1.5 epochs (its last apart), ~4.9
def test_the_trainer_reads_megatron_cores_samples_in_its_order(tmp_path, train_tokens):
    """megatron-core's BlendedDataset of GPTDatasets over the stage's files, its seed and weights, gives
    the samples BlendedSamples gives, in the same order (its per-dataset sizes, one RandomState(seed)
    per dataset, all epochs shuffled together, a short final epoch apart). Before: 0 of 750 the same,
    and at 1.5 epochs a random half of the second pass was read while other documents were not reread."""
    import functools

    from tests.ranks import run_ranks
    stats, p = run(tmp_path, train_tokens=train_tokens)
    root = tmp_path / "data/tokenize"
    manifest = read_manifest(root / "datasets")
    names = stats["blend_order"]
    prefixes = [str(root / "datasets" / stats["blend"][n]["prefix"]) for n in names]
    target = functools.partial(_megatron_samples, prefixes, stats["weights_given"], p.tokenize.seed,
                               p.tokenize.seq_length, stats["samples"], manifest["eod_id"], manifest["vocab_size"],
                               str(tmp_path / "cache"))
    theirs = run_ranks(target, world_size=1)[0]
    ours = BlendedSamples(root / "blend", root / "datasets")
    assert len(ours) == len(theirs) == stats["samples"]
    assert stats["blend"]["books"]["index_epochs"] == (2 if train_tokens == 12000 else 5)
    for k in range(len(ours)):
        np.testing.assert_array_equal(ours[k], theirs[k], err_msg=f"sample {k}")


def test_the_suite_reads_the_blend_index_it_checks(tmp_path):
    """The blend's shares are counted in its index against params.yaml's weights (blend.json only compared
    with itself: weights bound to the wrong datasets passed), and every index is in bounds (one past a
    dataset's samples passed, to fail as an IndexError mid-training). Mutations from a review."""
    from tasks.validation import ExpectationFailed
    _, p = run(tmp_path)
    blend = tmp_path / "data/tokenize/blend"
    raw = p.model_dump(mode="json")
    raw["tokenize"]["blend"] = [{"dataset": "web", "weight": 1}, {"dataset": "Wikipedia (en)", "weight": 2},
                                {"dataset": "books", "weight": 1}]
    with pytest.raises(ExpectationFailed, match="share_off_target"):
        validate_stage("tokenize", parse_params(raw))
    nth = np.load(blend / "dataset_sample_index.npy")
    nth[5] = 10**6
    np.save(blend / "dataset_sample_index.npy", nth)
    with pytest.raises(ExpectationFailed, match="index_out_of_bounds"):
        validate_stage("tokenize", p)


def test_the_suite_checks_the_document_index_and_fails_an_unreadable_pair(tmp_path):
    """A review: an .idx whose document index megatron-core refuses (half the documents) passed, and a .bin/.idx
    pair that cannot be read crashed the suite (exit 1) instead of failing an expectation (exit 3)."""
    import struct

    from tasks.validation import ExpectationFailed
    _, p = run(tmp_path)
    idx = sorted((tmp_path / "data/tokenize/datasets").rglob("*.idx"))[0]
    raw = bytearray(idx.read_bytes())
    sequences, documents = struct.unpack("<QQ", raw[18:34])
    at = 34 + sequences * 12 + (documents - 1) * 8  # the last document boundary: half way
    raw[at:at + 8] = struct.pack("<q", sequences // 2)
    idx.write_bytes(bytes(raw))
    with pytest.raises(ExpectationFailed, match=r"on column 'document_index_mismatch': 1 unexpected in shard dataset \S+"):
        validate_stage("tokenize", p)
    bin_file = idx.with_suffix(".bin")
    bin_file.write_bytes(bin_file.read_bytes()[:-4])
    with pytest.raises(ExpectationFailed, match="on column 'unreadable_idx': 1 unexpected"):
        validate_stage("tokenize", p)


def test_rerun_resumes_and_a_fresh_run_gives_the_same_bytes(tmp_path):
    _, p = run(tmp_path / "a")
    assert run_stage("tokenize", p)["up_to_date"]
    again = run_stage("tokenize", p, skip_up_to_date=False)
    assert again["resumed_shards"] == 2
    run(tmp_path / "b")
    for sub in ("datasets", "blend", "tokenizer"):
        for f in sorted((tmp_path / "a/data/tokenize" / sub).rglob("*")):
            if f.is_file():
                twin = tmp_path / "b/data/tokenize" / sub / f.relative_to(tmp_path / "a/data/tokenize" / sub)
                assert f.read_bytes() == twin.read_bytes(), f


def test_no_blend_weights_by_tokens_and_zero_weight_leaves_a_dataset_out(tmp_path):
    stats, _ = run(tmp_path, blend=[])
    tokens = {k: v["tokens"] for k, v in stats["datasets"].items()}
    for name, row in stats["blend"].items():
        assert row["target_share"] == pytest.approx(tokens[name] / sum(tokens.values()))
    stats, _ = run(tmp_path, blend=[{"dataset": "web", "weight": 1}, {"dataset": "books", "weight": 0}])
    assert list(stats["blend"]) == ["web"] and stats["left_out"] == ["Wikipedia (en)", "books"]


def test_bad_inputs_name_the_cause(tmp_path):
    from tasks.core.config import ConfigError
    with pytest.raises(ConfigError, match=r"names dataset\(s\) the input does not have: Books3; "
                                             r"datasets: Wikipedia \(en\), books, web"):
        run(tmp_path, blend=[{"dataset": "Books3", "weight": 1}, {"dataset": "web", "weight": 1}])
    with pytest.raises(ConfigError, match="tokenize: every weight of blend is 0"):
        run(tmp_path, blend=[{"dataset": "web", "weight": 0}])
    with pytest.raises(InputFileError, match="the input holds no documents"):
        run(tmp_path, shards=[[], []], blend=[])
    with pytest.raises(ConfigError, match=r"tokenize: train_tokens \(15\) is less than one sample of "
                                          r"seq_length \(16\) tokens"):
        run(tmp_path, train_tokens=15)
    # MT-NLG's budget on this few-thousand-token corpus: millions of epochs, refused before any allocation
    with pytest.raises(ConfigError, match=r"tokenize.train_tokens \(270,000,000,000\) needs blend indices of "
                                          r"[\d,.]+ GiB, more than the [\d,.]+ GiB of free memory: .*most "
                                          r"repeated: 'Wikipedia \(en\)', [\d,]+ epochs of [\d,]+ tokens\): lower train_tokens"):
        run(tmp_path, train_tokens=270_000_000_000)
    with pytest.raises(ConfigError, match="blend names a dataset twice: web"):
        parse_params({"tokenize": {"blend": [{"dataset": "web", "weight": 1}, {"dataset": "web", "weight": 2}]}})
    with pytest.raises(ConfigError, match="tokenize.blend.0.weight: Input should be greater than or equal to 0"):
        parse_params({"tokenize": {"blend": [{"dataset": "web", "weight": -1}]}})


def test_empty_documents_are_left_out_and_a_blend_naming_only_them_is_one_line(tmp_path):
    """A document that encodes to no token is left out, as Megatron's preprocess_data leaves it (it was a lone
    end-of-document token after the one before: EOD EOD in the training data); a dataset of such documents
    only is not there, and a blend naming it is refused in one line (it was a ValueError, exit 1)."""
    from tasks.core.config import ConfigError
    shards = corpus()
    shards[0].insert(5, doc(0, "tiny", ""))
    shards[0].insert(9, doc(1, "web", ""))
    stats, p = run(tmp_path, shards=shards, blend=[])
    assert "tiny" not in stats["blend"] and stats["dropped"]["no_tokens"] == 2
    manifest = read_manifest(Path(p.paths.data_dir) / "tokenize/datasets")
    assert "tiny" not in manifest["datasets"] and manifest["datasets"]["web"]["documents"] == 60
    eod = tokenizer.eod_id(tokenizer.load(Path(p.paths.data_dir) / "tokenize/tokenizer/tokenizer.json"))
    web = indexed.IndexedDataset(Path(p.paths.data_dir) / "tokenize/datasets" / manifest["datasets"]["web"]["prefix"])
    assert all(len(web[i]) > 1 and web[i][-1] == eod for i in range(len(web)))
    with pytest.raises(ConfigError, match=r"tokenize.blend names dataset\(s\) the input does not have: tiny;"):
        run(tmp_path, shards=shards, blend=[{"dataset": "web", "weight": 1}, {"dataset": "tiny", "weight": 1}])


def test_the_index_size_estimate_bounds_the_files_written(tmp_path):
    from tasks.tokenize.blend import index_bytes
    _, p = run(tmp_path)
    blend_dir = Path(p.paths.data_dir) / "tokenize/blend"
    report = json.loads((blend_dir / "blend.json").read_text())
    manifest = read_manifest(Path(p.paths.data_dir) / "tokenize/datasets")
    names = report["order"]
    weights = [report["datasets"][n]["target_share"] for n in names]
    total, _, _ = index_bytes(names, weights, manifest["datasets"], report["samples"], 16)
    written = sum(np.load(f, mmap_mode="r").nbytes for f in blend_dir.rglob("*.npy"))
    assert written <= total <= 2 * written + 4096


def test_a_users_tokenizer_file_is_used_as_is(tmp_path):
    tok = tokenizer.train(iter([["some text to learn a few merges from"] * 5]), vocab_size=280)
    tok.save(str(tmp_path / "user.json"))
    stats, _ = run(tmp_path, tokenizer_file=str(tmp_path / "user.json"))
    assert stats["source"] == "file" and stats["vocab_size"] == tok.get_vocab_size()
    # saved after a call with truncation and padding (as Hugging Face files often are): documents were cut to
    # max_length and short ones padded, pad tokens written as data, and the suite passed
    tok.enable_truncation(max_length=8)
    tok.enable_padding(pad_id=0, pad_token="!")
    tok.save(str(tmp_path / "user.json"))
    _, p = run(tmp_path, tokenizer_file=str(tmp_path / "user.json"))
    datasets = tmp_path / "data/tokenize/datasets"
    web = indexed.IndexedDataset(datasets / read_manifest(datasets)["datasets"]["web"]["prefix"])
    texts = [d["text"] for d in corpus()[0] + corpus()[1] if d["dataset"] == "web"]
    plain = tokenizer.train(iter([["some text to learn a few merges from"] * 5]), vocab_size=280)
    assert [len(web[i]) for i in range(3)] == [len(plain.encode(t, add_special_tokens=False).ids) + 1 for t in texts[:3]]
    with pytest.raises(tokenizer.TokenizerFileError, match="cannot load tokenizer from .*nothere.json"):
        run(tmp_path, tokenizer_file=str(tmp_path / "nothere.json"))


def test_common_crawl_is_blended_per_snapshot_and_the_mtnlg_profile_names_what_is_missing(tmp_path):
    shards = corpus()
    for i, d in enumerate(shards[0][:20]):
        d.update(dataset="common-crawl", crawl="CC-MAIN-2020-50" if i % 2 else "CC-MAIN-2021-04")
    shards[0][20].update(dataset="common-crawl", crawl="")  # no snapshot: stays common-crawl
    stats, _ = run(tmp_path, shards=shards, blend=[])
    assert {"CC-2020-50", "CC-2021-04", "common-crawl"} <= set(stats["datasets"])
    assert stats["datasets"]["CC-2020-50"]["documents"] == 10
    from tasks.core.config import ConfigError
    with pytest.raises(ConfigError, match=r"\(profile mt-nlg\) names dataset\(s\) the input does not have: "
                                          r"Books3, OpenWebText2, StackExchange"):
        run(tmp_path, shards=shards, blend=[], profile="mt-nlg")
    with pytest.raises(ConfigError, match="profile mt-nlg carries its own weights: leave blend empty"):
        parse_params({"tokenize": {"profile": "mt-nlg", "blend": [{"dataset": "web", "weight": 1}]}})
