"""lm-evaluation-harness 0.4 tasks that read local files, nothing from the hub: the same docs our
evaluator scores (the official release files, subsampled with the same seed), rewritten in the schema
of the hub dataset each lm-eval task YAML reads, and task YAMLs that `include` lm-eval's own YAML and
only swap the dataset for the local jsonl. So lm-eval renders the prompts with its own templates and
functions, and a difference in a prompt shows up as a difference in accuracy.

Reconciling the release files with the hub copies lm-eval normally reads:
- BoolQ: the hub (SuperGLUE) passage is "<title> -- <passage>"; the release keeps the title apart.
- ANLI: the release calls the premise `context` and labels e/n/c; the hub: `premise`, 0/1/2.
- RACE: the hub (EleutherAI/race) has one row per article with `problems` as a Python-literal list;
  the release has one file per article.
- WiC: the hub gives character offsets (start1, end1) of the word in sentence 1; the release gives its
  token index in the space-tokenised sentence, converted here. The hub (SuperGLUE) sentences are
  detokenised ("later?"); the release's are not ("later ?"): both harnesses here read the release's.
- HANS: lm-eval 0.4 has no HANS task; the YAML below is GLUE RTE's (binary entailment) on HANS.
- PiQA, HellaSwag, WinoGrande, LAMBADA: same fields.
"""
from __future__ import annotations

import json
from pathlib import Path

from tasks.evalsets.loaders import TaskData
from tasks.evalsets.prompts import race_articles, wic_word

LMEVAL_YAML = {  # our task -> lm-eval's YAML (relative to lm_eval/tasks) and its split names
    "lambada": "lambada/lambada_openai.yaml", "boolq": "super_glue/boolq/default.yaml",
    "race_h": "race/race.yaml", "piqa": "piqa/piqa.yaml", "hellaswag": "hellaswag/hellaswag.yaml",
    "winogrande": "winogrande/default.yaml", "anli_r2": "anli/anli_r2.yaml", "wic": "super_glue/wic/default.yaml",
}
HANS_YAML = """task: local_hans
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
output_type: multiple_choice
test_split: test
doc_to_text: "{{{{premise}}}}\\nQuestion: {{{{hypothesis}}}} True or False?\\nAnswer:"
doc_to_target: label
doc_to_choice: ["True", "False"]
metric_list:
  - metric: acc
metadata:
  version: 1.0
"""


def _wic_offsets(ex: dict) -> tuple[int, int]:
    i = int(ex["indices"].split("-")[0])
    tokens = ex["sentence1"].split(" ")
    start = len(" ".join(tokens[:i])) + (1 if i else 0)
    return start, start + len(wic_word(ex))


def hub_rows(task: TaskData) -> list[dict]:
    """The task's docs (RACE: articles), in our evaluator's doc order, in the hub dataset's schema."""
    n = task.name
    if n == "race_h":
        return [{"example_id": g[0]["id"], "article": g[0]["article"],
                 "problems": repr([{"answer": "ABCD"[p["label"]], "options": list(p["options"]),
                                    "question": p["question"]} for p in g])} for g in race_articles(task.examples)]
    rows = []
    for ex in task.examples:
        if n == "lambada":
            rows.append({"text": ex["text"]})
        elif n == "boolq":
            passage = f"{ex['title']} -- {ex['passage']}" if ex.get("title") else ex["passage"]
            rows.append({"question": ex["question"], "passage": passage, "label": int(ex["label"])})
        elif n == "piqa":
            rows.append({k: ex[k] for k in ("goal", "sol1", "sol2", "label")})
        elif n == "hellaswag":
            rows.append({k: ex[k] for k in ("activity_label", "ctx_a", "ctx_b", "endings")} | {"label": str(ex["label"])})
        elif n == "winogrande":
            rows.append({k: ex[k] for k in ("sentence", "option1", "option2")} | {"answer": str(ex["label"] + 1)})
        elif n == "anli_r2":
            rows.append({"premise": ex["context"], "hypothesis": ex["hypothesis"], "label": "enc".index(ex["label"])})
        elif n == "hans":
            rows.append({"premise": ex["sentence1"], "hypothesis": ex["sentence2"], "label": 0 if ex["label"] else 1})
        elif n == "wic":
            start, end = _wic_offsets(ex)
            rows.append({"sentence1": ex["sentence1"], "sentence2": ex["sentence2"], "word": ex["word"],
                         "start1": start, "end1": end, "label": int(ex["label"])})
    return rows


def write_tasks(tasks: list[tuple[TaskData, list[int]]], folder: Path) -> list[str]:
    """jsonl + YAML per task (docs at `indices` only) under `folder`; returns lm-eval task names."""
    import lm_eval
    tasks_root = Path(lm_eval.__file__).parent / "tasks"
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for task, indices in tasks:
        rows = hub_rows(task)
        data = folder / f"{task.name}.jsonl"
        data.write_text("".join(json.dumps(rows[i], ensure_ascii=False) + "\n" for i in indices), encoding="utf-8")
        name = f"local_{task.name}"
        if task.name == "hans":
            text = HANS_YAML.format(path=json.dumps(str(data)))
        else:
            text = (f"include: {json.dumps(str(tasks_root / LMEVAL_YAML[task.name]))}\ntask: {name}\n"
                    f"dataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data))}\n"
                    "training_split: null\nvalidation_split: null\ntest_split: test\nfewshot_split: null\n")
        (folder / f"{name}.yaml").write_text(text, encoding="utf-8")
        names.append(name)
    return names
