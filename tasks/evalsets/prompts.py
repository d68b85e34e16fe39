"""The nine MT-NLG tasks rendered as lm-evaluation-harness 0.4.13 renders them, from the official release
files (tasks/evalsets/loaders.py). Each example becomes a `Doc`: the (context, continuation) pair of
every choice, the gold index, and how the example reads as a solved few-shot shot.

Prompts (lm-eval's task YAMLs; `" "` is lm-eval's target delimiter, put in front of each choice):
- lambada:    context = text without its last word; continuation = " " + last word (greedy + perplexity)
- boolq:      "<title> -- <passage>\\nQuestion: <question>?\\nAnswer:"  choices " no" / " yes"
- race_h:     one doc per article, scoring its LAST question: "Article: <article>\\n\\n" then each earlier
              question as "Question: q\\nAnswer: a\\n" (a fill-in-the-blank question ending "  _  ." is
              written up to its blank, then the answer: lm-eval's race v3.0), then the last question
- piqa:       "Question: <goal>\\nAnswer:"  choices " <sol1>" / " <sol2>"
- hellaswag:  clean("<activity_label>: <ctx_a> <ctx_b.capitalize()>"), choices clean(ending), where clean
              turns " [title]" into ". ", drops "[...]" tags and double spaces
- winogrande: partial scoring: context = sentence up to "_" + option, continuation = " " + the rest
- anli_r2:    "<premise>\\nQuestion: <hypothesis> True, False, or Neither?\\nAnswer:"  " True"/" Neither"/" False"
- hans:       not an lm-eval 0.4 task; GLUE RTE's binary prompt, as lm-eval writes it:
              "<sentence1>\\nQuestion: <sentence2> True or False?\\nAnswer:"  " True" (entailment) / " False"
- wic:        "Sentence 1: <s1>\\nSentence 2: <s2>\\nQuestion: Is the word '<word in s1>' used in the same way
              in the two sentences above?\\nAnswer:"  " no" / " yes"
Few-shot: k solved shots joined by "\\n\\n", then "\\n\\n", then the prompt (lm-eval's delimiters), drawn
as lm-eval's sampler draws them (random.Random(seed), one generator per task; see DRAWS_ONE_MORE) from
the split lm-eval takes them from where the files have it (PiQA train, WinoGrande xl train, WiC train;
RACE: the test articles themselves, as lm-eval's race has no other split), else from the evaluated docs
(LAMBADA, BoolQ, HellaSwag, HANS: no train file here) or the nearest split (ANLI R2 dev for its train).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from tasks.core.errors import ConfigError
from tasks.evalsets.loaders import TaskData

SHOT_SEPARATOR = "\n\n"   # lm-eval's fewshot_delimiter
TARGET_DELIMITER = " "    # lm-eval's target_delimiter


@dataclass(frozen=True)
class Doc:
    """One scored example. `contexts` has one entry shared by every choice, or one per choice
    (WinoGrande); `continuations` one per choice, or one shared (WinoGrande)."""
    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int
    choices: tuple[str, ...]        # the choice texts: acc_norm divides by their length in characters
    shot: str                       # this example solved, as a few-shot demonstration
    content: str = ""               # its own text in prompt order, without the template (decontamination)

    @property
    def n_choices(self) -> int:
        return max(len(self.contexts), len(self.continuations))

    def pairs(self, prefix: str = "") -> list[tuple[str, str]]:
        n = self.n_choices
        ctx = self.contexts if len(self.contexts) == n else self.contexts * n
        cont = self.continuations if len(self.continuations) == n else self.continuations * n
        return [(prefix + c, t) for c, t in zip(ctx, cont)]


def _choice_doc(context: str, choices: list[str], gold: int, content: str) -> Doc:
    return Doc((context,), tuple(TARGET_DELIMITER + c for c in choices), gold, tuple(choices),
               context + TARGET_DELIMITER + choices[gold], content)


def lambada(ex: dict) -> Doc:
    words = ex["text"].split(" ")
    context, target = " ".join(words[:-1]), " " + words[-1]
    # lm-eval's LAMBADA target already starts with a space and its shots add the delimiter too
    return Doc((context,), (target,), 0, (target,), context + TARGET_DELIMITER + target, ex["text"])


def boolq(ex: dict) -> Doc:
    passage = f"{ex['title']} -- {ex['passage']}" if ex.get("title") else ex["passage"]
    return _choice_doc(f"{passage}\nQuestion: {ex['question']}?\nAnswer:", ["no", "yes"], int(ex["label"]),
                       f"{passage} {ex['question']}")


def race_articles(examples: list[dict]) -> list[list[dict]]:
    """The flat question list regrouped into articles (in file order): lm-eval scores one per article."""
    groups: list[list[dict]] = []
    for ex in examples:
        if groups and groups[-1][0]["id"] == ex["id"]:
            groups[-1].append(ex)
        else:
            groups.append([ex])
    return groups


def race(problems: list[dict]) -> Doc:
    text = "Article: " + problems[0]["article"] + "\n\n"
    content = [problems[0]["article"]] + [x for p in problems for x in (p["question"], p["options"][p["label"]])]
    for p in problems[:-1]:
        answer = p["options"][p["label"]]
        if p["question"][-6:] == "  _  .":
            text += p["question"][:-5] + answer + "\n"
        else:
            text += "Question: " + p["question"] + "\n" + "Answer: " + answer + "\n"
    last = problems[-1]
    return _choice_doc(text + last["question"], list(last["options"]), last["label"], " ".join(content))


def piqa(ex: dict) -> Doc:
    sols = [ex["sol1"], ex["sol2"]]
    return _choice_doc(f"Question: {ex['goal']}\nAnswer:", sols, int(ex["label"]), f"{ex['goal']} {sols[int(ex['label'])]}")


def _hellaswag_clean(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    return re.sub("\\[.*?\\]", "", text).replace("  ", " ")


def hellaswag(ex: dict) -> Doc:
    query = _hellaswag_clean(ex["activity_label"] + ": " + ex["ctx_a"] + " " + ex["ctx_b"].capitalize())
    endings = [_hellaswag_clean(e) for e in ex["endings"]]
    return _choice_doc(query, endings, int(ex["label"]), f"{query} {endings[int(ex['label'])]}")


def winogrande(ex: dict) -> Doc:
    s = ex["sentence"]
    i = s.index("_")
    contexts = (s[:i] + ex["option1"], s[:i] + ex["option2"])
    target = s[i + 1:].strip()
    gold = int(ex["label"]) if "label" in ex else int(ex["answer"]) - 1
    filled = contexts[gold] + TARGET_DELIMITER + target
    return Doc(contexts, (TARGET_DELIMITER + target,), gold, contexts, filled, filled)


def anli(ex: dict) -> Doc:
    return _choice_doc(f"{ex['context']}\nQuestion: {ex['hypothesis']} True, False, or Neither?\nAnswer:",
                       ["True", "Neither", "False"], "enc".index(ex["label"]), f"{ex['context']} {ex['hypothesis']}")


def hans(ex: dict) -> Doc:
    return _choice_doc(f"{ex['sentence1']}\nQuestion: {ex['sentence2']} True or False?\nAnswer:",
                       ["True", "False"], 0 if ex["label"] else 1, f"{ex['sentence1']} {ex['sentence2']}")


def wic_word(ex: dict) -> str:
    """The target word as written in sentence 1 (SuperGLUE's sentence1[start1:end1]): the release
    gives its token index in the space-tokenised sentence."""
    return ex["sentence1"].split(" ")[int(ex["indices"].split("-")[0])]


def wic(ex: dict) -> Doc:
    return _choice_doc(f"Sentence 1: {ex['sentence1']}\nSentence 2: {ex['sentence2']}\nQuestion: Is the word "
                       f"'{wic_word(ex)}' used in the same way in the two sentences above?\nAnswer:",
                       ["no", "yes"], int(ex["label"]), f"{ex['sentence1']} {ex['sentence2']}")


RENDER = {"lambada": lambada, "boolq": boolq, "race_h": race, "piqa": piqa, "hellaswag": hellaswag,
          "winogrande": winogrande, "anli_r2": anli, "hans": hans, "wic": wic}


def render(task: TaskData, fewshot_pool: bool = True) -> tuple[list[Doc], list[Doc] | None]:
    """The task's scored docs and its few-shot pool (None: shots come from the scored docs themselves)."""
    fn = RENDER[task.name]
    pool = None
    if task.name == "race_h":
        docs = [race(g) for g in race_articles(task.examples)]
    else:
        docs = [fn(ex) for ex in task.examples]
        if fewshot_pool and task.fewshot:
            pool = [fn(ex) for ex in task.fewshot]
    return docs, pool


# lm-eval's sampler draws k + 1 shots for the tasks whose YAML has no test split (its few-shot split
# then "equals" the test split) and drops the scored doc from them; k for LAMBADA, RACE and ANLI, and
# from lm-eval 0.4.10 on it keeps a shot equal to the scored doc there (0.4.0-0.4.9 dropped it): the doc
# and its answer are then in its own prompt (LAMBADA at k=15: 18 of 5,153 docs; RACE at k=10: 5 of
# 1,045). Here such a shot is always dropped (k - 1 shots then); every other prefix is lm-eval 0.4.13's
# for the same pool and seed.
DRAWS_ONE_MORE = {"boolq", "piqa", "hellaswag", "winogrande", "wic", "hans"}


def fewshot_prefixes(indices: list[int], docs: list[Doc], pool: list[Doc] | None, k: int, seed: int,
                     draw_one_more: bool = True) -> list[str]:
    """The few-shot prefix of each scored doc (`indices` into `docs`): shots drawn by one seeded
    generator per task, in doc order, from the few-shot split (`pool`) or, without one, from the task's
    own docs. k + 1 are drawn with `draw_one_more`, else k; a shot equal to the scored doc is dropped and
    the first k of the rest kept (lm-eval's sampler, but for the drop without `draw_one_more`)."""
    if k == 0:
        return [""] * len(indices)
    source = docs if pool is None else pool
    draw = k + 1 if draw_one_more else k
    if len(source) < draw:
        raise ConfigError(f"{k}-shot needs {draw} few-shot examples, the few-shot split has {len(source)}")
    rng = random.Random(seed)
    out = []
    for i in indices:
        shots = [source[j] for j in rng.sample(range(len(source)), draw) if source[j] != docs[i]][:k]
        out.append(SHOT_SEPARATOR.join(s.shot for s in shots) + SHOT_SEPARATOR)
    return out
