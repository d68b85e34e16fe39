"""Byte-level BPE: trained on streamed text, saved and loaded in both formats users bring."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tasks.tokenize import tokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Language models are trained on hundreds of billions of tokens.",
    "Megatron-Turing NLG used 270 billion tokens from 15 datasets.",
    "def f(x):\n    return x * 2  # code, with indentation\n",
] * 20


def batches(texts, size=7):
    for i in range(0, len(texts), size):
        yield texts[i:i + size]


def test_trained_tokenizer_round_trips_any_text_and_ends_documents():
    tok = tokenizer.train(batches(CORPUS), vocab_size=400)
    assert 257 < tok.get_vocab_size() <= 400
    unseen = ["naïve café — 東京 🚀", "", "\x00 control \u200b zero-width", "The quick brown fox"]
    tokens, lengths, kept = tokenizer.encode_documents(tok, unseen)
    assert kept.tolist() == [True, False, True, True]  # "" is left out, as Megatron's preprocess_data does
    unseen = [t for t in unseen if t]
    assert lengths.tolist() == [len(tok.encode(t, add_special_tokens=False).ids) + 1 for t in unseen]
    ends = np.cumsum(lengths)
    assert (tokens[ends - 1] == tokenizer.eod_id(tok)).all()
    assert (tokens < tok.get_vocab_size()).all()
    for text, start, end in zip(unseen, ends - lengths, ends):
        assert tok.decode(tokens[start:end - 1].tolist()) == text  # characters never seen: byte tokens
    common = tok.encode("The quick brown fox", add_special_tokens=False).ids
    assert len(common) < len("The quick brown fox")  # merges learned from the corpus


def test_training_is_deterministic():
    a = tokenizer.train(batches(CORPUS), vocab_size=350).to_str()
    b = tokenizer.train(batches(CORPUS, size=3), vocab_size=350).to_str()
    assert a == b


def test_saved_tokenizer_json_and_gpt2_files_load_to_the_same_encoder(tmp_path):
    tok = tokenizer.train(batches(CORPUS), vocab_size=380)
    tok.save(str(tmp_path / "tokenizer.json"))
    tok.model.save(str(tmp_path))  # GPT-2 layout: vocab.json + merges.txt
    a = tokenizer.load(tmp_path / "tokenizer.json")
    b = tokenizer.load(tmp_path / "vocab.json", tmp_path / "merges.txt")
    text = "Megatron-Turing NLG used 270 billion tokens, naïvely 🚀"
    expected = tok.encode(text, add_special_tokens=False).ids
    assert a.encode(text, add_special_tokens=False).ids == expected
    assert b.encode(text, add_special_tokens=False).ids == expected
    assert tokenizer.eod_id(a) == tokenizer.eod_id(b) == tok.token_to_id(tokenizer.EOD)


def test_bad_tokenizer_files_name_the_cause(tmp_path):
    with pytest.raises(tokenizer.TokenizerFileError, match="cannot load tokenizer from .*missing.json"):
        tokenizer.load(tmp_path / "missing.json")
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    with pytest.raises(tokenizer.TokenizerFileError, match=r"has no end-of-document token '<\|endoftext\|>'"):
        tokenizer.load(tmp_path / "vocab.json", tmp_path / "merges.txt")
    with pytest.raises(ValueError, match="vocab_size must be at least 257"):
        tokenizer.train(batches(CORPUS), vocab_size=100)


def test_vocab_json_without_its_merges_file_says_so(tmp_path):
    """GPT-2's vocab.json given as tokenizer_file, merges_file forgotten: the parser's `expected , or }` read as a
    broken JSON file."""
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2, tokenizer.EOD: 3}))
    with pytest.raises(tokenizer.TokenizerFileError, match=r"vocab.json: .*it looks like GPT-2's vocab.json, which "
                                                           r"needs tokenize.merges_file"):
        tokenizer.load(tmp_path / "vocab.json")


def test_ids_past_the_token_count_size_the_vocabulary_and_the_dtype(tmp_path):
    """Special tokens placed at the top of a padded vocabulary leave gaps: get_vocab_size() counts tokens, so a
    uint16 dataset was chosen and id 70000 was stored as 4464, and the model's vocabulary came out too small."""
    from tasks.tokenize import indexed
    d = json.loads(tokenizer.train(batches(CORPUS), vocab_size=300).to_str())
    for added in d["added_tokens"]:
        if added["content"] == tokenizer.EOD:
            added["id"] = 70000
    d["model"]["vocab"][tokenizer.EOD] = 70000
    (tmp_path / "gapped.json").write_text(json.dumps(d))
    tok = tokenizer.load(tmp_path / "gapped.json")
    assert tokenizer.eod_id(tok) == 70000 and tok.get_vocab_size() <= 300 and tokenizer.id_bound(tok) == 70001
    tokens, lengths, _ = tokenizer.encode_documents(tok, ["hello world"])
    with indexed.IndexedWriter(tmp_path / "ds", indexed.token_dtype(tokenizer.id_bound(tok))) as w:
        w.add_flat(tokens, lengths)
    assert indexed.IndexedDataset(tmp_path / "ds")[0].tolist() == tokens.tolist()


