"""Decontamination: GPT-3 App. C behaviour on small hand-built corpora, and the real nine tasks."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import tasks.decontaminate.ngram_index as ni
from tasks.core.config import ConfigError, parse_params
from tasks.evalsets.loaders import TaskFileError
from tasks.core.schema import write_docs
from tasks.core.runner import adopt_outputs, run_stage
from tasks.validation import ExpectationFailed, validate_stage
from tests.conftest import copy_stages

PASSAGE = ("the lighthouse keeper counted every ship that passed the rocky northern cape during the "
           "long winter storms of that year")  # 20 words: 8 thirteen-grams
SHORT = "Which river did the old ferry cross at dawn"  # 9 words: whole-length entry
TOO_SHORT = "The president advised the judges"  # 5 words: never an entry
FILLER = ("Farmers in the valley planted barley and oats after the rains, and the market in town "
          "sold bread, cheese and apples every Saturday morning. ")


@pytest.fixture
def bench(tmp_path) -> Path:
    """A tiny benchmarks folder: LAMBADA and HANS files in their official formats (with a BOM)."""
    root = tmp_path / "bench"
    (root / "lambada").mkdir(parents=True)
    (root / "lambada/lambada_test.jsonl").write_text(
        "\ufeff" + json.dumps({"text": PASSAGE}) + "\n\n" + json.dumps({"text": "a b c d e f g h i j k l m n"}) + "\n")
    (root / "hans").mkdir()
    header = "gold_label\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\t" \
             "sentence1\tsentence2\tpairID\theuristic\tsubcase\ttemplate\n"
    (root / "hans/heuristics_evaluation_set.txt").write_text(
        header + f"entailment\t\t\t\t\t{SHORT}\t{TOO_SHORT}\tex0\tlexical_overlap\t\t\n")
    return root


def run(tmp_path: Path, bench: Path, docs: list[dict], **over) -> tuple[dict, dict[str, list[str]]]:
    data = tmp_path / "data"
    shutil.rmtree(data, ignore_errors=True)
    (data / "extract/shards").mkdir(parents=True)
    write_docs(data / "extract/shards/s0.parquet", docs)
    p = parse_params({"paths": {"data_dir": str(data), "benchmarks_dir": str(bench)},
                      "decontaminate": {"input_stage": "extract", "tasks": ["lambada", "hans"], **over}})
    adopt_outputs(p, "extract")
    stats = run_stage("decontaminate", p)
    validate_stage("decontaminate", p)
    out: dict[str, list[str]] = {}
    for row in pq.read_table(data / "decontaminate/shards/s0.parquet").to_pylist():
        out.setdefault(row["id"].split("#")[0], []).append(row["text"])
    return stats, out


def doc(i, text: str) -> dict:
    return {"id": f"d{i}", "text": text, "dataset": "t", "url": "", "crawl": "", "lang": "en", "lang_score": 0.0}


def test_match_is_cut_with_margins_and_document_split(tmp_path, bench):
    before, after = FILLER * 4, FILLER * 5
    text = before + PASSAGE.upper().replace(" the ", " \u201cthe\u201d ") + ". " + after  # case + typographic quotes
    stats, out = run(tmp_path, bench, [doc(0, text), doc(1, FILLER * 3)])
    pieces = out["d0"]
    assert len(pieces) == 2 and "lighthouse" not in " ".join(pieces).lower()
    assert text.startswith(pieces[0]) and text.rstrip().endswith(pieces[1])
    removed = len(text) - sum(len(x) for x in pieces)
    assert len(PASSAGE) + 2 * 200 <= removed <= len(PASSAGE) + 2 * 200 + 60  # margins widened to whole words
    assert out["d1"] == [FILLER * 3]
    assert stats["tasks"]["lambada"]["training_docs_split"] == 1 and stats["extra"]["pieces_written"] == 2
    assert stats["index_total_bytes"] > 0 and stats["tasks"]["lambada"]["ngrams"] == 8 + 2


def test_short_pieces_and_too_many_pieces_are_dropped(tmp_path, bench):
    tiny = "Short intro. " + PASSAGE + " short outro."
    many = (FILLER * 6 + PASSAGE + ". ") * 12 + FILLER * 6  # 13 long pieces > 10
    # 13 pieces, 11 of them under 200 characters: 2 kept pieces, as Megatron's filter_ngrams counts (it was
    # dropped whole for 13 > 10)
    close = (FILLER * 3 + PASSAGE + ". ") * 12 + FILLER * 3
    stats, out = run(tmp_path, bench, [doc(0, tiny), doc(1, many), doc(2, close)], max_doc_frequency=100)
    assert "d0" not in out and "d1" not in out
    assert stats["dropped"] == {"no_piece_long_enough": 1, "too_many_pieces": 1}
    assert len(out["d2"]) == 2 and all(len(x) >= 200 and "lighthouse" not in x for x in out["d2"])


def test_frequent_ngrams_are_ignored(tmp_path, bench):
    docs = [doc(i, FILLER * 3 + PASSAGE + " " + FILLER * 3) for i in range(11)]
    stats, out = run(tmp_path, bench, docs)  # in 11 documents: too common to mean contamination
    assert all(out[f"d{i}"] == [docs[i]["text"]] for i in range(11))
    assert stats["frequent_ngrams_ignored"] == 8 and stats["tasks"]["lambada"]["frequent_ngrams_ignored"] == 8
    stats, out = run(tmp_path, bench, docs[:10])  # in 10: still contamination
    assert all(len(out[f"d{i}"]) == 2 for i in range(10))


def test_short_task_texts_match_whole_down_to_min_n(tmp_path, bench):
    stats, out = run(tmp_path, bench, [doc(0, FILLER * 3 + SHORT + "? " + FILLER * 3),
                                       doc(1, FILLER * 3 + TOO_SHORT + ". " + FILLER * 3),
                                       doc(2, FILLER * 3 + " ".join(SHORT.split()[:8]) + " " + FILLER * 3)])
    assert len(out["d0"]) == 2 and "ferry" not in " ".join(out["d0"])
    assert out["d1"] == [FILLER * 3 + TOO_SHORT + ". " + FILLER * 3]  # 5-word texts are not entries
    assert len(out["d2"]) == 1  # only the first 8 words of a 9-word text: no match
    assert stats["tasks"]["hans"]["texts_too_short"] == 1 and stats["tasks"]["hans"]["short_texts"] == 1


def test_a_passage_spanning_two_short_fields_is_found(tmp_path, bench):
    """HANS premise (6 words) + hypothesis (3 words): neither field is an entry, but the example as the
    evaluator renders it is (both raw and in its prompt format), so a copy of the pair is found."""
    header = (bench / "hans/heuristics_evaluation_set.txt").read_text().splitlines()[0]
    (bench / "hans/heuristics_evaluation_set.txt").write_text(
        header + "\nentailment\t\t\t\t\tThe doctor near the actor danced .\tThe actor danced .\tex0\tlexical_overlap\t\t\n")
    stats, out = run(tmp_path, bench, [
        doc(0, FILLER * 3 + "The doctor near the actor danced. The actor danced. " + FILLER * 3),
        doc(1, FILLER * 3 + "The doctor near the actor danced .\nQuestion: The actor danced . True or False?\n"
                            "Answer: True\n\n" + FILLER * 3),
        doc(2, FILLER * 3 + "The doctor near the actor danced. " + FILLER * 3)])
    assert all("doctor" not in " ".join(out[d]) for d in ("d0", "d1"))
    assert "doctor" in " ".join(out["d2"])  # the premise alone is 6 words: not an entry


@pytest.mark.parametrize("text", ["x", "!!! ... ??? — «» …", "one two three", "\u00a0\u2003 \t\n",
                                  "混合 scripts Кириллица ελληνικά 日本語のテキスト"])
def test_short_and_odd_documents_pass_unchanged(tmp_path, bench, text):
    _, out = run(tmp_path, bench, [doc(0, text)])
    assert out["d0"] == [text]


def test_changed_task_files_rebuild_the_index_and_redo_both_passes(tmp_path, bench):
    docs = [doc(0, FILLER * 3 + SHORT + " " + FILLER * 3)]
    data = tmp_path / "data"
    (data / "extract/shards").mkdir(parents=True)
    write_docs(data / "extract/shards/s0.parquet", docs)
    p = parse_params({"paths": {"data_dir": str(data), "benchmarks_dir": str(bench)},
                      "decontaminate": {"input_stage": "extract", "tasks": ["lambada", "hans"]}})
    adopt_outputs(p, "extract")
    assert run_stage("decontaminate", p)["extra"]["docs_matched"] == 1
    assert run_stage("decontaminate", p)["up_to_date"]
    (bench / "hans/heuristics_evaluation_set.txt").write_text(
        (bench / "hans/heuristics_evaluation_set.txt").read_text().replace(SHORT, "An unrelated sentence of ten words about the weather"))
    again = run_stage("decontaminate", p)
    assert again["resumed_shards"] == 0 and again["extra"]["docs_matched"] == 0


def test_mixed_scripts_are_matched_as_words(tmp_path, bench):
    cyr = "старый смотритель маяка считал каждый корабль который проходил мимо северного мыса зимой в шторм"
    (bench / "lambada/lambada_test.jsonl").write_text(json.dumps({"text": cyr}) + "\n")
    _, out = run(tmp_path, bench, [doc(0, FILLER * 3 + cyr.upper().replace(" ", " — ", 1) + " " + FILLER * 3)])
    assert len(out["d0"]) == 2 and "маяка" not in " ".join(out["d0"]).lower()


def test_missing_task_file_is_a_clear_error(tmp_path, bench):
    (bench / "hans/heuristics_evaluation_set.txt").unlink()
    with pytest.raises(TaskFileError, match=r"task 'hans': file not found .*heuristics_evaluation_set.txt"):
        run(tmp_path, bench, [doc(0, FILLER)])


def test_bad_parameters(tmp_path):
    with pytest.raises(ConfigError, match="decontaminate.min_n: min_n must be <= n"):
        parse_params({"decontaminate": {"n": 10, "min_n": 12}})
    with pytest.raises(ConfigError, match="decontaminate.tasks.0: Input should be 'lambada'"):
        parse_params({"decontaminate": {"tasks": ["squad"]}})


def test_word_hash_matches_reference_across_blocks_and_giant_tokens():
    mask = (1 << 64) - 1

    def ref(word: str) -> int:
        h = 0
        for k, byte in enumerate(word.encode()):
            h = (h + (byte + 1) * pow(ni._P, k % ni._BLOCK, 1 << 64)) & mask
        return int(ni._fmix(np.array([h], dtype=np.uint64))[0])

    rng = random.Random(0)
    vocab = ["a", "é", "日本", "hello", "x" * 300]
    text = " ".join(rng.choice(vocab) for _ in range(900_000))  # > one 2 MiB block
    h, words = ni.word_hashes(text), text.split()
    assert len(text.encode()) > ni._BLOCK and len(h) == len(words)
    assert all(h[i] == ref(words[i]) for i in rng.sample(range(len(words)), 300))
    giant = ni.word_hashes("word " + "g" * ni._BLOCK + " tail")
    assert giant[0] == ref("word") and giant[-1] == ref("tail")


def test_tokens_and_spans_agree_on_nasty_text():
    rng = random.Random(0)
    alphabet = "ab,._-—«» \t\n\x0b\x1c\x1f\u00a0éÉ1İﬁΣ"
    # not in NFKC form: a decomposed accent, symbols that become letters (™, ㍱) or a space and a mark (¨),
    # full-width letters, a Kelvin sign (lowercased, ASCII)
    compat = alphabet + "e\u0301\u0301™㍱¨Ａ½\u212a"
    for s in ["Hello, world!", "a_b __ _ x", "ΟΔΟΣ. Σ", "—", "", "a\x1cb\tc  d", "x¨y ™ ㍱", "\u212a b"] + \
             ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(2000)] + \
             ["".join(rng.choice(compat) for _ in range(rng.randint(0, 40))) for _ in range(2000)]:
        spans = ni.token_spans(s)
        assert [ni.normalize(s[a:b]) for a, b in spans] == ni.words_of(s)
        # ASCII text keeps its whitespace for word_hashes to split on: same words, same hashes
        assert ni.word_hashes(ni.normalize(s)).tolist() == ni.word_hashes(" ".join(ni.words_of(s))).tolist()


def test_text_in_other_unicode_forms_gives_the_same_words():
    """Normalisation lowercased and dropped punctuation only: a decomposed accent (e + U+0301, as macOS and some
    editors write) was dropped as punctuation ("cafe", not "café"), a ligature (ﬁ, as PDF-extracted books
    hold) made another word: such copies of a text were neither duplicates nor contamination."""
    import unicodedata
    text = "The ﬁrst café in Zürich served ﬂat bread to ＦＵＬＬ-width guests."
    plain = "The first café in Zürich served flat bread to FULL-width guests."
    assert ni.words_of(text) == ni.words_of(plain) == ni.words_of(unicodedata.normalize("NFD", plain))
    assert ni.words_of(plain)[2] == "café"
    assert ni.words_of("x¨y ™") == ["xy", "tm"]  # NFKC's space inside a token does not make two words


def test_index_built_in_one_pass_equals_the_index_built_text_by_text():
    """The build hashes a task's texts joined in one vectorised pass; its entries are exactly each
    text's own: every n-gram, a text of min_n..n-1 words whole with its prefix, nothing shorter."""
    from tasks.evalsets.loaders import TaskData

    class Texts(TaskData):  # the texts as given: empty ones, repeats and all
        def decontam_texts(self):
            yield from (ex["text"] for ex in self.examples)

    rng = random.Random(1)
    alphabet = ["a", "b", "é", "日本", "x_y", ",", "—", "\u00a0", " ", "\t", "\n", "\x01", "w" * 40]
    texts = ["", " ", "!!! ,,", "one two three", PASSAGE, SHORT] + \
            [" ".join(f"w{i}" for i in range(k)) for k in range(6, 16)] + \
            ["".join(rng.choice(alphabet) + " " * rng.randint(0, 1) for _ in range(rng.randint(0, 60)))
             for _ in range(400)]
    tasks = [Texts("lambada", [{"text": t} for t in texts], ("text",)),
             Texts("boolq", [{"text": t} for t in texts[::7] + texts[:3]], ("text",)), Texts("wic", [], ("text",))]
    n, min_n = 13, 8
    index = ni.NgramIndex.build(tasks, n, min_n)
    entries, prefixes, lengths = {}, set(), set()
    for t, task in enumerate(tasks):
        texts_t = [ex["text"] for ex in task.examples]
        counts = [len(ni.word_hashes(ni.normalize(x))) for x in texts_t]
        assert index.per_task[task.name] == {
            "texts": len(texts_t), "ngrams": index.per_task[task.name]["ngrams"],
            "short_texts": sum(min_n <= c < n for c in counts), "texts_too_short": sum(c < min_n for c in counts)}
        for x in texts_t:
            w = ni.word_hashes(ni.normalize(x))
            if len(w) >= n:
                grams = ni.window_hashes(w, n)
            elif len(w) >= min_n:
                grams = ni.window_hashes(w, len(w))
                prefixes.add(int(ni.window_hashes(w[:min_n], min_n)[0]))
                lengths.add(len(w))
            else:
                continue
            for g in grams.tolist():
                entries[g] = entries.get(g, 0) | (1 << t)
    assert index.hashes.tolist() == sorted(entries)
    assert index.masks.tolist() == [entries[h] for h in sorted(entries)]
    assert index.prefixes.tolist() == sorted(prefixes) and index.short_lengths.tolist() == sorted(lengths)
    assert index.per_task["wic"] == {"texts": 0, "ngrams": 0, "short_texts": 0, "texts_too_short": 0}


