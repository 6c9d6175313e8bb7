"""Currency marks -> ISO 4217 codes, from CLDR (through Babel), and each code's minor unit.

A mark is what a page writes next to an amount: an ISO code (``KWD``), a symbol (``€``, ``AU$``,
``zł``, ``د.ك.``), a name (``euro``, ``دينار كويتي``). CLDR lists them per locale; the index built
from it maps each to the codes that write it so. A mark several currencies share (``$``, ``kr``,
``£``) is settled by the spider's default currency, then by the page's territory
(``<html lang="en-CA">``: CAD), then by the reading CLDR gives it in English (``$``: USD); failing
those it is ambiguous, and the caller rejects.

Babel ships CLDR, but reading all of its ~1,000 locales takes over a second, too slow for every
crawl process to do at start. The index is therefore built from Babel once and shipped as
``cldr_currencies.json``; ``tests/test_money.py`` checks that the shipped file is exactly what
the installed Babel gives, so it is never edited by hand and never goes stale. Rebuild it with::

    python -c 'from scraper.cleaning import currency; currency.main()'
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "INDEX_NAME",
    "INDEX_PATH",
    "CurrencyReading",
    "build_index",
    "currency_of",
    "minor_units",
    "normalise_mark",
    "read_mark",
    "shown_digits",
    "territory_of",
]

INDEX_NAME = "cldr_currencies.json"
INDEX_PATH = Path(__file__).with_name(INDEX_NAME)

# Format characters (the right-to-left marks CLDR puts in Arabic symbols) and spaces carry no
# meaning inside a mark: "AU $", "AU$" and "د.ك.\u200f" must meet their index entries.
_IGNORED = re.compile(r"[\s\u00a0\u200b-\u200f\u202a-\u202e\u2066-\u2069\u061c]+")

# Abbreviations shops write that CLDR does not list (it has ₽, ₴ and "KWD", not the "руб.",
# "грн." and "KD" seen on real pages). Only unambiguous ones: a mark missing here is still
# read when its characters are letters (as no currency) or rejected when it is a symbol.
_COMMON_MARKS: dict[str, str] = {
    **dict.fromkeys(["руб", "р", "рублей", "рубля", "рубль", "rbl"], "RUB"),
    **dict.fromkeys(["грн", "hrn"], "UAH"),
    **dict.fromkeys(["zl", "pln"], "PLN"),
    **dict.fromkeys(["fr", "sfr", "chf"], "CHF"),
    "tl": "TRY",
    "dinara": "RSD",
    "₵": "GHS",
    "zk": "ZMW",
    "ks": "MMK",
    "lei": "RON",
    "kn": "HRK",  # replaced by EUR in 2023, so CLDR files it as historical
    "kd": "KWD",
    "bd": "BHD",
    "jd": "JOD",
    "ld": "LYD",
    "dhs": "AED",
    "e£": "EGP",
    "g$": "GYD",
    "j$": "JMD",
    "can$": "CAD",
    "$u": "UYU",
    "$b": "BOB",
    "₤": "GBP",  # the lira sign, on shop pages a stand-in for the pound sign
    "stg": "GBP",
    "pound": "GBP",
    "원": "KRW",
    "đ": "VND",
    "vnđ": "VND",
    "ლ": "GEL",
    "ლარი": "GEL",
    "тг": "KZT",
    "so'm": "UZS",
    "soʻm": "UZS",
    "ksh": "KES",
    "kshs": "KES",
    'ש"ח': "ILS",
    "ש״ח": "ILS",
    "ש'ח": "ILS",
    "جنيه": "EGP",
    "درهم": "AED",
    "ريال": "SAR",
    "ع.د": "IQD",
    "ل.د": "LYD",
    "د.ا": "JOD",
    "دج": "DZD",
}

# Marks CLDR gives to one currency that shops of a neighbouring country write for theirs too
# ("сом." is the Kyrgyz som in CLDR and the Tajik somoni on Tajik pages): the page's territory
# decides between them, as for "$".
_SHARED_MARKS: dict[str, tuple[str, ...]] = {
    "сом": ("KGS", "TJS"),
}
# A mark several currencies share whose usual reading CLDR's English data does not give.
_PREFERRED: dict[str, str] = {"c$": "CAD"}

# ISO 4217 minor units where CLDR's rounding digits differ (CLDR rounds these to whole units
# for display); storage keeps what the standard defines.
_ISO_MINOR_UNITS: dict[str, int] = {
    "IQD": 3,
    **dict.fromkeys("AFN ALL IRR KPW LAK LBP MGA MMK RSD SLL SOS SYP YER".split(), 2),
}

# "AU$", "TT$", "CAD$": a territory or an ISO code glued to a dollar sign.
_PREFIXED_DOLLAR = re.compile(r"^([a-z]{2,3})\$$")
# Ordinary words that are also ISO codes; written in lower case they are words ("all", "top").
_CODE_WORDS = frozenset("all top cup mad pen try bob mop sos php gel lak".split())
# Symbols a mark may contain and still be "no mark" ("+ VAT", "~12", "12 *").
_HARMLESS_SYMBOLS = frozenset("+=<>~|±×÷−^`´¨¯°")


def normalise_mark(text: str) -> str:
    """The index key of a currency mark or name: NFKC, case-folded, no spaces, no outer dots."""
    text = unicodedata.normalize("NFKC", text)
    return _IGNORED.sub("", text).casefold().strip(".")


@lru_cache(maxsize=1)
def _index() -> dict[str, Any]:
    # Through importlib.resources: scrapyd runs the project from a zipped egg.
    data = json.loads(resources.files(__package__).joinpath(INDEX_NAME).read_text(encoding="utf-8"))
    data["codes"] = frozenset(data["codes"])
    data["current"] = frozenset(data["current"])
    return data


def minor_units(code: str | None) -> int:
    """Digits after the decimal mark for *code* (ISO 4217): 0 for JPY, 3 for KWD, else usually 2."""
    if not code:
        return 2
    if code in _ISO_MINOR_UNITS:
        return _ISO_MINOR_UNITS[code]
    return int(_index()["precision"].get(code, 2))


def shown_digits(code: str | None) -> int:
    """Digits a page formatted by CLDR shows after the decimal mark for *code*: 0 for IQD
    (whose ISO 4217 minor unit is 3) and the others CLDR rounds to whole units, else
    :func:`minor_units`."""
    if not code:
        return 2
    return min(minor_units(code), int(_index()["precision"].get(code, 2)))


@lru_cache(maxsize=4096)
def _codes_for(mark: str) -> tuple[str, ...]:
    """Every current code *mark* may stand for, most used first ("" if none)."""
    index = _index()
    key = normalise_mark(mark)
    if not key:
        return ()
    if key in _COMMON_MARKS:
        return (_COMMON_MARKS[key],)
    if key in _SHARED_MARKS:
        return _SHARED_MARKS[key]
    stripped = mark.strip(" .:")
    if len(stripped) == 3 and stripped.isalpha() and stripped.isascii() and stripped.upper() in index["codes"]:
        if not (stripped.islower() or stripped.istitle()) or stripped.lower() not in _CODE_WORDS:
            return (stripped.upper(),)
    for table in (index["symbols"], index["names"]):
        found = table.get(key)
        if found:
            return tuple(found)
    dollar = _PREFIXED_DOLLAR.match(key)
    if dollar:
        prefix = dollar.group(1).upper()
        if prefix in index["codes"]:
            return (prefix,)
        dollars = set(index["symbols"].get("$", ()))
        return tuple(code for code in _territory_codes(prefix) if code in dollars)[:1]
    return ()


@dataclass(frozen=True)
class CurrencyReading:
    """What a mark says: a code, or why there is none (``problem``)."""

    code: str | None = None
    problem: str | None = None


def _decide(mark: str, codes: tuple[str, ...], default: str | None, territory: str | None) -> CurrencyReading:
    if len(codes) == 1:
        return CurrencyReading(codes[0])
    if default in codes:
        return CurrencyReading(default)
    for code in _territory_codes(territory):
        if code in codes:
            return CurrencyReading(code)
    key = normalise_mark(mark)
    preferred = _PREFERRED.get(key) or _index()["preferred"].get(key)
    if preferred in codes:
        return CurrencyReading(preferred)
    listed = ", ".join(sorted(codes)[:8])
    return CurrencyReading(problem=f"ambiguous currency {mark!r} ({listed}): set the spider's default_currency")


def _is_letter(mark: str) -> bool:
    key = normalise_mark(mark)
    return len(key) == 1 and key.isascii() and key.isalpha()


@lru_cache(maxsize=256)
def _territory_codes(territory: str | None) -> tuple[str, ...]:
    if not territory:
        return ()
    from babel.numbers import get_territory_currencies

    try:
        return tuple(get_territory_currencies(territory))
    except Exception:  # an unknown territory decides nothing
        return ()


@lru_cache(maxsize=4096)  # a shop writes a handful of marks; the reading is immutable
def read_mark(mark: str, default: str | None = None, territory: str | None = None) -> CurrencyReading | None:
    """The currency *mark* names; None when it names none (a word, no symbol at all)."""
    codes = _codes_for(mark)
    if codes and _is_letter(mark):
        # One letter ("R", "G", "L") is a currency only where the shop says so: elsewhere it is
        # far more often a size or a grade than a rand or a gourde.
        local = _territory_codes(territory)
        codes = tuple(code for code in codes if code == default or code in local)
        if not codes:
            return None
    if codes:
        return _decide(mark, codes, default, territory)
    if is_unreadable(mark):
        return CurrencyReading(problem=f"unknown currency {mark!r}")
    return None


def is_unreadable(mark: str) -> bool:
    """A mark made of symbols we cannot read (a rare sign, mojibake, U+FFFD), as opposed to words."""
    for ch in mark:
        if ch == "\ufffd":
            return True
        category = unicodedata.category(ch)
        if category in ("Sc", "So", "Sk") or (category == "Sm" and ch not in _HARMLESS_SYMBOLS):
            return True
    return False


def currency_of(text: str, default: str | None = None, territory: str | None = None) -> CurrencyReading:
    """The currency a whole field names (``EUR``, ``€``, ``euro``, ``руб.``), for the currency field."""
    text = " ".join(text.split())
    if not text:
        return CurrencyReading()
    reading = read_mark(text, default, territory)
    if reading is not None:
        return reading
    return CurrencyReading(problem=f"unknown currency {text[:50]!r}")


@lru_cache(maxsize=256)
def territory_of(language: str | None) -> str | None:
    """The territory a language tag points to: ``en-CA`` -> CA, ``sv`` -> SE (CLDR likely subtags)."""
    if not language:
        return None
    parts = re.split(r"[-_]", language.strip())
    for part in parts[1:]:
        if len(part) == 2 and part.isalpha():
            return part.upper()
    from babel.core import get_global

    likely = get_global("likely_subtags").get(parts[0].lower())
    if likely:
        tail = likely.split("_")[-1]
        if len(tail) == 2 and tail.isalpha():
            return tail.upper()
    return None


def _current_codes() -> set[str]:
    """Codes that are legal tender somewhere today: old codes keep their symbols in CLDR
    (``р.`` is the pre-1998 RUR there), but a shop writing them today means the current one."""
    from babel.core import get_global

    current = set()
    for spans in get_global("territory_currencies").values():
        for code, _start, end, tender in spans:
            if end is None and tender:
                current.add(code)
    return current


def build_index() -> dict[str, Any]:
    """Read every CLDR locale through Babel: symbols, names (and plurals), precision."""
    from babel import Locale, localedata
    from babel.numbers import get_currency_precision, list_currencies

    current = _current_codes()
    symbols: dict[str, Counter[str]] = defaultdict(Counter)
    names: dict[str, Counter[str]] = defaultdict(Counter)
    for identifier in sorted(localedata.locale_identifiers()):
        data = Locale.parse(identifier)._data
        for code, symbol in data["currency_symbols"].items():
            if code in current and symbol:
                symbols[normalise_mark(symbol)][code] += 1
        for code, name in data["currency_names"].items():
            if code in current and name:
                names[normalise_mark(name)][code] += 1
        for code, forms in data["currency_names_plural"].items():
            if code in current:
                for name in dict(forms).values():
                    names[normalise_mark(name)][code] += 1
    english = Locale.parse("en")._data["currency_symbols"]
    preferred = {}
    for code, symbol in english.items():
        key = normalise_mark(symbol)
        if code in current and len(symbols.get(key, ())) > 1:
            preferred[key] = code

    def ranked(table: dict[str, Counter[str]]) -> dict[str, list[str]]:
        # Codes the most locales write this way first; a code's own letters are no symbol.
        return {
            key: [code for code, _ in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))]
            for key, counter in sorted(table.items())
            if key and not any(ch.isdigit() for ch in key)
        }

    return {
        "babel": __import__("babel").__version__,
        "codes": sorted(list_currencies()),
        "current": sorted(current),
        "precision": {
            code: get_currency_precision(code)
            for code in sorted(list_currencies())
            if get_currency_precision(code) != 2
        },
        "symbols": ranked(symbols),
        "names": ranked(names),
        "preferred": dict(sorted(preferred.items())),
    }


def main() -> None:
    INDEX_PATH.write_text(json.dumps(build_index(), ensure_ascii=False, sort_keys=True, indent=0) + "\n")
    print(f"wrote {INDEX_PATH}")
