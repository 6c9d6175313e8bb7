"""Numbers as a locale writes them: CLDR's decimal and grouping symbols, digits of any script.

price-parser guesses which of ``.`` and ``,`` is the decimal mark from the number's shape; on a
page that declares its locale the guess is not needed, and where it is wrong it stores a wrong
number as valid (``CHF 1’025.23`` -> 1.00, ``٧٫٥٠`` -> 50). Here every digit run of a text is
rewritten as a plain ASCII number (``1025.23``) by the locale's own symbols (CLDR, through
Babel), or refused with the reason: exponent notation, a symbol the locale does not use between
digits, a second decimal mark, or groups the locale does not make. A refusal is a reject for the
caller, never a shorter number.

Without a locale only what cannot be misread is rewritten: digits of other scripts, the Arabic
decimal and grouping marks (``٫`` ``٬``), the typographic apostrophe (``’``) and the Adlam comma
as groupings; ``.`` and ``,`` are left to price-parser's guess.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .language import parse_locale

__all__ = ["NumberSymbols", "NumberError", "ascii_digits", "locale_symbols", "normalise_numbers"]

# Characters that may stand between the digits of one number in some locale. Spaces join a run
# only where the locale groups with a space.
_SEPARATORS = ".,'’\u066b\u066c\u2e41\u060c\u00b7"
_SPACES = " \u00a0\u202f\u2009"
# What a page writes for a grouping symbol CLDR gives otherwise: an ASCII apostrophe for ’,
# any space for a no-break or narrow no-break space.
_GROUP_VARIANTS = {"’": "'’", "'": "'’", **{space: _SPACES for space in _SPACES}}
_EXPONENT = re.compile(r"[eE][+-]?\d")
_NEUTRAL = str.maketrans({"\u066b": ".", "\u066c": ",", "’": "'", "\u2e41": ","})


class NumberError(ValueError):
    """A digit run that the locale's symbols do not read as one number; the message says why."""


@dataclass(frozen=True)
class NumberSymbols:
    locale: str
    decimals: frozenset[str]
    groups: frozenset[str]
    primary: int  # the size of the last group before the decimal mark (3 but in a few locales)
    secondary: int  # the size of the groups before it (2 for the Indian lakh grouping)
    run: re.Pattern[str]


@lru_cache(maxsize=1024)
def locale_symbols(tag: str | None) -> NumberSymbols | None:
    """The number symbols of a locale tag (``de-CH``, ``pt_BR``, ``ar-EG``), None if unknown.

    Both the Latin-digit symbols and those of the locale's own numbering system are accepted
    (``ar-EG`` pages write ``1,234.5`` and ``١٬٢٣٤٫٥``), unless one's decimal mark is the
    other's grouping, in which case the Latin ones alone decide.
    """
    if not tag:
        return None
    from babel.numbers import get_decimal_symbol, get_group_symbol

    locale = parse_locale(tag)
    if locale is None:
        return None
    decimals = {get_decimal_symbol(locale)}
    groups = set(_GROUP_VARIANTS.get(get_group_symbol(locale), get_group_symbol(locale)))
    native_decimal = get_decimal_symbol(locale, numbering_system="default")
    native_group = get_group_symbol(locale, numbering_system="default")
    native_groups = set(_GROUP_VARIANTS.get(native_group, native_group))
    if native_decimal not in groups and not (native_groups & decimals):
        decimals.add(native_decimal)
        groups |= native_groups
    pattern = locale.decimal_formats.get(None)
    primary, secondary = pattern.grouping if pattern is not None else (3, 3)
    joiners = "".join(sorted((decimals | groups) & set(_SEPARATORS + _SPACES)))
    others = "".join(sorted(set(_SEPARATORS) - set(joiners)))
    run = re.compile(rf"\d(?:[\d{re.escape(joiners + others)}]*\d)?")
    return NumberSymbols(str(locale), frozenset(decimals), frozenset(groups), primary, secondary, run)


