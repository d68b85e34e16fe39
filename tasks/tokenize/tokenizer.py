"""Byte-level BPE (GPT-2's scheme) through Hugging Face `tokenizers`: trained on the pipeline's own
text, streamed in batches, or loaded from a user's GPT-2 `vocab.json` + `merges.txt` or a
`tokenizer.json`. Every tokenizer here has the end-of-document token `<|endoftext|>`, appended after
each document. Byte-level: any text encodes (characters never seen in training become byte tokens)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tasks.core.errors import InputFileError

EOD = "<|endoftext|>"


class TokenizerFileError(InputFileError):
    """A tokenizer file that cannot serve: missing, unreadable, or without the end-of-document token."""


def _byte_level(tok: Tokenizer) -> Tokenizer:
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def train(batches: Iterable[list[str]], vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    """Train on text arriving in batches (the corpus is never held in memory). The vocabulary holds
    the 256 byte symbols, the end-of-document token and up to vocab_size - 257 merges."""
    if vocab_size < 257:
        raise ValueError(f"vocab_size must be at least 257 (256 bytes + {EOD}), got {vocab_size}")
    tok = _byte_level(Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)

    def texts() -> Iterator[str]:
        for batch in batches:
            yield from batch
    tok.train_from_iterator(texts(), trainer=trainer)
    return tok


def load(path: Path, merges: Path | None = None) -> Tokenizer:
    """A `tokenizer.json`, or GPT-2's `vocab.json` with its `merges.txt`."""
    path = Path(path)
    try:
        if merges is None:
            tok = Tokenizer.from_file(str(path))
        else:
            tok = _byte_level(Tokenizer(models.BPE.from_file(str(path), str(merges))))
    except Exception as exc:  # tokenizers raises its own Exception type with the parser's message
        hint = "; it looks like GPT-2's vocab.json, which needs tokenize.merges_file (merges.txt) beside it" \
            if merges is None and _flat_vocab(path) else ""
        raise TokenizerFileError(f"cannot load tokenizer from {path}{f' + {merges}' if merges else ''}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}{hint}") from None
    if tok.token_to_id(EOD) is None:
        raise TokenizerFileError(f"tokenizer {path} has no end-of-document token {EOD!r}")
    # a tokenizer.json saved after a call with truncation=True or padding keeps it: every document was cut to
    # max_length, short ones padded with pad tokens written as data, and the validation passed
    tok.no_truncation()
    tok.no_padding()
    return tok


def _flat_vocab(path: Path) -> bool:
    """Whether the file is one JSON object of token -> id (GPT-2's vocab.json), not a tokenizer.json."""
    import json
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and bool(data) and all(isinstance(v, int) for v in data.values())


def id_bound(tok: Tokenizer) -> int:
    """One more than the largest token id: what an embedding table and the token dtype must hold. Not
    get_vocab_size(), which counts tokens: a file whose ids have gaps (special tokens placed at the top of a
    padded vocabulary) has ids past it, which a uint16 dataset wrapped (70000 stored as 4464)."""
    return max(tok.get_vocab(with_added_tokens=True).values()) + 1


def eod_id(tok: Tokenizer) -> int:
    return tok.token_to_id(EOD)


# characters per encode_batch call: an Encoding holds ~100 bytes a token (strings, offsets, masks) until the
# call returns, so 1,000 books (~130 M tokens) in one call took ~13 GB; each document is still encoded whole
ENCODE_CHARS = 16 << 20


def encode_documents(tok: Tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The documents' tokens back to back, each followed by the end-of-document token, as (tokens int32,
    per-document lengths int64, which texts they are: bool). A text that encodes to no token is left out,
    as Megatron's preprocess_data leaves it (it would be a lone end-of-document token after another).
    encode_batch calls (parallel in Rust) of up to ENCODE_CHARS characters."""
    eod = eod_id(tok)
    # "<|endoftext|>" written in a document is text, not a document boundary (as GPT-2's BPE reads it)
    tok.encode_special_tokens = True
    ids: list[np.ndarray] = []
    start = 0
    while start < len(texts):
        end, chars = start + 1, len(texts[start])
        while end < len(texts) and chars + len(texts[end]) <= ENCODE_CHARS:
            chars += len(texts[end])
            end += 1
        ids += [np.asarray(e.ids, dtype=np.int32) for e in tok.encode_batch(texts[start:end], add_special_tokens=False)]
        start = end
    kept = np.fromiter((a.size > 0 for a in ids), dtype=bool, count=len(ids))
    ids = [a for a in ids if a.size]
    lengths = np.fromiter((a.size + 1 for a in ids), dtype=np.int64, count=len(ids))
    tokens = np.empty(int(lengths.sum()), dtype=np.int32)
    ends = np.cumsum(lengths)
    for a, end in zip(ids, ends):
        tokens[end - 1 - a.size:end - 1] = a
    tokens[ends - 1] = eod
    return tokens, lengths, kept
