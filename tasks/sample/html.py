"""HTML page chrome for the sample crawl, sized like real pages.

Real pages carry tens of KB of styles, scripts, menus and footers around a few KB of text; a
sample of bare <p> pages would misrepresent where extraction time goes. All of it is boilerplate
that extraction must remove, generated deterministically from the caller's RNG.
"""
from __future__ import annotations

import html
import random

SECTIONS = ("news world politics business technology science health sports culture travel food "
            "opinion video podcasts weather local education climate markets autos").split()


def _style(rng: random.Random) -> str:
    rules = []
    for i in range(120):
        sel = f".{rng.choice(SECTIONS)}-{i} > .item-{rng.randint(1, 99)}"
        rules.append(f"{sel}{{margin:{rng.randint(0, 24)}px {rng.randint(0, 24)}px;color:#{rng.getrandbits(24):06x};"
                     f"font-size:{rng.randint(10, 22)}px;display:{rng.choice(['flex', 'block', 'grid'])}}}")
    return "<style>" + "".join(rules) + "</style>"


def _script(rng: random.Random, n: int) -> str:
    lines = [f"var cfg_{i}={{id:'{rng.getrandbits(40):010x}',slot:'ad-{rng.randint(1, 40)}',"
             f"sizes:[[{rng.choice([300, 728, 970])},{rng.choice([90, 250, 600])}]],lazy:{rng.choice(['true', 'false'])}}};"
             f"window.dataLayer=window.dataLayer||[];dataLayer.push({{event:'slot_{i}',value:cfg_{i}}});"
             for i in range(n)]
    return "<script>" + "".join(lines) + "</script>"


def _menu(rng: random.Random) -> str:
    cols = []
    for sec in rng.sample(SECTIONS, 10):
        links = "".join(f'<li><a href="/{sec}/{rng.randint(100, 9999)}">{sec.title()} {w}</a></li>'
                        for w in rng.sample(["today", "latest", "analysis", "archive", "live", "guides",
                                             "reviews", "explainers", "photos", "data"], 6))
        cols.append(f'<li class="menu-col"><a href="/{sec}">{sec.title()}</a><ul>{links}</ul></li>')
    return f'<nav class="mega-menu"><ul>{"".join(cols)}</ul></nav>'


def _footer(rng: random.Random) -> str:
    links = " ".join(f'<a href="/{s}">{s.title()}</a>' for s in SECTIONS * 2)
    return (f'<div class="newsletter"><form action="/subscribe"><label>Get our newsletter</label>'
            f'<input type="email" name="email"><button>Subscribe</button></form></div>'
            f'<div class="share">Share on <a href="#">Facebook</a> <a href="#">Twitter</a> <a href="#">Email</a></div>'
            f'<footer><div class="links">{links}</div><p>Copyright {rng.randint(2001, 2020)} Example Media. '
            f'All rights reserved. <a href="/privacy">Privacy</a> <a href="/terms">Terms</a> '
            f'<a href="/cookies">Cookie settings</a></p></footer>')


def page_html(rng: random.Random, title: str, paras: list[str], lang: str = "en") -> str:
    related = "".join(f'<li><a href="/p/{rng.randint(1, 99999)}">Related story {rng.randint(1, 999)}: '
                      f'{rng.choice(SECTIONS)} update</a></li>' for _ in range(15))
    body = "".join(f"<p>{html.escape(p)}</p>" for p in paras)
    return (f'<!DOCTYPE html><html lang="{lang}"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'{_style(rng)}{_script(rng, 30)}</head><body>'
            f'<header><div class="logo"><a href="/">Example Media</a></div>{_menu(rng)}</header>'
            f'<div class="cookie-banner">We use cookies to improve your experience. Accept all cookies.</div>'
            f'<aside class="sidebar"><h3>Popular</h3><ul>{related}</ul></aside>'
            f'<main><article><h1>{html.escape(title)}</h1>{body}</article></main>'
            f'{_footer(rng)}{_script(rng, 20)}</body></html>')
