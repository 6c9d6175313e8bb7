"""Values read by the locale the page declares, proven on CLDR's own formats (through Babel).

Every locale Babel knows formats amounts and dates; each is read back with that locale declared
as a page declares it. The reading is the same value, or a reject with a reason: never another
value stored as valid.
"""

from __future__ import annotations

import re
from datetime import date
from decimal import ROUND_HALF_UP, Decimal

import pytest
import scrapy
from babel import Locale, localedata
from babel.dates import format_date, get_date_format
from babel.numbers import format_currency, format_decimal, get_currency_precision, get_territory_currencies
from scrapy.http import HtmlResponse, Request
from scrapy.utils.test import get_crawler

from scraper.cleaning.currency import minor_units, territory_of
from scraper.cleaning.dates import parse_date, read_date
from scraper.cleaning.language import date_languages
from scraper.cleaning.price import read_price
from scraper.items import ProductItem
from scraper.pipelines.clean import CleanPipeline

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
        ("1.234 €", "en", "three decimals for EUR"),  # 1.234 by the locale, 1234 meant
        ("1·234 €", "de", "neither the decimal mark nor the grouping"),
        ("1,234,5 €", "de", "two decimal marks"),
    ],
)
def test_numbers_the_locale_does_not_read_are_rejected_with_the_reason(
    text: str, locale: str | None, reason: str
) -> None:
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


def _read_date(text: str, locale: str) -> object:
    return read_date(text, locale=locale, languages=list(date_languages(None, locale) or ()) or None)


# Values a page stored wrong: the text does not fit the numeric dates of the locale it declares
# (sv-FI writes y-MM-dd, az-Arab and ha-Arab y-MM-dd) or the amount's digits do not fit the
# currency (CLDR writes IQD without decimals), and more than one reading fits. A fallback picked
# one of them; the reading is a reject naming the fix.
@pytest.mark.parametrize(
    ("text", "locale", "readings"),
    [
        ("2.7.2026", "sv-FI", ("2026-07-02 (DMY)", "2026-02-07 (MDY)")),
        ("2.7.2026", "sv-AX", ("2026-07-02 (DMY)", "2026-02-07 (MDY)")),
        ("23.11.26", "az-Arab", ("26-11-23 (DMY)", "23-11-26 (YMD)")),
        ("23.11.26", "ha-Arab", ("26-11-23 (DMY)", "23-11-26 (YMD)")),
        ("2/7/26", "ha-Arab-SD", ("26-07-02 (DMY)", "26-02-07 (MDY)")),
    ],
)
def test_a_date_that_does_not_fit_the_locale_and_reads_two_ways_is_rejected(
    text: str, locale: str, readings: tuple[str, ...]
) -> None:
    reading = _read_date(text, locale)
    assert reading.value is None
    assert all(found in (reading.problem or "") for found in readings), reading.problem
    assert "date_order" in (reading.problem or "")
    assert parse_date(text, locale=locale) is None


def test_an_amount_whose_decimals_the_currency_does_not_write_is_rejected() -> None:
    reading = read_price("1.235 IQD", locale="az-Arab-IQ")
    assert reading.amount is None
    assert "three decimals for IQD" in (reading.problem or ""), reading.problem
    # The currency's own digits, and a grouping the locale makes, still read.
    assert read_price("1,235 IQD", locale="az-Arab-IQ").amount == Decimal("1235.000")
    assert read_price("KWD 1.235", locale="ar-KW").amount == Decimal("1.235")


@pytest.mark.parametrize(
    ("text", "locale", "expected"),
    [
        ("23.7.2026", "sv-FI", date(2026, 7, 23)),  # not sv-FI's layout, but only day first reads
        ("2026/07/02", "en-US", date(2026, 7, 2)),  # the year written first: year first
        ("2026.07.02", "de", date(2026, 7, 2)),
        ("5.5.2026", "en-US", date(2026, 5, 5)),  # both readings are the same day
        ("26.11.26", "az-Arab", date(2026, 11, 26)),
    ],
)
def test_a_date_that_does_not_fit_the_locale_but_reads_one_way_is_read(text: str, locale: str, expected: date) -> None:
    reading = _read_date(text, locale)
    assert reading.problem is None
    assert reading.value is not None and reading.value.date() == expected


@pytest.mark.parametrize(
    ("text", "locale"),
    [
        ("02-07-2026", "sv"),  # sv writes "-" year first: "02" cannot be its year, two readings remain
        ("02.07.2020", "en-GB"),  # en-GB writes "/"
        ("2 07 2026", "ja"),
        ("23. 11. 26.", "fr"),  # ko's layout on a French page
    ],
)
def test_a_date_in_a_layout_the_locale_does_not_write_is_rejected_when_ambiguous(text: str, locale: str) -> None:
    reading = _read_date(text, locale)
    assert reading.value is None and "date_order" in (reading.problem or ""), reading


