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
       "familiar complex gentle northern southern practical curious patient useful hidden simple "
       "crowded distant fragile generous hollow humble vivid weathered sturdy brief costly").split()
VERBS = ("describes examines supports changes reveals follows improves connects measures records "
         "protects explains shapes reduces surrounds influences replaces requires visits repairs "
         "questions borrows praises ignores maps sketches restores studies doubts").split()
ADV = ("slowly often rarely carefully gradually suddenly usually clearly quietly eventually "
       "briefly openly patiently proudly nearly firmly happily partly").split()
OPENERS = ("In the spring", "According to the report", "For many years", "Later that week",
           "In most regions", "By the end of the season", "During the survey", "As a result", "Last winter",
           "Before the storm", "After a long debate", "Since then", "On most mornings", "Years later",
           "Without much warning", "In the north", "Around midsummer", "At first", "Meanwhile", "Even so",
           "Two decades ago", "Until recently", "On balance", "In practice")
SUBJ = ("the team", "a researcher", "the committee", "the old guide", "each visitor", "the council",
        "a small group", "the author", "my neighbour", "our editor", "the mayor", "a young farmer",
        "the museum", "her brother", "the local paper", "a retired teacher", "the engineers", "most readers")
CONNECT = ("near the", "beside a", "of the", "under a", "behind the", "along a", "within the", "across the",
           "next to a", "around the", "beyond a", "toward the")

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
        parts += [rng.choice(CONNECT), rng.choice(nouns), rng.choice(CONNECT), rng.choice(ADJ), rng.choice(nouns)]
    if rng.random() < 0.4:
        parts += [rng.choice(("while", "because", "although", "since", "until", "whenever")), rng.choice(SUBJ),
                  rng.choice(ADV), rng.choice(VERBS), rng.choice(("a", "the", "one", "every")), rng.choice(nouns)]
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


# Low-quality web pages the filter stage must remove, modelled on what crawls are full of.
NAV = ("Home", "About us", "Contact", "Login | Register", "Shop", "Blog", "FAQ", "Search", "Sitemap", "Careers",
       "Share on Facebook", "Tweet", "Read more...", "Next page >", "Back to top", "Subscribe", "Menu")
COOKIE = ("This website uses cookies to improve your experience.", "We use cookies to personalise content and ads.",
          "By continuing to browse you agree to our Cookie Policy.", "Please enable JavaScript to view this page.",
          "Read our Privacy Policy and Terms of Use.")
LOREM = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et "
         "dolore magna aliqua ut enim ad minim veniam quis nostrud exercitation ullamco laboris nisi").split()
PRODUCTS = ("roof repair", "car insurance", "payday loans", "weight loss pills", "cheap flights", "web hosting",
            "dental implants", "phone cases", "crypto trading", "moving services", "hair extensions", "solar panels")
CITIES = ("Springfield", "Riverside", "Fairview", "Madison", "Georgetown", "Clinton", "Salem", "Franklin")
SEO = ("Looking for the best {p} in {c}?", "Our {p} deals are guaranteed to beat any price.",
       "Call now for a free {p} quote with no obligation.", "We offer affordable {p} with fast delivery and 24/7 support.",
       "Top rated {p} experts near you are waiting for your order.", "Save up to 70% on {p} when you order online today.",
       "Customers in {c} trust us for reliable {p} at unbeatable prices.", "Get instant approval and exclusive {p} coupons.",
       "Compare {p} offers from trusted providers and save money fast.", "Limited time discount on premium {p} packages.",
       "Why pay more for {p} when you can have the best for less?", "Order your {p} today and get a bonus gift with it.",
       "Thousands of happy clients in {c} chose our {p} service.", "Click the button below to claim your {p} voucher.",
       "Our {p} specialists answer every call within minutes.", "Free shipping on all {p} orders over fifty dollars.",
       "Sign up for the newsletter and win a year of {p} for free.", "Best {p} reviews and ratings updated every week.",
       "Do not miss the biggest {p} sale of the year in {c}.", "Trusted by professionals, loved by families: that is our {p}.")


def boilerplate_paragraphs(rng: random.Random) -> list[str]:
    """Navigation, share buttons and cookie banners around a sentence or two of content."""
    out = [rng.choice(NAV) for _ in range(rng.randint(4, 9))] + rng.sample(COOKIE, rng.randint(1, 3))
    out.insert(rng.randint(0, len(out)), sentence(rng, rng.choice(sorted(TOPICS))))
    return out + [f"\u00a9 {rng.randint(2005, 2020)} All rights reserved", rng.choice(NAV)]


def repetitive_paragraphs(rng: random.Random, topic: str) -> list[str]:
    """A template repeated down the page (listings, tag clouds, auto-generated pages)."""
    head = paragraphs(rng, topic, 1)
    unit = " ".join(sentence(rng, topic) for _ in range(2))
    return head + [unit] * rng.randint(4, 8)


def lorem_paragraphs(rng: random.Random) -> list[str]:
    """An unfinished template: placeholder text."""
    out = []
    for _ in range(rng.randint(3, 5)):
        words = [rng.choice(LOREM) for _ in range(rng.randint(25, 45))]
        out.append("Lorem ipsum " + " ".join(words) + ".")
    return out


def seo_paragraphs(rng: random.Random) -> list[str]:
    """Keyword-stuffed marketing copy: fluent enough for the rules, what a quality classifier is for."""
    p, c = rng.choice(PRODUCTS), rng.choice(CITIES)
    lines = [t.format(p=rng.choice((p, p, rng.choice(PRODUCTS))), c=c) for t in rng.sample(SEO, rng.randint(8, 14))]
    cut = sorted(rng.sample(range(1, len(lines)), 2))
    return [" ".join(lines[a:b]) for a, b in zip([0, *cut], [*cut, len(lines)])]
