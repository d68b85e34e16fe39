"""Deterministic synthetic prose for the sample crawl: English articles on topics, a few
other languages, and keyword spam. Varied enough for language ID, dedup and quality filters."""
from __future__ import annotations

import random

TOPICS = {
    "rivers": "river delta estuary flood basin current sediment bank valley dam bridge fishery wetland",
    "astronomy": "telescope galaxy orbit comet planet nebula observatory eclipse satellite star horizon lens",
    "cooking": "recipe oven flour butter sauce kitchen spice dough harvest market onion garlic",
    "history": "empire archive treaty dynasty chronicle battle monument charter kingdom merchant scholar village",
    "software": "compiler library server database protocol kernel module interface cache thread release patch",
    "medicine": "clinic patient vaccine therapy symptom nurse trial dosage hospital diagnosis surgeon tissue",
    "music": "melody rhythm orchestra chorus guitar composer concert harmony rehearsal album violin tempo",
    "farming": "tractor barley orchard soil irrigation cattle greenhouse seed fertilizer pasture silo crop",
}
ADJ = ("ancient modern careful quiet remarkable local narrow broad early detailed steady rare "
       "familiar complex gentle northern southern practical curious patient useful").split()
VERBS = ("describes examines supports changes reveals follows improves connects measures records "
         "protects explains shapes reduces surrounds influences replaces requires").split()
ADV = "slowly often rarely carefully gradually suddenly usually clearly quietly eventually".split()
OPENERS = ("In the spring", "According to the report", "For many years", "Later that week",
           "In most regions", "By the end of the season", "During the survey", "As a result")
SUBJ = ("the team", "a researcher", "the committee", "the old guide", "each visitor", "the council",
        "a small group", "the author")

FOREIGN = {
    "de": ("der die das und ist nicht mit auf für eine einem wird auch sich dem nach bei Stadt Haus "
           "Wasser Schule Arbeit Zeit Menschen immer heute schon wieder zwischen über unter"),
    "fr": ("le la les et est pas avec sur pour une dans qui que des du aussi très ville maison eau "
           "école travail temps toujours aujourd'hui déjà encore entre nous vous ils"),
    "es": ("el la los las y es no con sobre para una en que del también muy ciudad casa agua "
           "escuela trabajo tiempo siempre hoy ya otra vez entre nosotros ellos pero"),
}
SPAM_WORDS = ("buy cheap pills casino bonus free click now best price discount viagra loans "
              "win cash offer limited deal replica watches").split()


def sentence(rng: random.Random, topic: str) -> str:
    nouns = TOPICS[topic].split()
    parts = [rng.choice(OPENERS) + ",", rng.choice(SUBJ), rng.choice(ADV), rng.choice(VERBS),
             "the", rng.choice(ADJ), rng.choice(nouns)]
    if rng.random() < 0.6:
        parts += ["near the", rng.choice(nouns), "of the", rng.choice(ADJ), rng.choice(nouns)]
    if rng.random() < 0.4:
        parts += ["while the", rng.choice(nouns), rng.choice(VERBS), "a", rng.choice(nouns)]
    return " ".join(parts) + "."


def paragraphs(rng: random.Random, topic: str, n_par: int) -> list[str]:
    return [" ".join(sentence(rng, topic) for _ in range(rng.randint(3, 6))) for _ in range(n_par)]


def foreign_paragraphs(rng: random.Random, lang: str, n_par: int) -> list[str]:
    words = FOREIGN[lang].split()
    out = []
    for _ in range(n_par):
        sents = []
        for _ in range(rng.randint(3, 6)):
            s = " ".join(rng.choice(words) for _ in range(rng.randint(8, 16)))
            sents.append(s[0].upper() + s[1:] + ".")
        out.append(" ".join(sents))
    return out


def spam_paragraphs(rng: random.Random, n_par: int) -> list[str]:
    out = []
    for _ in range(n_par):
        words = [rng.choice(SPAM_WORDS) for _ in range(rng.randint(15, 40))]
        out.append(" ".join(w.upper() if rng.random() < 0.4 else w for w in words) + " !!!")
    return out


def perturb(rng: random.Random, text: str, rate: float) -> str:
    """A near duplicate: replace a fraction of words, as reposting sites and templates do."""
    words = text.split(" ")
    for i in range(len(words)):
        if rng.random() < rate:
            words[i] = rng.choice(ADJ)
    return " ".join(words)