def test_an_explicit_date_order_reads_what_the_locale_would_reject() -> None:
    assert parse_date("2.7.2026", date_order="DMY", locale="sv-FI") == parse_date("2.7.2026", date_order="DMY")


_BIDI = re.compile("[\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069\\s]")


def _numeric_layouts(tag: str) -> dict[str, tuple[str, str]]:
    """CLDR's numeric date patterns of a locale (short, medium): pattern -> (separators)."""
    found = {}
    locale = Locale.parse(tag)
    for width in ("short", "medium"):
        pattern = get_date_format(width, locale=locale).pattern
        body = re.sub(r"'([^']*)'", r"\1", pattern)
        fields = list(re.finditer(r"y+|[ML]+|d+", body))
        if len(fields) != 3 or re.search(r"[ML]{3}|[A-KN-Za-ce-xz]", body):
            continue
        separators = tuple(_BIDI.sub("", body[a.end() : b.start()]) or " " for a, b in zip(fields, fields[1:]))
        found[pattern] = (separators[0], separators[1])
    return found


def test_a_date_in_another_locales_numeric_layout_reads_back_or_is_rejected() -> None:
    """A page that writes another locale's numeric layout (an older CLDR's, another country's):
    every text whose separators its declared locale never writes reads as written, or is a reject."""
    by_locale = {tag: _numeric_layouts(tag) for tag in sorted(localedata.locale_identifiers())}
    texts: dict[str, tuple[tuple[str, str], date]] = {}
    for layouts in by_locale.values():
        for pattern, separators in layouts.items():
            for value in DATES:
                texts.setdefault(format_date(value, pattern, locale="en"), (separators, value))
    exact = rejected = 0
    wrong: list[tuple[str, str, object]] = []
    for tag, layouts in by_locale.items():
        tag = tag.replace("_", "-")
        own = set(layouts.values())
        for text, (separators, value) in texts.items():
            if separators in own:
                continue  # the locale writes these separators: it decides the order
            reading = _read_date(text, tag)
            if reading.value is None:
                rejected += 1
            elif reading.value.date() == value:
                exact += 1
            else:
                wrong.append((tag, text, reading.value))
    total = exact + rejected + len(wrong)
    print(f"dates in another layout: {exact} of {total} exact, {rejected} rejected, {len(wrong)} wrong")
    assert len(texts) > 80
    assert not wrong, wrong[:20]


# Per page: one spider, many country stores. The pipeline is Scrapy's own object, fed the
# responses and items as the engine does.


class _Marketplace(scrapy.Spider):
    name = "marketplace"


def _pipeline() -> CleanPipeline:
    crawler = get_crawler(_Marketplace)
    crawler.spider = crawler._create_spider()
    return CleanPipeline(crawler)


def _page(pipeline: CleanPipeline, url: str, lang: str, meta: dict | None = None) -> None:
    body = f'<html lang="{lang}"><body></body></html>'.encode()
    request = Request(url, meta=meta or {})
    pipeline._remember_language(HtmlResponse(url, body=body, request=request), request)


def _item(pipeline: CleanPipeline, url: str, **fields: object) -> ProductItem:
    item = ProductItem(sku="A1", title="Kettle", url=url, **fields)
    item._origin = url
    return pipeline.process_item(item)


def test_a_page_says_its_locale_currency_and_date_order_in_its_request_meta() -> None:
    pipeline = _pipeline()
    # The site's template declares English everywhere; the spider knows each store's country.
    _page(pipeline, "http://shop.test/br/p/1", "en", {"locale": "pt-BR"})
    _page(pipeline, "http://shop.test/ch/p/1", "en", {"locale": "de-CH", "default_currency": "CHF"})
    _page(pipeline, "http://shop.test/us/p/1", "en", {"date_order": "YMD"})
    _page(pipeline, "http://shop.test/cz/p/1", "cs")
    brazil = _item(pipeline, "http://shop.test/br/p/1", price="R$ 1.234,56", released_at="02/07/2020")
    swiss = _item(pipeline, "http://shop.test/ch/p/1", price="1’025.50", released_at="02.07.2020")
    other = _item(pipeline, "http://shop.test/us/p/1", price="$12.50", released_at="2020/07/02")
    czech = _item(pipeline, "http://shop.test/cz/p/1", price="1 234,50 Kč", released_at="5. 6. 2019")
    assert (brazil["price"], brazil["currency"], brazil["released_at"].date()) == (
        Decimal("1234.56"),
        "BRL",
        date(2020, 7, 2),
    )
    assert (swiss["price"], swiss["currency"], swiss["released_at"].date()) == (
        Decimal("1025.50"),
        "CHF",
        date(2020, 7, 2),
    )
    assert (other["price"], other["currency"], other["released_at"].date()) == (
        Decimal("12.50"),
        "USD",
        date(2020, 7, 2),
    )
    assert (czech["price"], czech["currency"], czech["released_at"].date()) == (
        Decimal("1234.50"),
        "CZK",
        date(2019, 6, 5),
    )
    assert all(not item._problems for item in (brazil, swiss, other, czech))