def test_real_tasks_on_the_sample_remove_every_planted_passage(extracted, tmp_path):
    p = parse_params({**extracted.model_dump(mode="json"),
                      "paths": {"data_dir": str(tmp_path / "data"), "benchmarks_dir": extracted.paths.benchmarks_dir},
                      "decontaminate": {**extracted.decontaminate.model_dump(mode="json"), "input_stage": "extract"}})
    copy_stages(Path(extracted.paths.data_dir), tmp_path / "data")
    stats = run_stage("decontaminate", p)
    assert validate_stage("decontaminate", p).success
    assert set(stats["tasks"]) == {"lambada", "boolq", "race_h", "piqa", "hellaswag", "winogrande", "anli_r2",
                                   "hans", "wic"}
    assert stats["index_entries"] > 1_000_000 and stats["index_total_bytes"] < 64 << 20
    truth = json.loads((tmp_path / "data/sample/corpus/ground_truth.json").read_text())["documents"]
    out_text = " ".join(ni.words_of(" ".join(
        r["text"] for f in sorted((tmp_path / "data/decontaminate/shards").glob("*.parquet"))
        for r in pq.read_table(f, columns=["text"]).to_pylist())))
    planted = [d for d in truth if d["kind"] == "contaminated"]
    assert planted and not any(" ".join(ni.words_of(d["passage"])) in out_text for d in planted)
    assert stats["extra"]["docs_matched"] >= len(planted)

    # resume: lose one output shard, rerun -> only it is redone, bytes identical
    shards = sorted((tmp_path / "data/decontaminate/shards").glob("*.parquet"))
    before = {f.name: f.read_bytes() for f in shards}
    shards[0].unlink()
    again = run_stage("decontaminate", p)
    assert again["resumed_shards"] == again["shards"] - 1
    assert {f.name: f.read_bytes() for f in shards} == before

    # a deliberately re-contaminated output fails the re-scan expectation
    rows = pq.read_table(shards[0]).to_pylist()
    rows[0]["text"] += " " + planted[0]["passage"]
    write_docs(shards[0], rows)
    with pytest.raises(ExpectationFailed, match=r"expect_column_values_to_be_between on column 'task_ngram_hits': 1 unexpected"):
        validate_stage("decontaminate", p)
    # an output emptied of every document: nothing left to re-scan, and it passed
    documents = sum(pq.read_metadata(f).num_rows for f in shards)
    for f in shards:
        write_docs(f, [])
    with pytest.raises(ExpectationFailed) as failed:
        validate_stage("decontaminate", p)
    assert failed.value.failures == [f"expect_column_values_to_be_between on column 'documents_unlike_stats': "
                                     f"{documents} in the whole output"]


