"""Price normalisation: raw scraped price text -> (Decimal amount, ISO-4217 code).

price-parser does the hard part (finding the number, guessing decimal vs
thousands separators). This module adds what it leaves to the caller:
mapping symbols to ISO codes, rejecting negatives/absurd values, "free",
and per-currency rounding.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from price_parser import Price

__all__ = ["parse_price"]

# Anything above this is a parsing accident (concatenated numbers, SKUs,
# phone numbers), not a shop price.
_MAX_AMOUNT = Decimal(10) ** 9

# Codes we trust when they appear verbatim in the text. Deliberately not the
# full ISO list: codes such as ALL, TOP, CUP, BOB, GEL, MAD, PEN are also
# ordinary uppercase words that show up in price labels ("ALL ITEMS $5").
_ISO_CODES = frozenset(
    """
    USD EUR GBP JPY CNY CAD AUD NZD CHF SEK NOK DKK ISK PLN CZK HUF RON BGN
    RSD HRK RUB UAH BYN KZT TRY ILS AED SAR QAR KWD BHD OMR JOD EGP INR PKR
    LKR NPR BDT IDR MYR SGD HKD TWD THB VND PHP KRW BRL MXN ARS CLP COP UYU
    ZAR NGN KES GHS
    """.split()
)
_ISO_IN_TEXT = re.compile(r"(?<![A-Za-z])([A-Z]{3})(?![A-Za-z])")

# Currencies that write their amounts with a bare "$" / "kr" / "Rs" / "¥":
# the symbol alone cannot tell them apart, so the site's default decides, but
# only when that default is actually one of them (a "$" on a EUR-default
# site is far more likely USD than EUR).
_DOLLAR_FAMILY = frozenset(
    "USD CAD AUD NZD SGD HKD TWD MXN ARS CLP COP UYU BSD BBD BZD BMD BND "
    "FJD GYD JMD KYD LRD NAD SBD SRD TTD XCD".split()
)
_KRONA_FAMILY = frozenset({"SEK", "NOK", "DKK", "ISK"})
_RUPEE_FAMILY = frozenset({"INR", "PKR", "LKR", "NPR", "MUR", "SCR"})
_YEN_FAMILY = frozenset({"JPY", "CNY"})

# Ambiguous symbol -> (family, fallback when the default is outside it).
_AMBIGUOUS: dict[str, tuple[frozenset[str], str | None]] = {
    "$": (_DOLLAR_FAMILY, "USD"),
    "kr": (_KRONA_FAMILY, None),
    "kr.": (_KRONA_FAMILY, None),
    "rs": (_RUPEE_FAMILY, None),
    "rs.": (_RUPEE_FAMILY, None),
    "₨": (_RUPEE_FAMILY, None),
    "¥": (_YEN_FAMILY, "JPY"),
    "￥": (_YEN_FAMILY, "JPY"),
}

# Keys are casefolded, as price-parser returns symbols as written.
_SYMBOLS: dict[str, str] = {
    "€": "EUR",
    "euro": "EUR",
    "£": "GBP",
    "円": "JPY",
    "cn¥": "CNY",
    "元": "CNY",
    "rmb": "CNY",
    "us$": "USD",
    "c$": "CAD",
    "ca$": "CAD",
    "a$": "AUD",
    "au$": "AUD",
    "nz$": "NZD",
    "hk$": "HKD",
    "s$": "SGD",
    "nt$": "TWD",
    "mx$": "MXN",
    "r$": "BRL",
    "fr.": "CHF",
    "zł": "PLN",
    "kč": "CZK",
    "ft": "HUF",
    "lei": "RON",
    "лв": "BGN",
    "лв.": "BGN",
    "₽": "RUB",
    "руб": "RUB",
    "руб.": "RUB",
    "р.": "RUB",
    "р": "RUB",
    "₴": "UAH",
    "грн": "UAH",
    "грн.": "UAH",
    "₸": "KZT",
    "₺": "TRY",
    "tl": "TRY",
    "₪": "ILS",
    "₹": "INR",
    "₩": "KRW",
    "원": "KRW",
    "฿": "THB",
    "₫": "VND",
    "₱": "PHP",
    "rp": "IDR",
    "rm": "MYR",
    "₦": "NGN",
    "₾": "GEL",
}

# ISO 4217 minor units that differ from the usual 2.
_MINOR_UNITS: dict[str, int] = {
    **dict.fromkeys(
        "BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX VND VUV XAF XOF XPF".split(), 0
    ),
    **dict.fromkeys("BHD IQD JOD KWD LYD OMR TND".split(), 3),
}

_FREE = re.compile(
    r"^\W*(?:free|gratis|gratuit|gratuito|kostenlos|umsonst)\W*$", re.IGNORECASE
)

# Plain machine numbers (JSON-LD, data attributes) skip price-parser. "1.299"
# is excluded on purpose: on European pages it means 1299 and price-parser
# already reads it that way.
_PLAIN_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")
_THOUSANDS_ONLY = re.compile(r"^[1-9]\d{0,2}\.\d{3}$")

_MINUS = ("-", "\u2212")


def parse_price(
    raw: object, default_currency: str | None = None
) -> tuple[Decimal | None, str | None]:
    """Return ``(amount, ISO code)`` or ``(None, None)`` if ``raw`` is no price.

    ``default_currency`` is used when the text has no currency, and to settle
    ambiguous symbols ("$", "kr", "Rs", "¥") when it belongs to their family.
    """
    if isinstance(raw, bool) or raw is None:
        return None, None
    if isinstance(raw, (int, float, Decimal)):
        return _finish(_to_decimal(raw), default_currency)
    if not isinstance(raw, str):
        return None, None

    text = raw.strip()
    if not text:
        return None, None
    if _PLAIN_NUMBER.match(text) and not _THOUSANDS_ONLY.match(text):
        return _finish(Decimal(text), default_currency)
    if _FREE.match(text):
        return _finish(Decimal(0), default_currency)
    # Text without digits ("call for price", "N/A", "free shipping") is not a
    # price; price-parser would turn any "free" substring into 0.
    if not any(ch.isdigit() for ch in text):
        return None, None

    parsed = Price.fromstring(text)
    if parsed.amount is None or _is_negative(text, parsed):
        return None, None
    return _finish(parsed.amount, _currency(text, parsed.currency, default_currency))


def _to_decimal(value: int | float | Decimal) -> Decimal | None:
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        # str() gives the shortest repr, avoiding binary noise like 12.4999999.
        return Decimal(str(value))
    try:
        dec = Decimal(value)
    except InvalidOperation:
        return None
    return dec if dec.is_finite() else None


def _finish(
    amount: Decimal | None, currency: str | None
) -> tuple[Decimal | None, str | None]:
    if amount is None or amount < 0 or amount > _MAX_AMOUNT:
        return None, None
    places = _MINOR_UNITS.get(currency or "", 2)
    return amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP), currency


def _is_negative(text: str, parsed: Price) -> bool:
    """price-parser drops the sign, so look at what precedes the number.

    The minus must touch the number or a currency symbol touching it
    ("-5 €", "€ -5", "-$5", "$-5") so that "Price - 12.50" stays positive.
    """
    start = text.find(parsed.amount_text or "\0")
    if start < 0:
        # price-parser rewrote the number (e.g. dropped "'" separators).
        start = next((i for i, ch in enumerate(text) if ch.isdigit()), 0)
    prefix = text[:start]
    if prefix.endswith(_MINUS):
        return True
    symbol = parsed.currency
    if symbol:
        stripped = prefix.rstrip()
        if stripped.endswith(symbol):
            return stripped[: -len(symbol)].endswith(_MINUS)
    return False


def _currency(text: str, symbol: str | None, default: str | None) -> str | None:
    code = _ISO_IN_TEXT.search(text)
    while code:
        # Explicit codes beat symbols: "$12.50 CAD" is Canadian.
        if code.group(1) in _ISO_CODES:
            return code.group(1)
        code = _ISO_IN_TEXT.search(text, code.end())
    if not symbol:
        return default
    key = symbol.casefold()
    if key in _AMBIGUOUS:
        family, fallback = _AMBIGUOUS[key]
        return default if default in family else fallback
    if key in _SYMBOLS:
        return _SYMBOLS[key]
    if symbol.upper() in _ISO_CODES:
        return symbol.upper()
    # Unknown symbols are mostly price-parser guessing from stray letters
    # (it reads "FR" in "FREE" as a currency); trust the site default instead.
    return default