def test_a_number_the_page_locale_does_not_read_is_a_reject_with_the_reason() -> None:
    pipeline = _pipeline()
    _page(pipeline, "http://shop.test/p/2", "en-US")
    item = _item(pipeline, "http://shop.test/p/2", price="12e3 USD")
    assert item["price"] is None
    assert item._problems == ["price: exponent notation is not a price: '12e3 USD'"]


def test_a_date_the_page_locale_reads_two_ways_is_a_reject_with_the_reason() -> None:
    pipeline = _pipeline()
    _page(pipeline, "http://shop.test/fi/p/1", "sv-FI")
    _page(pipeline, "http://shop.test/fi/p/2", "sv-FI", {"date_order": "DMY"})
    item = _item(pipeline, "http://shop.test/fi/p/1", price="12,50 €", released_at="2.7.2026")
    assert item["released_at"] is None
    assert len(item._problems) == 1 and item._problems[0].startswith("released_at: '2.7.2026' does not fit")
    told = _item(pipeline, "http://shop.test/fi/p/2", price="12,50 €", released_at="2.7.2026")
    assert told["released_at"].date() == date(2026, 7, 2) and not told._problems


@pytest.mark.parametrize(
    ("raw", "term"),
    [
        ("https://schema.org/InStock", "InStock"),
        ("http://schema.org/OutOfStock", "OutOfStock"),
        ("InStock", "InStock"),
        ("In stock", "InStock"),
        ("Sold out", "SoldOut"),
        ("Auf Lager", "InStock"),
        ("Pre-order", "PreOrder"),
        ("Ask the shop", "Ask the shop"),
    ],
)
def test_availability_is_the_schema_org_term(raw: str, term: str) -> None:
    item = _item(_pipeline(), "http://shop.test/p/3", price="$1", availability=raw)
    assert item["availability"] == term


def test_scrapy_parse_with_pipelines_rejects_an_exponent_with_its_reason(services, tmp_path) -> None:
    import functools
    import http.server
    import threading

    from support.crawls import crawl_env, run_scrapy

    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "1.html").write_text(
        '<html lang="en-US"><head><link rel="canonical" href="http://127.0.0.1/p/1.html"></head><body>'
        '<h1 class="title">Kettle</h1><span class="sku">K-1</span><span class="price">12e3 USD</span>'
        "</body></html>"
    )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/p/1.html"
        result = run_scrapy(
            crawl_env(services),
            "parse",
            "--nocolour",
            "--spider",
            "demo",
            "-c",
            "parse_product",
            "--pipelines",
            url,
            timeout=120,
        )
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stderr[-3000:]
    piped = result.stdout.split("# Item pipelines (nothing stored)")[1]
    assert "Rejected (price: exponent notation is not a price: '12e3 USD'" in piped, piped


def test_a_page_passes_its_locale_on_to_the_requests_it_yields() -> None:
    from scraper.middlewares.item_origin import ItemOriginMiddleware

    crawler = get_crawler(_Marketplace)
    middleware = ItemOriginMiddleware.from_crawler(crawler)
    crawler.stats.open_spider()
    store = Request("http://shop.test/ch/", meta={"locale": "de-CH", "default_currency": "CHF"})
    response = HtmlResponse(store.url, body=b"<html></html>", request=store)
    own = Request("http://shop.test/ch/p/2", meta={"locale": "fr-CH"})
    out = list(middleware.process_spider_output(response, [Request("http://shop.test/ch/p/1"), own]))
    assert out[0].meta == {"locale": "de-CH", "default_currency": "CHF"}
    assert out[1].meta == {"locale": "fr-CH", "default_currency": "CHF"}


@pytest.mark.parametrize(("name", "value"), [("CLEAN_LOCALE", "xx-QQ-zz"), ("QUALITY_ON_BREAK", "pause")])
def test_a_bad_locale_or_guard_setting_fails_at_start_by_name(name: str, value: str) -> None:
    from scrapy.settings import Settings

    from scraper.addon import validate
    from scraper.config import ConfigError

    with pytest.raises(ConfigError, match=f"^{name}: "):
        validate(Settings({name: value}))
    validate(Settings({"CLEAN_LOCALE": "de-CH", "QUALITY_ON_BREAK": "stop"}))
