"""Price normalisation: raw scraped price text -> (Decimal amount, ISO 4217 code).

price-parser does the hard part (finding the number, guessing decimal vs thousands
separators). This module adds what it leaves to the caller: which currency the marks around
the amount name (CLDR, see :mod:`scraper.cleaning.currency`), negatives and absurd values,
"free", and rounding to the currency's ISO 4217 minor unit (0 for JPY, 3 for KWD).

Only a price with no currency mark at all takes the default currency: a mark that cannot be
read (an unknown sign, mojibake, U+FFFD) is a problem to report, never silently the default.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from price_parser import Price

from .currency import CurrencyReading, minor_units, read_mark, shown_digits, territory_of
from .numbers import NumberError, locale_symbols, normalise_numbers

__all__ = ["PriceReading", "parse_price", "read_price"]

# Anything above this is a parsing accident (concatenated numbers, SKUs,
# phone numbers), not a shop price.
_MAX_AMOUNT = Decimal(10) ** 9

_FREE = re.compile(r"^\W*(?:free|gratis|gratuit|gratuito|kostenlos|umsonst)\W*$", re.IGNORECASE)

# Plain machine numbers (JSON-LD, data attributes) skip price-parser. "1.299"
# is excluded on purpose: on European pages it means 1299 and price-parser
# already reads it that way, unless the caller says "." is the decimal mark.
_PLAIN_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")
_THOUSANDS_ONLY = re.compile(r"^[1-9]\d{0,2}\.\d{3}$")
# "12.500" next to a 3-decimal currency (KWD, BHD, OMR, JOD...) is twelve and a half.
_THREE_DECIMALS = {
    ".": re.compile(r"^(?:\d+|\d{1,3}(?:,\d{3})+)\.\d{3}$"),
    ",": re.compile(r"^\d{1,3}(?:\.\d{3})+,\d{3}$"),
}

_MINUS = ("-", "\u2212")
# Punctuation around a mark that is not part of it ("US$:", "(USD", "€*").
_MARK_EDGES = ' \t:;,()[]{}*!?"«»–—|'
_DIGIT_RUN = re.compile(r"\d[\d.,'’\s]*\d|\d")
_RANGE = re.compile(r"^\s*(?:-|–|—|~|to|bis|à|a|al|до)\s+\d", re.IGNORECASE)
_NOW = re.compile(r"\b(?:now|jetzt|nu|maintenant|ahora|ora|sale)\W*\S*$", re.IGNORECASE)
# Unmarked numbers that are dates, not prices: "25-09", "12/2026", "July, 2004".
_DATE_LIKE = re.compile(
    r"^(?:\d{1,4}[-/]\d{1,2}(?:[-/]\d{1,4})?|(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?,? \d{4})$",
    re.IGNORECASE,
)

# The common shapes, read without price-parser (~35 µs a call): one mark (an ISO code or a
# currency sign) before or after an amount whose decimal mark is unmistakable (two decimals
# after the last separator, thousands grouped by the other one) or that has no separator.
# Anything else (other digits than ASCII's too), and any mark that does not read as a currency,
# takes the full path below.
_SIMPLE = re.compile(
    r"(?:(?P<before>[A-Z]{3}|[$€£¥₹₩₪₺₽₴]) ?)?"
    r"(?P<number>(?P<dot>[0-9]{1,3}(?:,[0-9]{3})+\.[0-9]{2}|[0-9]+\.[0-9]{2})"
    r"|(?P<comma>[0-9]{1,3}(?:\.[0-9]{3})+,[0-9]{2}|[0-9]+,[0-9]{2})|[0-9]+)"
    r"(?: ?(?P<after>[A-Z]{3}|[$€£¥₹₩₪₺₽₴]))?"
)


@dataclass(frozen=True)
class PriceReading:
    """An amount and its currency, or why the currency could not be told (``problem``)."""

    amount: Decimal | None = None
    currency: str | None = None
    problem: str | None = None


def parse_price(
    raw: object, default_currency: str | None = None, decimal_separator: str | None = None
) -> tuple[Decimal | None, str | None]:
    """Return ``(amount, ISO code)``, or ``(None, None)`` if ``raw`` is no price or its
    currency cannot be told."""
    reading = read_price(raw, default_currency, decimal_separator=decimal_separator)
    if reading.problem:
        return None, None
    return reading.amount, reading.currency


def read_price(
    raw: object,
    default_currency: str | None = None,
    territory: str | None = None,
    decimal_separator: str | None = None,
    currency_hint: str | None = None,
    locale: str | None = None,
) -> PriceReading:
    """Read ``raw`` as a price.

    ``default_currency`` applies to a price without any currency mark, and settles marks several
    currencies share ("$", "kr") when it is one of them; ``territory`` (``CA``, from the page's
    language) settles them next. ``decimal_separator`` ("." for schema.org) overrides the guess.
    ``currency_hint`` is text near the price that may name the currency when the price does not.
    ``locale`` (``de-CH``, the page's or the spider's) gives the decimal and grouping symbols
    (CLDR): a number they do not read is a problem (``amount`` None), never a guess; an explicit
    ``decimal_separator`` is taken over it.
    """
    if isinstance(raw, bool) or raw is None:
        return PriceReading()
    if isinstance(raw, (int, float, Decimal)):
        return _finish(_to_decimal(raw), CurrencyReading(default_currency))
    if not isinstance(raw, str):
        return PriceReading()

    text = raw.strip()
    if not text:
        return PriceReading()
    if _PLAIN_NUMBER.match(text) and (
        decimal_separator == "." or (decimal_separator is None and not _THOUSANDS_ONLY.match(text))
    ):
        return _finish(Decimal(text), _hinted(currency_hint, default_currency, territory))
    if _FREE.match(text):
        return _finish(Decimal(0), _hinted(currency_hint, default_currency, territory))
    # Text without digits ("call for price", "N/A", "free shipping") is not a
    # price; price-parser would turn any "free" substring into 0.
    if not any(ch.isdigit() for ch in text):
        return PriceReading()
    symbols = locale_symbols(locale) if locale and decimal_separator is None else None
    if symbols is not None and territory is None:
        territory = territory_of(locale)
    if decimal_separator is None:
        simple = _read_simple(text, default_currency, territory)
        if simple is not None:
            return simple
    try:
        normalised = normalise_numbers(text, symbols)
    except NumberError as exc:
        return PriceReading(problem=str(exc))
    if symbols is not None:
        # Every number is now written with "." as its only decimal mark and no grouping.
        text, decimal_separator = normalised, "."
    elif normalised is not text:
        text = normalised

    parsed = Price.fromstring(text, decimal_separator=decimal_separator)
    if parsed.amount is None:
        return PriceReading()
    start, end = _amount_span(text, parsed.amount_text)
    if _is_negative(text, start, parsed.currency):
        return PriceReading()
    currency = _currency_around(text, start, end, default_currency, territory)
    if currency is None:
        # price-parser took the first number ("3 issues for only 14,85 EUR"); the price is the
        # one a currency marks, when another one is marked.
        marked = _marked_number(text, end, decimal_separator, default_currency, territory)
        if marked is not None and _RANGE.match(text[end:]):
            currency = marked[1]  # "From 26 to 50 €": the range starts at 26 €
        elif marked is not None:
            parsed, currency = marked
    if currency is None and _DATE_LIKE.match(text):
        return PriceReading()
    currency = currency or _hinted(currency_hint, default_currency, territory)
    amount = parsed.amount
    if decimal_separator is None and minor_units(currency.code) == 3:
        # price-parser reads a last group of three digits as thousands; with a currency of
        # three decimals it is the fils: "12.500", "1,168.757", "1.168,757".
        for mark, pattern in _THREE_DECIMALS.items():
            if pattern.match(parsed.amount_text or ""):
                amount = Price.fromstring(parsed.amount_text or "", decimal_separator=mark).amount or amount
    if (
        symbols is not None
        and amount is not None
        and amount.as_tuple().exponent == -3
        and currency.code
        and shown_digits(currency.code) < 3
    ):
        # "1.234 €" on an "en" page: the locale reads 1.234, a price in euros has no third
        # decimal, and the writer most likely meant 1234. Neither is stored as a guess. IQD
        # has three in ISO 4217 but none where CLDR formats it, so "1.235 IQD" is as ambiguous.
        return PriceReading(
            problem=f"three decimals for {currency.code}, which is written with "
            f"{shown_digits(currency.code)}: a decimal mark by locale {symbols.locale} or a thousands "
            "grouping? declare the locale the page writes in (meta 'locale'), or set decimal_separator "
            "if its prices do have three decimals"
        )
    return _finish(amount, currency)


def _read_simple(text: str, default: str | None, territory: str | None) -> PriceReading | None:
    """What the full path reads in *text* when it has one of the common shapes, else None.

    Every shape read here has one reading whatever the locale (two decimals after the last
    separator, whole groups of three before it), so a declared locale does not change it.
    """
    match = _SIMPLE.fullmatch(text)
    if match is None:
        return None
    before, after = match.group("before"), match.group("after")
    if (before is None) == (after is None):
        return None  # no mark (the default currency's business) or two: the full path decides
    reading = read_mark(before or after, default, territory)
    if reading is None or not reading.code:
        return None
    number = match.group("number")
    if match.group("dot") is not None:
        number = number.replace(",", "")
    elif match.group("comma") is not None:
        number = number.replace(".", "").replace(",", ".")
    return _finish(Decimal(number), reading)


def _to_decimal(value: int | float | Decimal) -> Decimal | None:
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        # str() gives the shortest repr, avoiding binary noise like 12.4999999.
        return Decimal(str(value))
    try:
        dec = Decimal(value)
    except (InvalidOperation, ValueError, OverflowError):
        return None
    return dec if dec.is_finite() else None


# The step each minor unit rounds to (ISO 4217 has 0 to 4).
_QUANTA = {places: Decimal(1).scaleb(-places) for places in range(5)}


def _finish(amount: Decimal | None, currency: CurrencyReading) -> PriceReading:
    if amount is None or amount < 0 or amount > _MAX_AMOUNT:
        return PriceReading()
    if currency.problem:
        return PriceReading(amount, None, currency.problem)
    places = minor_units(currency.code)
    quantum = _QUANTA.get(places) or Decimal(1).scaleb(-places)
    return PriceReading(amount.quantize(quantum, rounding=ROUND_HALF_UP), currency.code)


def _amount_span(text: str, amount_text: str | None) -> tuple[int, int]:
    start = text.find(amount_text) if amount_text else -1
    if start >= 0:
        return start, start + len(amount_text or "")
    # price-parser rewrote the number (e.g. dropped "'" separators): take the first digit run.
    match = _DIGIT_RUN.search(text)
    return (match.start(), match.end()) if match else (0, 0)


def _is_negative(text: str, start: int, symbol: str | None) -> bool:
    """price-parser drops the sign, so look at what precedes the number.

    The minus must touch the number or a currency symbol touching it
    ("-5 €", "€ -5", "-$5", "$-5") so that "Price - 12.50" stays positive.
    """
    prefix = text[:start]
    if prefix.endswith(_MINUS):
        return True
    if symbol:
        stripped = prefix.rstrip()
        if stripped.endswith(symbol):
            return stripped[: -len(symbol)].endswith(_MINUS)
    return False


def _candidates(tokens: list[str], before: bool) -> list[str]:
    """Marks to try on one side of the amount, longest first ("دينار كويتي" before "دينار")."""
    near = tokens[-3:][::-1] if before else tokens[:3]
    words: list[str] = []
    for token in near:
        if any(ch.isdigit() for ch in token):
            break
        words.append(token)
    found = []
    for n in range(len(words), 0, -1):
        chosen = words[:n][::-1] if before else words[:n]
        found.append(" ".join(chosen).strip(_MARK_EDGES))
    if words:
        # "元/台", "€/Stück", "€HT": the mark is the part next to the amount.
        parts = [p for p in words[0].split("/") if p]
        if len(parts) > 1:
            found.append((parts[-1] if before else parts[0]).strip(_MARK_EDGES))
        runs = _symbol_runs(words[0])
        if runs and runs != [words[0]]:
            found.append((runs[-1] if before else runs[0]).strip(_MARK_EDGES))
    return [c for c in found if c]


def _currency_around(
    text: str, start: int, end: int, default: str | None, territory: str | None
) -> CurrencyReading | None:
    before = _candidates(text[:start].split(), before=True)
    after = _candidates(text[end:].split(), before=False)
    readings: list[tuple[str, CurrencyReading]] = []
    for mark in [*before, *after]:
        reading = read_mark(mark, default, territory)
        if reading is not None:
            readings.append((mark, reading))
    if not readings:
        return None
    # An explicit ISO code beats a sign ("$12.50 CAD" is Canadian), a sign beats a word ("a
    # partire da 7,32 €": "da" is Italian before it is the Algerian dinar), and a mark that
    # reads beats one that does not ("€/Stück" is "€" then a word).
    for mark, reading in readings:
        if reading.code and mark.isupper() and len(mark) == 3 and mark.isalpha():
            return reading
    for mark, reading in readings:
        if reading.code and not mark.replace(" ", "").isalpha():
            return reading
    for _mark, reading in readings:
        if reading.code:
            return reading
    return readings[0][1]


def _marked_number(
    text: str, after: int, decimal_separator: str | None, default: str | None, territory: str | None
) -> tuple[Price, CurrencyReading] | None:
    found = []
    for match in _DIGIT_RUN.finditer(text, after):
        currency = _currency_around(text, match.start(), match.end(), default, territory)
        if currency is not None and currency.code:
            parsed = Price.fromstring(text[match.start() : match.end()], decimal_separator=decimal_separator)
            if parsed.amount is not None and not _is_negative(text, match.start(), None):
                found.append((match.start(), parsed, currency))
    if not found:
        return None
    # "Was $120.00 Now $60.00": the current price.
    now = [f for f in found if _NOW.search(text[: f[0]])]
    _start, parsed, currency = now[-1] if now else found[0]
    return parsed, currency


def _hinted(hint: str | None, default: str | None, territory: str | None) -> CurrencyReading:
    """The currency named by text near the price (a label, a separate element), else the default."""
    for token in (hint or "").split():
        token = token.strip(_MARK_EDGES)
        if token:
            for mark in (token, *token.split("/"), *_symbol_runs(token)):
                reading = read_mark(mark, default, territory)
                if reading is not None and reading.code:
                    return reading
    return CurrencyReading(default)


def _symbol_runs(token: str) -> list[str]:
    """ "€HT" -> "€", "MSRP:$" -> "$": a sign glued to a word."""
    return [run.strip("/*") for run in re.findall(r"[^\w\s]+", token) if run.strip("/*.:")]