def normalise_numbers(text: str, symbols: NumberSymbols | None) -> str:
    """*text* with each number written as ASCII digits and ``.`` as the decimal mark.

    Raises NumberError when a number cannot be read by *symbols* (exponent notation in any
    case). Without symbols only unmistakable marks are rewritten (see the module's doc).
    """
    match = _EXPONENT.search(text)
    if match is not None and match.start() > 0 and text[match.start() - 1].isdigit():
        raise NumberError("exponent notation is not a price")
    if symbols is None:
        if text.isascii():
            return text
        return ascii_digits(text.translate(_NEUTRAL))
    out: list[str] = []
    last = 0
    for found in symbols.run.finditer(text):
        out.append(text[last : found.start()])
        try:
            out.append(_read_run(found.group(), symbols))
        except NumberError:
            # A page that declares "en" and writes "1.234,56 €": a shape only one reading fits,
            # whatever the locale, is no guess. A shape two readings fit ("1,234") is refused.
            shaped = _read_shape(found.group())
            if shaped is None:
                raise
            out.append(shaped)
        last = found.end()
    out.append(text[last:])
    return "".join(out)


def _read_shape(run: str) -> str | None:
    """*run* read by its shape alone, when exactly one convention reads it, else None.

    The decimal mark is the last separator when it occurs once, after every grouping, and the
    groups before it are whole; "." or "," alone and once is the decimal mark unless exactly
    three digits follow it (then it may be either).
    """
    marks = [ch for ch in run if not ch.isdigit()]
    if not marks:
        return None
    kinds = set(marks)
    last = marks[-1]
    if last not in ".,\u066b" or marks.count(last) != 1:
        if len(kinds) == 1 and last in ".,'’\u066c\u2e41" + _SPACES:
            decimals, groups = frozenset(), frozenset({last})  # "1.234.567": groups only
        else:
            return None
    elif len(kinds) == 1:
        if len(run) - run.index(last) - 1 == 3:
            return None  # "1,234" or "1.234": the locale's business, and it did not read it
        decimals, groups = frozenset({last}), frozenset()
    else:
        decimals, groups = frozenset({last}), frozenset(kinds - {last})
        if groups & set(".,") and len(groups) > 1:
            return None
    symbols = NumberSymbols("(any)", decimals, groups, 3, 3, _ANY_RUN)
    try:
        return _read_run(run, symbols)
    except NumberError:
        return None


_ANY_RUN = re.compile(r"\d")


def ascii_digits(text: str) -> str:
    """*text* with the digits of any script written as ASCII digits."""
    return "".join(str(unicodedata.decimal(ch)) if ch.isdigit() and not ch.isascii() else ch for ch in text)


def _read_run(run: str, symbols: NumberSymbols) -> str:
    parts: list[str] = []
    marks: list[str] = []
    digits: list[str] = []
    for ch in run:
        if ch.isdigit():
            digits.append(ch if ch.isascii() else str(unicodedata.decimal(ch)))
            continue
        parts.append("".join(digits))
        digits = []
        marks.append(ch)
    parts.append("".join(digits))
    if not marks:
        return parts[0]
    where = f"{run!r} in locale {symbols.locale}"
    fix = "declare the page's locale (meta 'locale') or the field's decimal_separator"
    kinds = []
    for mark in marks:
        if mark in symbols.decimals:
            kinds.append("d")
        elif mark in symbols.groups:
            kinds.append("g")
        else:
            raise NumberError(f"{mark!r} is neither the decimal mark nor the grouping of {where}; {fix}")
    if kinds.count("d") > 1 or ("d" in kinds and kinds[-1] != "d"):
        raise NumberError(f"two decimal marks or a grouping after the decimal mark: {where}; {fix}")
    whole = parts[:-1] if kinds[-1] == "d" else parts
    if len(whole) > 1:
        last, middle, first = whole[-1], whole[1:-1], whole[0]
        sizes = {symbols.secondary, 3}
        if (
            len(last) not in (symbols.primary, 3)
            or not 1 <= len(first) <= max(sizes)
            or len({len(p) for p in middle} - sizes)
            or len({len(p) for p in middle}) > 1
            or (middle and len(first) > len(middle[0]))
        ):
            raise NumberError(f"the digit groups do not fit {where}; {fix}")
    if kinds[-1] == "d":
        return "".join(whole) + "." + parts[-1]
    return "".join(whole)


def check_locale(settings: Any) -> None:
    """``CLEAN_LOCALE`` must name a locale CLDR knows; raises ConfigError naming it."""
    from ..config import ConfigError

    value = (settings.get("CLEAN_LOCALE") or "").strip()
    if value and locale_symbols(value) is None:
        raise ConfigError(f"CLEAN_LOCALE: {value!r} is no locale CLDR knows (e.g. de-CH, pt-BR, en-IN)")
