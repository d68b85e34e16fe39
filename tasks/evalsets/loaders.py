"""Loaders for the nine MT-NLG evaluation tasks, from their official release files.

The same loaders serve decontamination (which text fields must not leak into training data) and
evaluation (the examples and, where a task has one, the few-shot split). Every loader fails loudly:
a missing or malformed file raises TaskFileError naming the task and the file expected, so nothing
is ever evaluated or decontaminated against an empty task.
"""
from __future__ import annotations

import io
import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from tasks.core.errors import InputFileError

TASK_NAMES = ("lambada", "boolq", "race_h", "piqa", "hellaswag", "winogrande", "anli_r2", "hans", "wic")

# Where each official file lives under the benchmarks folder (README: where to get each one).
TASK_FILES = {
    "lambada": ["lambada/lambada_test.jsonl"],
    "boolq": ["boolq/dev.jsonl"],
    "race_h": ["race/test/high/*.txt"],
    "piqa": ["piqa/valid.jsonl", "piqa/valid-labels.lst"],
    "hellaswag": ["hellaswag/hellaswag_val.jsonl"],
    "winogrande": ["winogrande/dev.jsonl", "winogrande/dev-labels.lst"],
    "anli_r2": ["anli/R2/test.jsonl"],
    "hans": ["hans/heuristics_evaluation_set.txt"],
    "wic": ["wic/dev/dev.data.txt", "wic/dev/dev.gold.txt"],
}


class TaskFileError(InputFileError):
    """A missing or malformed evaluation-task file: names the task, the file and the line."""


@dataclass
class TaskData:
    name: str
    examples: list[dict]
    # The example's own text fields (GPT-3 App. C: the evaluation text that must not leak into training)
    decontam_fields: tuple[str, ...]
    fewshot: list[dict] | None = field(default=None, repr=False)

    def decontam_texts(self) -> Iterator[str]:
        """What decontamination indexes, so that it and the evaluator agree on what the task's text is:
        each rendered example exactly as the evaluator scores it (context plus gold continuation,
        tasks/evalsets/prompts.py), the same example without the prompt's template words (its fields
        in prompt order with the gold answer: a passage copied across two fields, e.g. HANS premise +
        hypothesis or PiQA goal + solution, is found even when each field is short), and each field
        alone (a field of 8-12 words copied by itself is still a whole-text match; a list field, each of
        its strings)."""
        from tasks.evalsets.prompts import render
        seen: set[str] = set()

        def new(t: str) -> bool:
            if t and t not in seen:  # RACE repeats one article per question
                seen.add(t)
                return True
            return False
        for doc in render(self, fewshot_pool=False)[0]:
            for t in (doc.shot, doc.content):
                if new(t):
                    yield t
        for ex in self.examples:
            for f in self.decontam_fields:
                value = ex.get(f)
                for text in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
                    for t in (text, _ptb_detokenized(text)) if isinstance(text, str) else ():
                        if new(t):
                            yield t


# Penn Treebank tokenization splits contractions and possessives off their word ("do n't", "a boy 's"): WiC's
# files come so. Normalised, that is the words "do nt" / "boy s", where the same sentence in running text gives
# "dont" / "boys", so a web copy of 12% of WiC's indexed sentences went unfound. Their joined form is indexed too.
_PTB_CLITIC = re.compile(r" (n't|'s|'re|'ve|'m|'ll|'d)(?=\s|$)", re.IGNORECASE)


def _ptb_detokenized(text: str) -> str:
    return _PTB_CLITIC.sub(r"\1", text)


def _err(task: str, path: Path, why: str) -> TaskFileError:
    return TaskFileError(f"task '{task}': {why} (expected file: {path})")


def _need(task: str, root: Path, rel: str) -> Path:
    p = root / rel
    if not p.is_file():
        raise _err(task, p, "file not found")
    return p