def test_wic_sentences_copied_as_running_text_are_found():
    """WiC's files are Penn Treebank tokens ("a boy 's", "do n't"): the index held the words "boy s" and "do nt",
    and the same sentence in a web page ("a boy's", "don't") was not found (51 of WiC dev's 542 indexed sentences)."""
    from tasks.decontaminate.matching import batch_hits
    from tasks.evalsets.loaders import load_tasks
    from tests.conftest import BENCHMARKS
    index = ni.NgramIndex.build(load_tasks(["wic"], str(BENCHMARKS)), 13, 8)
    around = "Farmers in the valley planted barley and oats after the rains and sold bread on Saturday. "
    for copy in ("A girl's education was less important than a boy's.",
                 "In his sermon, the minister didn't try to whitewash over the sins of his church."):
        hits = batch_hits(index, [around + copy + " " + around])[0]
        assert len(hits), copy
    assert not len(batch_hits(index, [around * 3])[0])


def test_winogrande_and_hellaswag_items_copied_as_the_files_hold_them_are_found():
    """A WinoGrande sentence copied as its file writes it (with the `_` blank, lm-eval's decontamination
    query) or filled with the wrong option, and a HellaSwag context or wrong ending copied alone: only the
    gold-filled sentence and context + gold ending were indexed (42% of raw WinoGrande copies survived)."""
    from tasks.decontaminate.matching import batch_hits, batch_matches
    from tasks.evalsets.loaders import load_tasks
    from tests.conftest import BENCHMARKS
    wg, hs = load_tasks(["winogrande", "hellaswag"], str(BENCHMARKS))
    index = ni.NgramIndex.build([wg, hs], 13, 8)
    around = "Farmers in the valley planted barley and oats after the rains and sold bread on Saturday. "
    copies = []
    for ex in wg.examples[:200]:
        copies += [ex["sentence"], ex["sentence"].replace("_", ex["option2" if ex["label"] == 0 else "option1"], 1)]
    wrong = [(ex["ctx"], e) for ex in hs.examples for i, e in enumerate(ex["endings"]) if i != ex["label"]]
    for ctx, ending in [(c, e) for c, e in wrong if len(c.split()) >= 8 and len(e.split()) >= 8][:100]:
        copies += [ctx, ending]  # (8 words: the shortest text matched whole)
    hits = batch_matches(index, [around + copy + " " + around for copy in copies])
    assert len(hits) == len(copies) == 600 and [copy for copy, h in zip(copies, hits) if not h] == []
    assert not len(batch_hits(index, [around * 3])[0])


def test_a_task_file_line_may_hold_the_characters_splitlines_breaks_at(tmp_path):
    """JSON lets a string hold U+2028, U+2029 and U+0085 unescaped (json.dumps(ensure_ascii=False) writes
    them so); str.splitlines() broke the record there: 'line 1: not valid JSON'."""
    from tasks.evalsets.loaders import load_tasks
    (tmp_path / "lambada").mkdir()
    texts = [f"the keeper counted{c} every ship that passed the rocky cape in the long storms {k}"
             for k, c in enumerate(("\u2028", "\u2029", "\x85", "\x1c"))]
    (tmp_path / "lambada/lambada_test.jsonl").write_text(
        "".join(json.dumps({"text": t}, ensure_ascii=False) + "\r\n" for t in texts), encoding="utf-8")
    assert [ex["text"] for ex in load_tasks(["lambada"], str(tmp_path))[0].examples] == texts