def test_empty_corpus_trains_the_byte_alphabet():
    tok = tokenizer.train(iter([]), vocab_size=1000)
    assert tok.get_vocab_size() == 257
    tokens, lengths, _ = tokenizer.encode_documents(tok, ["abc"])
    assert lengths.tolist() == [4] and tok.decode(tokens[:3].tolist()) == "abc"


def test_documents_are_encoded_in_calls_of_bounded_characters_with_the_same_tokens(monkeypatch):
    """encode_batch holds ~100 bytes a token until it returns: 1,000 books in one call took ~13 GB. The calls
    are cut at ENCODE_CHARS characters (a longer document alone), and give the tokens one call gives."""
    tok = tokenizer.train(batches(CORPUS), vocab_size=400)
    texts = [t * k for k, t in enumerate(CORPUS[:40], 1)]
    whole = tokenizer.encode_documents(tok, texts)

    class Counting:  # the tokenizer, with each encode_batch call's characters recorded
        def __init__(self):
            object.__setattr__(self, "calls", [])

        def __getattr__(self, name):
            return getattr(tok, name)

        def __setattr__(self, name, value):
            setattr(tok, name, value)

        def encode_batch(self, batch, **kw):
            self.calls.append((sum(map(len, batch)), len(batch)))
            return tok.encode_batch(batch, **kw)
    monkeypatch.setattr(tokenizer, "ENCODE_CHARS", 2000)
    counting = Counting()
    cut = tokenizer.encode_documents(counting, texts)
    assert len(counting.calls) > 5 and sum(c for c, _ in counting.calls) == sum(map(len, texts))
    assert all(chars <= 2000 or docs == 1 for chars, docs in counting.calls), counting.calls
    for a, b in zip(whole, cut):
        assert np.array_equal(a, b)


def test_the_tokenizer_learns_from_text_whose_long_runs_are_broken():
    """BPE training rescans a pre-token on every merge, so one 400,000-letter run (a DNA sequence, base64)
    took it from 0.3 s to 48 s: the text it trains on is broken every 256 non-space characters."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tempfile
    from tasks.tokenize.stage import _text_batches
    run = "ACGT" * 100_000
    with tempfile.TemporaryDirectory() as d:
        pq.write_table(pa.table({"text": ["a short page", f"sequence {run} end"]}), f"{d}/s.parquet")
        texts = [t for batch in _text_batches([Path(d) / "s.parquet"], 1000, 0) for t in batch]
    assert texts[0] == "a short page" and texts[1].replace(" ", "") == f"sequence{run}end"
    assert max(map(len, texts[1].split())) == 256
