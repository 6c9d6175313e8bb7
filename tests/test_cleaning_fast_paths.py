"""The cleaners' fast paths answer exactly what their full paths answer.

Each fast path (an already-canonical URL, a price of a common shape, plain ASCII text) is turned
off with monkeypatch and the result compared, on the demo catalogue and on generated inputs
chosen to sit on the edges of each shape.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scraper.cleaning import price as price_module
from scraper.cleaning import text as text_module
from scraper.cleaning import urls as urls_module
from scraper.demo_site.catalog import Catalog

MARKS = ["", "$", "€", "£", "¥", "₹", "₽", "USD", "EUR", "GBP", "JPY", "KWD", "ABC", "CAD", "SEK"]


def _numbers(rng: random.Random) -> str:
    whole = rng.randint(0, 10 ** rng.randint(1, 9))
    shapes = [
        str(whole),
        f"{whole:,}.{rng.randint(0, 99):02d}",
        f"{whole:,}".replace(",", ".") + f",{rng.randint(0, 99):02d}",
        f"{whole}.{rng.randint(0, 999):0{rng.randint(1, 3)}d}",
        f"{whole},{rng.randint(0, 999):0{rng.randint(1, 3)}d}",
        f"{whole:,}",
        "٣٤.٥٠",
    ]
    return rng.choice(shapes)


def _prices() -> list[str]:
    rng = random.Random(7)
    found = [p.price_display for p in Catalog(products=1000).products if p.price_display]
    for _ in range(4000):
        before, after = rng.choice(MARKS), rng.choice(MARKS)
        found.append(
            f"{before}{rng.choice(['', ' ']) if before else ''}{_numbers(rng)}"
            f"{rng.choice(['', ' ']) if after else ''}{after}"
        )
    return found


def test_prices_read_alike_with_and_without_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = _prices()
    settings = [("USD", "US"), (None, None), ("EUR", "DE"), ("KWD", "KW")]
    fast = [price_module.read_price(c, d, t) for c in cases for d, t in settings]
    monkeypatch.setattr(price_module, "_read_simple", lambda *args: None)
    full = [price_module.read_price(c, d, t) for c in cases for d, t in settings]
    assert fast == full


def test_urls_canonicalised_alike_with_and_without_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = ["a.b", "A.b", "127.0.0.1", "x-y.com", "xn--bcher-kva.de", "a.b.", "-a.com", "a..b", "www.ex.com"]
    ports = ["", ":80", ":443", ":8080", ":08080", ":65535", ":65536"]
    paths = [
        "",
        "/",
        "/p/1.html",
        "/a/../b",
        "/./x",
        "/.well-known",
        "//x",
        "/x//y",
        "/a b",
        "/%41",
        "/~u/_x-y.z",
        "/a/.",
        "/a/..",
        "/é",
        "/a?b",
        "/a#b",
        "/A/B",
    ]
    cases = [
        f"{s}://{h}{p}{path}" for s in ("http", "https", "HTTP", "ftp") for h in hosts for p in ports for path in paths
    ]
    fast = [urls_module.canonical_url(u) for u in cases]
    monkeypatch.setattr(urls_module, "_already_canonical", lambda url: False)
    assert fast == [urls_module.canonical_url(u) for u in cases]


def test_text_cleaned_alike_with_and_without_the_fast_path() -> None:
    def full(raw: str) -> str | None:
        text = raw
        if "<" in text:
            text = text_module._strip_html(text)
        if "&" in text:
            text = text_module.replace_entities(text)
        if not text.isascii():
            text = text_module.unicodedata.normalize("NFC", text)
        return text_module._WHITESPACE.sub(" ", text).strip() or None

    rng = random.Random(3)
    alphabet = (
        "ab \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u200b\ufeff<>&;é"
        "\u1680\u180e\u2000\u2009\u200a\u2028\u2029\u202f\u205f\u2060\u3000\u0301ё\U0001f600"
    )
    cases = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(20000)]
    assert [text_module.clean_text(c) for c in cases] == [full(c) for c in cases]

    @given(st.text())
    @settings(max_examples=3000, deadline=None)
    def any_text(raw: str) -> None:
        assert text_module.clean_text(raw) == full(raw)

    any_text()
