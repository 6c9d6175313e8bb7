"""Values read by the locale the page declares, proven on CLDR's own formats (through Babel).

Every locale Babel knows formats amounts and dates; each is read back with that locale declared
as a page declares it. The reading is the same value, or a reject with a reason: never another
value stored as valid.
"""

from __future__ import annotations

from datetime import date
from decimal import ROUND_HALF_UP, Decimal

import pytest
from babel import localedata
from babel.dates import format_date
from babel.numbers import format_currency, format_decimal, get_currency_precision, get_territory_currencies

from scraper.cleaning.currency import minor_units, territory_of
from scraper.cleaning.dates import parse_date
from scraper.cleaning.language import date_languages
from scraper.cleaning.price import read_price

LOCALES = [identifier.replace("_", "-") for identifier in localedata.locale_identifiers()]
AMOUNTS = [Decimal(text) for text in ("0.5", "7.5", "12", "1234.56", "1025.23", "12345", "1234567.89")]
DATES = [date(2026, 7, 2), date(2023, 11, 26), date(2019, 6, 5)]


def _currency(tag: str) -> str:
    territory = territory_of(tag)
    found = get_territory_currencies(territory) if territory else []
    return found[0] if found else "EUR"


def test_every_cldr_amount_reads_back_or_is_rejected() -> None:
    exact = rejected = 0
    wrong: list[tuple[str, str, object]] = []
    for tag in LOCALES:
        code = _currency(tag)
        for amount in AMOUNTS:
            for system in ("latn", "default"):
                for kind in ("currency", "decimal"):
                    if kind == "currency":
                        text = format_currency(amount, code, locale=tag.replace("-", "_"), numbering_system=system)
                        # Babel rounds to CLDR's digits of the currency: that is the value shown.
                        shown = amount.quantize(Decimal(1).scaleb(-get_currency_precision(code)))
                        reading = read_price(text, locale=tag)
                    else:
                        text = format_decimal(amount, locale=tag.replace("-", "_"), numbering_system=system)
                        shown = amount
                        reading = read_price(text, default_currency=code, locale=tag)
                    expected = shown.quantize(Decimal(1).scaleb(-minor_units(code)), rounding=ROUND_HALF_UP)
                    if reading.amount is None or reading.problem or reading.currency is None:
                        rejected += 1  # the pipeline rejects it, with the reason
                    elif reading.amount == expected and reading.currency == code:
                        exact += 1
                    else:
                        wrong.append((tag, text, reading))
    total = exact + rejected + len(wrong)
    print(f"amounts: {exact} of {total} (locale x format) pairs exact, {rejected} rejected, {len(wrong)} wrong")
    assert not wrong, wrong[:20]
    assert total > 30_000
    assert exact / total >= 0.99


def test_every_cldr_date_reads_back_or_is_rejected() -> None:
    exact = rejected = 0
    wrong: list[tuple[str, str, object]] = []
    for tag in LOCALES:
        languages = list(date_languages(None, tag) or ()) or None
        for value in DATES:
            for style in ("short", "medium", "long"):
                text = format_date(value, style, locale=tag.replace("-", "_"))
                found = parse_date(text, locale=tag, languages=languages)
                if found is None:
                    rejected += 1
                elif found.date() == value:
                    exact += 1
                else:
                    wrong.append((tag, text, found))
    total = exact + rejected + len(wrong)
    print(f"dates: {exact} of {total} (locale x format) pairs exact, {rejected} rejected, {len(wrong)} wrong")
    assert not wrong, wrong[:20]
    assert total > 9_000
    assert exact / total >= 0.8


@pytest.mark.parametrize(
    ("text", "locale", "amount", "currency"),
    [
        ("CHF 1’025.23", "de-CH", "1025.23", "CHF"),
        ("1’234.50 CHF", "de-CH", "1234.50", "CHF"),
        ("CHF 12’345", "de-CH", "12345.00", "CHF"),
        ("CHF 1’025.23", None, "1025.23", "CHF"),  # no locale: ’ can only be a grouping
        ("٣٤٫٥ د.إ", None, "34.50", "AED"),
        ("١٬٢٣٤ ر.س", None, "1234.00", "SAR"),
        ("١٬٢٣٤٫٥٦ ج.م.\u200f", "ar-EG", "1234.56", "EGP"),
        ("۱٬۲۳۴ ؋", "fa-AF", "1234.00", "AFN"),
        ("7,500 DT", "fr-TN", "7.500", "TND"),
        ("7,500 DT", "ar-TN", "7.500", "TND"),
        ("сом. 12", "tg-TJ", "12.00", "TJS"),
        ("R$ 1.234,56", "pt-BR", "1234.56", "BRL"),
        ("12,34,567.50 ₹", "en-IN", "1234567.50", "INR"),
        ("1 234,50 Kč", "cs", "1234.50", "CZK"),
    ],
)
def test_prices_the_marketplace_stored_wrong(text: str, locale: str | None, amount: str, currency: str) -> None:
    reading = read_price(text, locale=locale)
    assert (reading.amount, reading.currency, reading.problem) == (Decimal(amount), currency, None)


@pytest.mark.parametrize(
    ("text", "locale", "reason"),
    [
        ("1e309", None, "exponent"),
        ("12e3 USD", None, "exponent"),
        ("12e3 USD", "en-US", "exponent"),
        ("12,50 €", "en", "digit groups do not fit"),  # a decimal comma where the locale groups
        ("CHF 1’025.23", "en-US", "neither the decimal mark nor the grouping"),
        ("1,234,5 €", "de", "two decimal marks"),
    ],
)
def test_numbers_the_locale_does_not_read_are_rejected_with_the_reason(text: str, locale: str | None,
                                                                        reason: str) -> None:
    reading = read_price(text, locale=locale)
    assert reading.amount is None
    assert reason in (reading.problem or "")


@pytest.mark.parametrize(
    ("text", "locale", "expected"),
    [
        ("02/07/2020", "pt-BR", date(2020, 7, 2)),
        ("5. 6. 2019", "cs", date(2019, 6, 5)),
        ("02/07/2020", "en-US", date(2020, 2, 7)),
        ("02/07/2020", "en-GB", date(2020, 7, 2)),
        ("2. 7. 2026", "sk", date(2026, 7, 2)),
        ("2. 7. 2026.", "sr", date(2026, 7, 2)),
        ("2 ก.ค. 2569", "th", date(2026, 7, 2)),  # Buddhist era
        ("2026/07/02", "ja", date(2026, 7, 2)),
    ],
)
def test_numeric_and_calendar_dates_by_locale(text: str, locale: str, expected: date) -> None:
    found = parse_date(text, locale=locale, languages=list(date_languages(None, locale) or ()) or None)
    assert found is not None and found.date() == expected


@pytest.mark.parametrize(
    ("text", "locale"),
    [
        ("23/11/69", "th"),  # a two-digit Buddhist year: no century is written
        ("1405/04/11", "fa-IR"),  # Solar Hijri: no Gregorian year 1405
        ("23 Now, 2026", "wo"),  # Wolof "Now" is November, not the crawl's clock
    ],
)
def test_dates_of_other_calendars_or_unknown_words_are_rejected(text: str, locale: str) -> None:
    assert parse_date(text, locale=locale, languages=list(date_languages(None, locale) or ()) or None) is None