def _lines(task: str, path: Path) -> Iterator[tuple[int, str]]:
    """Non-blank lines; utf-8-sig drops a BOM; a trailing or stray blank line is not a record."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise _err(task, path, f"not UTF-8 ({e.reason} at byte {e.start})") from None
    # split at "\n" alone: splitlines() also breaks at U+2028, U+0085 and \x1c-\x1e, which JSON lets a
    # string hold unescaped (json.dumps(ensure_ascii=False) writes them so), cutting a record in two
    for i, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if line.strip():
            yield i, line


def _jsonl(task: str, path: Path, required: tuple[str, ...],
           values: Callable[[dict], str | None] | None = None) -> list[dict]:
    """The file's records, each with the `required` fields: text fields, strings; the others (a label, a
    list of endings) checked by `values`, which names what is wrong with a record, else None. A gold
    that is not what the format says (BoolQ's answer as the string "false", a HellaSwag label past its
    endings) would otherwise be scored, silently, as another answer."""
    rows = []
    for i, line in _lines(task, path):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise _err(task, path, f"line {i}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise _err(task, path, f"line {i}: expected a JSON object")
        missing = [k for k in required if k not in row]
        if missing:
            raise _err(task, path, f"line {i}: missing field(s) {missing}")
        why = values(row) if values else _strings(row, required)
        if why:
            raise _err(task, path, f"line {i}: {why}")
        rows.append(row)
    if not rows:
        raise _err(task, path, "file has no records")
    return rows


def _strings(row: dict, keys: tuple[str, ...]) -> str | None:
    bad = next((k for k in keys if not isinstance(row[k], str)), None)
    return None if bad is None else f"field {bad!r} is {json.dumps(row[bad])[:40]}, not a string"


def _boolq_values(row: dict) -> str | None:
    if not isinstance(row["answer"], bool):
        return f"answer {json.dumps(row['answer'])[:40]} is not true or false"
    return _strings(row, ("question", "passage"))


def _hellaswag_values(row: dict) -> str | None:
    endings, label = row["endings"], row["label"]
    if not (isinstance(endings, list) and len(endings) >= 2 and all(isinstance(e, str) for e in endings)):
        return "endings is not a list of two or more strings"
    # an int, or its digits as a string (the Hugging Face copy); "" is the unlabeled test split's
    # (isdecimal, not isdigit: "²" is a digit that int() refuses)
    if isinstance(label, bool) or not (isinstance(label, int) or (isinstance(label, str) and label.isdecimal())) \
            or not 0 <= int(label) < len(endings):
        return f"label {json.dumps(label)[:40]} is not the index of one of its {len(endings)} endings"
    # ctx_a, ctx_b and activity_label make the prompt where present (prompts.py), ctx where not
    return _strings(row, ("ctx",) + tuple(k for k in ("ctx_a", "ctx_b", "activity_label") if k in row))


def _anli_values(row: dict) -> str | None:
    if row["label"] not in ("e", "n", "c"):
        return f"label {json.dumps(row['label'])[:40]} not e/n/c"
    return _strings(row, ("context", "hypothesis"))


def _labels(task: str, path: Path, n: int, allowed: set[str]) -> list[str]:
    labels = [line.strip() for _, line in _lines(task, path)]
    if len(labels) != n:
        raise _err(task, path, f"{len(labels)} labels for {n} examples")
    bad = [(i, x) for i, x in enumerate(labels, 1) if x not in allowed]
    if bad:
        raise _err(task, path, f"label line {bad[0][0]}: {bad[0][1]!r} not in {sorted(allowed)}")
    return labels


def _load_lambada(root: Path, fewshot: bool) -> TaskData:
    rows = _jsonl("lambada", _need("lambada", root, TASK_FILES["lambada"][0]), ("text",))
    ex = []
    for r in rows:
        context, _, target = r["text"].rstrip().rpartition(" ")
        ex.append({"text": r["text"], "context": context, "target": target})
    return TaskData("lambada", ex, ("text",))  # LAMBADA has no training split for few-shot


def _load_boolq(root: Path, fewshot: bool) -> TaskData:
    p = _need("boolq", root, TASK_FILES["boolq"][0])
    rows = _jsonl("boolq", p, ("question", "passage", "answer"), _boolq_values)
    ex = [{"question": r["question"], "passage": r["passage"], "title": r.get("title", ""),
           "label": bool(r["answer"])} for r in rows]
    return TaskData("boolq", ex, ("passage", "question"))


def _race_dir(task: str, d: Path) -> list[dict]:
    files = sorted(d.glob("*.txt"))
    if not files:
        raise _err(task, d / "*.txt", "no RACE passage files")
    out = []
    for f in files:
        try:
            obj = json.loads(f.read_text(encoding="utf-8-sig"))
            qs, opts, ans = obj["questions"], obj["options"], obj["answers"]
            article = obj["article"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise _err(task, f, f"malformed RACE file ({e.__class__.__name__}: {e})") from None
        if not (isinstance(article, str) and all(isinstance(x, list) for x in (qs, opts, ans))
                and len(qs) == len(opts) == len(ans)):
            raise _err(task, f, "article is not a string, or questions/options/answers not lists of one length")
        for n, (q, o, a) in enumerate(zip(qs, opts, ans), 1):
            if a not in ("A", "B", "C", "D") or not isinstance(o, list) or len(o) != 4 \
                    or not all(isinstance(x, str) for x in (q, *o)):
                raise _err(task, f, f"question {n}: answer {a!r} is not A-D, or not 4 text options")
            out.append({"article": article, "question": q, "options": o, "label": "ABCD".index(a),
                        "id": obj.get("id", f.name)})
    return out


def _load_race(root: Path, fewshot: bool) -> TaskData:
    ex = _race_dir("race_h", root / "race/test/high")
    # no few-shot split: lm-eval's race has only its test split and draws shots from those articles
    return TaskData("race_h", ex, ("article", "question"))


def _load_piqa(root: Path, fewshot: bool) -> TaskData:
    p = _need("piqa", root, TASK_FILES["piqa"][0])
    rows = _jsonl("piqa", p, ("goal", "sol1", "sol2"))
    labels = _labels("piqa", _need("piqa", root, TASK_FILES["piqa"][1]), len(rows), {"0", "1"})
    ex = [{"goal": r["goal"], "sol1": r["sol1"], "sol2": r["sol2"], "label": int(y)}
          for r, y in zip(rows, labels)]
    fs = _arrow_from_zip("piqa", root / "piqa/hf_cache_piqa_plain_text_1.1.0.zip", "piqa-train.arrow") \
        if fewshot else None
    return TaskData("piqa", ex, ("goal", "sol1", "sol2"), fs)


def _arrow_from_zip(task: str, path: Path, member_suffix: str) -> list[dict]:
    import pyarrow.ipc as ipc

    if not path.is_file():
        raise _err(task, path, "few-shot archive not found")
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.endswith(member_suffix)]
        if not names:
            raise _err(task, path, f"no member ending in {member_suffix}")
        data = z.read(names[0])
    return ipc.open_stream(io.BytesIO(data)).read_all().to_pylist()


def _load_hellaswag(root: Path, fewshot: bool) -> TaskData:
    p = _need("hellaswag", root, TASK_FILES["hellaswag"][0])
    rows = _jsonl("hellaswag", p, ("ctx", "endings", "label"), _hellaswag_values)
    ex = []
    for r in rows:
        label = int(r["label"])
        ex.append({"ctx": r["ctx"], "ctx_a": r.get("ctx_a", r["ctx"]), "ctx_b": r.get("ctx_b", ""),
                   "activity_label": r.get("activity_label", ""), "endings": r["endings"],
                   "label": label, "gold_text": f"{r['ctx']} {r['endings'][label]}"})
    # the context and every ending alone too (as PiQA's two solutions): a copied context of 8-12 words,
    # or a wrong ending, was found only inside context + gold ending
    return TaskData("hellaswag", ex, ("ctx", "gold_text", "endings"))


def _load_winogrande(root: Path, fewshot: bool) -> TaskData:
    rows = _jsonl("winogrande", _need("winogrande", root, TASK_FILES["winogrande"][0]),
                  ("sentence", "option1", "option2"))
    labels = _labels("winogrande", _need("winogrande", root, TASK_FILES["winogrande"][1]), len(rows),
                     {"1", "2"})
    ex = []
    for r, y in zip(rows, labels):
        gold = r["option1"] if y == "1" else r["option2"]
        other = r["option2"] if y == "1" else r["option1"]
        ex.append({"sentence": r["sentence"], "option1": r["option1"], "option2": r["option2"],
                   "label": int(y) - 1, "filled": r["sentence"].replace("_", gold, 1),
                   "other": r["sentence"].replace("_", other, 1)})
    fs = None
    if fewshot:
        # lm-eval's winogrande reads winogrande_xl: its train split (40,398) is the few-shot pool
        fs = _arrow_from_zip("winogrande", root / "winogrande/hf_cache_winogrande_xl.zip", "winogrande-train.arrow")
    # the sentence as the file has it (with its blank: how a copy of the dataset reads) and filled with
    # the other option too (lm-eval's decontamination query is the raw sentence): 42% of raw copies survived
    return TaskData("winogrande", ex, ("filled", "sentence", "other"), fs)


def _load_anli(root: Path, fewshot: bool) -> TaskData:
    keys = ("context", "hypothesis", "label")
    rows = _jsonl("anli_r2", _need("anli_r2", root, TASK_FILES["anli_r2"][0]), keys, _anli_values)
    fs = _jsonl("anli_r2", _need("anli_r2", root, "anli/R2/dev.jsonl"), keys, _anli_values) if fewshot else None
    return TaskData("anli_r2", rows, ("context", "hypothesis"), fs)


def _load_hans(root: Path, fewshot: bool) -> TaskData:
    p = _need("hans", root, TASK_FILES["hans"][0])
    lines = list(_lines("hans", p))
    header = lines[0][1].split("\t") if lines else []
    need = ("gold_label", "sentence1", "sentence2", "heuristic")
    if any(k not in header for k in need):
        raise _err("hans", p, f"header must name columns {list(need)}")
    col = {k: header.index(k) for k in need}
    ex = []
    for i, line in lines[1:]:
        cells = line.split("\t")
        if len(cells) < len(header):
            raise _err("hans", p, f"line {i}: {len(cells)} columns, expected {len(header)}")
        label = cells[col["gold_label"]]
        if label not in ("entailment", "non-entailment"):
            raise _err("hans", p, f"line {i}: gold_label {label!r}")
        ex.append({"sentence1": cells[col["sentence1"]], "sentence2": cells[col["sentence2"]],
                   "heuristic": cells[col["heuristic"]], "label": label == "entailment"})
    if not ex:
        raise _err("hans", p, "file has no records")
    return TaskData("hans", ex, ("sentence1", "sentence2"))


def _wic_split(root: Path, split: str) -> list[dict]:
    data = _need("wic", root, f"wic/{split}/{split}.data.txt")
    rows = []
    for i, line in _lines("wic", data):
        c = line.split("\t")
        if len(c) != 5:
            raise _err("wic", data, f"line {i}: {len(c)} tab-separated columns, expected 5")
        rows.append({"word": c[0], "pos": c[1], "indices": c[2], "sentence1": c[3], "sentence2": c[4]})
    gold = _labels("wic", _need("wic", root, f"wic/{split}/{split}.gold.txt"), len(rows), {"T", "F"})
    for r, g in zip(rows, gold):
        r["label"] = g == "T"
    return rows


def _load_wic(root: Path, fewshot: bool) -> TaskData:
    fs = _wic_split(root, "train") if fewshot else None
    return TaskData("wic", _wic_split(root, "dev"), ("sentence1", "sentence2"), fs)


LOADERS: dict[str, Callable[[Path, bool], TaskData]] = {
    "lambada": _load_lambada, "boolq": _load_boolq, "race_h": _load_race, "piqa": _load_piqa,
    "hellaswag": _load_hellaswag, "winogrande": _load_winogrande, "anli_r2": _load_anli,
    "hans": _load_hans, "wic": _load_wic,
}


def _task_root(name: str, root: str | Path) -> Path:
    """The benchmarks folder, for a task this module knows."""
    if name not in LOADERS:
        raise TaskFileError(f"unknown task '{name}'; known: {', '.join(TASK_NAMES)}")
    root = Path(root)
    if not root.is_dir():
        raise TaskFileError(f"task '{name}': benchmarks folder {root} does not exist")
    return root


def load_task(name: str, root: str | Path, fewshot: bool = False) -> TaskData:
    folder = _task_root(name, root)  # first: it refuses an unknown name in one line
    return LOADERS[name](folder, fewshot)


def check_task_files(names, root: str | Path) -> None:
    """Each task's evaluation files are where load_task reads them (their contents are checked when
    loaded): a stage's declared check, refusing a mistyped benchmarks folder before its last results go."""
    for name in names:
        folder = _task_root(name, root)
        for rel in TASK_FILES[name]:
            if "*" in rel:
                if not any(folder.glob(rel)):
                    raise _err(name, folder / rel, "no file matches")
            else:
                _need(name, folder, rel)


def load_tasks(names: tuple[str, ...] | list[str], root: str | Path, fewshot: bool = False) -> list[TaskData]:
    return [load_task(n, root, fewshot) for n in names]


def task_files(root: str | Path) -> list[str]:
    """Every file under the benchmarks folder: what a pass built from the tasks fingerprints."""
    root = Path(root)
    return sorted(str(f) for f in root.rglob("*") if f.is_file()) if root.is_dir() else []
