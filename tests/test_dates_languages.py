"""Dates in the site's language, dotted dates day first, and the fast path's parity with dateparser."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import scrapy
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from scraper.cleaning import parse_date
from scraper.cleaning.dates import _ABSOLUTE_PARSERS, _parse_common, _parse_text
from scraper.cleaning.language import date_languages, declared_language
from scraper.items import ProductItem
from scraper.pipelines.clean import CleanPipeline
from scraper.pipelines.validate import check

UTC = UTC


def test_dates_in_other_languages_when_asked() -> None:
    assert parse_date("9. März 2026", languages=["de"]) == datetime(2026, 3, 9, tzinfo=UTC)
    assert parse_date("9 mars 2026", languages=["fr", "en"]) == datetime(2026, 3, 9, tzinfo=UTC)
    assert parse_date("9. März 2026") is None  # English only by default


def test_dotted_dates_are_day_first_unless_told_otherwise() -> None:
    assert parse_date("12.11.2026") == datetime(2026, 11, 12, tzinfo=UTC)
    assert parse_date("12.11.2026", languages=["de", "en"]) == datetime(2026, 11, 12, tzinfo=UTC)
    assert parse_date("12.11.2026", date_order="MDY") == datetime(2026, 12, 11, tzinfo=UTC)
    assert parse_date("11/12/2026") == datetime(2026, 11, 12, tzinfo=UTC)  # slashes: English, month first


def test_years_outside_utc_are_no_date_not_an_error() -> None:
    for raw in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
        assert parse_date(raw) is None
        assert parse_date(raw, timezone="Europe/Berlin") is None
    assert parse_date("0001-01-01", timezone="Asia/Tokyo") is None
    assert parse_date(float("nan")) is None


def test_declared_language() -> None:
    assert declared_language(b"de-DE, en;q=0.5", b"<html lang='fr'>") == "de-DE"
    assert declared_language(None, b'<!DOCTYPE html>\n<html class="x" lang="ar-KW">') == "ar-KW"
    assert declared_language(None, b"<html><body>") is None
    assert date_languages(None, "de-DE") == ("de", "en")
    assert date_languages("fr, it", "de") == ("fr", "it")
    assert date_languages(["xx"], None) is None


class GermanShop(scrapy.Spider):
    name = "shop"
    default_currency = "EUR"


def _pipeline(spider: type[scrapy.Spider], **settings: str) -> tuple[CleanPipeline, object]:
    crawler = get_crawler(spider, settings_dict=settings)
    crawler.spider = crawler._create_spider()
    return CleanPipeline(crawler), crawler


def _item(url: str, released_at: str, pipeline: CleanPipeline) -> ProductItem:
    item = ProductItem(sku="1", title="T", url=url, price="12,50 €", released_at=released_at)
    item._origin = url
    return pipeline.process_item(item)


def test_page_language_decides_the_date_language_and_unreadable_optional_dates_are_counted() -> None:
    pipeline, crawler = _pipeline(GermanShop)
    url = "http://shop.test/p/1"
    page = HtmlResponse(url, body=b'<html lang="de"><body>x</body></html>', encoding="utf-8")
    crawler.signals.send_catch_log(
        scrapy.signals.response_received, response=page, request=page.request, spider=crawler.spider
    )
    item = _item(url, "9. März 2026", pipeline)
    assert check(item) == [] and item["released_at"] == datetime(2026, 3, 9, tzinfo=UTC)
    # Another page that declares nothing: English, and an unreadable optional date is no reject.
    item = _item("http://shop.test/p/2", "9. März 2026", pipeline)
    assert check(item) == [] and item["released_at"] is None
    assert crawler.stats.get_value("clean/unparsed/released_at") == 1


def test_date_languages_setting_and_spider_attribute() -> None:
    pipeline, _ = _pipeline(GermanShop, DATE_LANGUAGES="de")
    assert _item("http://shop.test/p/3", "9. März 2026", pipeline)["released_at"] == datetime(2026, 3, 9, tzinfo=UTC)

    class FrenchShop(GermanShop):
        date_languages = ["fr"]

    pipeline, _ = _pipeline(FrenchShop, DATE_LANGUAGES="de")
    assert _item("http://shop.test/p/4", "9 mars 2026", pipeline)["released_at"] == datetime(2026, 3, 9, tzinfo=UTC)


class Event(ProductItem):
    table = ""  # not stored: only its validation is under test
    released_at = scrapy.Field(clean="date", type=datetime, required=True)


def test_a_required_date_that_cannot_be_read_is_a_reject() -> None:
    pipeline, _ = _pipeline(GermanShop)
    item = pipeline.process_item(Event(sku="1", title="T", url="http://shop.test/", price="1 €", released_at="soon"))
    assert check(item) == ["released_at: not a date: 'soon'"]


# ---------------------------------------------------------------- the fast path against dateparser

_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
_ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Sydney"]


def _layouts(moment: datetime, hour12: int, meridiem: str) -> list[str]:
    d, m, y = moment.day, moment.month, moment.year
    clock = f"{hour12}:{moment.minute:02d} {meridiem}"
    return [
        f"{d} {_MONTHS[m - 1]} {y}",
        f"{_MONTHS[m - 1]} {d}, {y} {clock}",
        f"{d} {_MONTHS[m - 1]} {y} {moment.hour:02d}:{moment.minute:02d}",
        f"{d:02d}.{m:02d}.{y}",
        f"{m}/{d}/{y}",
    ]


def _deliberately_different(text: str, moment: datetime, zone: str) -> bool:
    """Where the fast path is right and dateparser is not (see scraper.cleaning.dates)."""
    if moment.year > 2037:
        return True  # pytz has no transitions past 2037
    if zone == "UTC":
        return False
    tz = ZoneInfo(zone)
    naive = moment.replace(tzinfo=None)
    first, second = naive.replace(tzinfo=tz, fold=0), naive.replace(tzinfo=tz, fold=1)
    return first.utcoffset() != second.utcoffset()  # the fold, or a time skipped in spring


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(
    st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2060, 12, 31)),
    st.sampled_from(_ZONES),
    st.sampled_from([None, "DMY", "MDY"]),
)
def test_fast_path_equals_dateparser_except_where_documented(moment: datetime, zone: str, order: str | None) -> None:
    moment = moment.replace(second=0, microsecond=0)
    hour12 = moment.hour % 12 or 12
    meridiem = "PM" if moment.hour >= 12 else "AM"
    for text in _layouts(moment, hour12, meridiem):
        fast = _parse_common(text, order, zone)
        if fast is None:
            continue  # not a layout the fast path takes (or the order makes it no date)
        slow = _parse_text(text, order, zone, ("en",), _ABSOLUTE_PARSERS)
        if _deliberately_different(text, moment, zone):
            expected = moment.replace(tzinfo=ZoneInfo(zone) if zone != "UTC" else UTC)
            if "." not in text and "/" not in text and ":" in text:
                assert fast == expected.astimezone(UTC)
            continue
        assert fast == slow, (text, zone, order)


def test_the_documented_differences_are_real() -> None:
    # The fold: 02:30 happens twice in Berlin on 25 Oct 2026; zoneinfo takes the first (CEST).
    assert _parse_common("Oct 25, 2026 2:30 AM", None, "Europe/Berlin") == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    assert _parse_text("Oct 25, 2026 2:30 AM", None, "Europe/Berlin", ("en",), _ABSOLUTE_PARSERS) == datetime(
        2026, 10, 25, 1, 30, tzinfo=UTC
    )
    # Summer 2040 in Berlin is still UTC+2; dateparser says UTC+1.
    assert _parse_common("Jul 1, 2040 12:00 PM", None, "Europe/Berlin") == datetime(2040, 7, 1, 10, tzinfo=UTC)
    assert _parse_text("Jul 1, 2040 12:00 PM", None, "Europe/Berlin", ("en",), _ABSOLUTE_PARSERS) - timedelta(
        hours=1
    ) == datetime(2040, 7, 1, 10, tzinfo=UTC)
