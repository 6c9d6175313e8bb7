"""The currency index: every symbol and name CLDR knows, mapped to ISO 4217 codes.

Babel ships CLDR, but reading all of its ~1,000 locales takes over a second, too slow for every
crawl process to do at start. The index is therefore built from Babel once and shipped as
``cldr_currencies.json``; ``tests/test_currency.py`` checks that the shipped file is exactly what
the installed Babel gives, so it is never edited by hand and never goes stale. Rebuild it with::

    python -m scraper.cleaning.currency_index
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

__all__ = ["INDEX_NAME", "INDEX_PATH", "build_index", "normalise_mark"]

INDEX_NAME = "cldr_currencies.json"
INDEX_PATH = Path(__file__).with_name(INDEX_NAME)

# Format characters (the right-to-left marks CLDR puts in Arabic symbols) and spaces carry no
# meaning inside a mark: "AU $", "AU$" and "د.ك.\u200f" must meet their index entries.
_IGNORED = re.compile(r"[\s\u00a0\u200b-\u200f\u202a-\u202e\u2066-\u2069\u061c]+")


def normalise_mark(text: str) -> str:
    """The index key of a currency mark or name: NFKC, case-folded, no spaces, no outer dots."""
    text = unicodedata.normalize("NFKC", text)
    return _IGNORED.sub("", text).casefold().strip(".")


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


if __name__ == "__main__":
    main()
