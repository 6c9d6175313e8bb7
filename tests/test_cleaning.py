"""Unit tables for scraper.cleaning, built from strings seen on real shop pages."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from scraper.cleaning import canonical_url, clean_text, parse_date, parse_price, read_price, url_domain

UTC = UTC
D = Decimal


# --------------------------------------------------------------------------- price

PRICE_TABLE = [
    # (raw, default_currency, expected amount, expected currency)
    ("1.234,56 €", None, D("1234.56"), "EUR"),
    ("1 234,56 EUR", None, D("1234.56"), "EUR"),
    ("1\u00a0234,56\u00a0€", None, D("1234.56"), "EUR"),
    ("$1,299.00", None, D("1299.00"), "USD"),
    ("£5", None, D("5.00"), "GBP"),
    ("¥1,200", None, D("1200"), "JPY"),
    ("12 円", None, D("12"), "JPY"),
    ("EUR 12,50", None, D("12.50"), "EUR"),
    ("€12.50", None, D("12.50"), "EUR"),
    ("12,50 €", None, D("12.50"), "EUR"),
    ("USD 1,299.00", None, D("1299.00"), "USD"),
    ("1,299", None, D("1299.00"), None),
    ("€1.234.567,89", None, D("1234567.89"), "EUR"),
    ("Only 12,99 €/Stück", None, D("12.99"), "EUR"),
    ("Price: 12.50", "GBP", D("12.50"), "GBP"),
    ("$.75", None, D("0.75"), "USD"),
    # "$" follows the site default only when that default is a dollar currency.
    ("$19.99", "CAD", D("19.99"), "CAD"),
    ("$19.99", "EUR", D("19.99"), "USD"),
    ("US$5", "CAD", D("5.00"), "USD"),
    ("C$ 12.50", None, D("12.50"), "CAD"),
    ("CA$12", None, D("12.00"), "CAD"),
    ("A$5", None, D("5.00"), "AUD"),
    ("AU$ 5", None, D("5.00"), "AUD"),
    ("NT$ 100", None, D("100.00"), "TWD"),
    # An explicit ISO code wins over the symbol.
    ("$12.50 CAD", None, D("12.50"), "CAD"),
    ("Tax: 2.50 USD", "EUR", D("2.50"), "USD"),
    ("CHF 12.50", None, D("12.50"), "CHF"),
    ("CHF 1'299.00", None, D("1299.00"), "CHF"),
    ("12,50 zł", None, D("12.50"), "PLN"),
    ("99,00 PLN", None, D("99.00"), "PLN"),
    ("12,50 Kč", None, D("12.50"), "CZK"),
    ("1 299 Ft", None, D("1299.00"), "HUF"),
    # "kr" is Swedish, Norwegian, Danish or Icelandic: only the default can tell.
    ("99 kr", "SEK", D("99.00"), "SEK"),
    ("kr 99,-", "NOK", D("99.00"), "NOK"),
    ("₹1,499", None, D("1499.00"), "INR"),
    ("R$ 12,50", None, D("12.50"), "BRL"),
    ("1 299 ₽", None, D("1299.00"), "RUB"),
    ("12 руб.", None, D("12.00"), "RUB"),
    ("₩12,000", None, D("12000"), "KRW"),
    ("₺12,50", None, D("12.50"), "TRY"),
    ("₪ 45", None, D("45.00"), "ILS"),
    ("฿1,200", None, D("1200.00"), "THB"),
    ("¥12", "CNY", D("12.00"), "CNY"),
    ("12,345 KWD", None, D("12345.000"), "KWD"),
    ("₫100.000", None, D("100000"), "VND"),
    # Free.
    ("Free", None, D("0.00"), None),
    ("FREE!", "USD", D("0.00"), "USD"),
    ("gratis", "EUR", D("0.00"), "EUR"),
    ("0", None, D("0.00"), None),
    ("0", "EUR", D("0.00"), "EUR"),
    ("$0.00", None, D("0.00"), "USD"),
    # Machine values (JSON-LD, data attributes) and numbers.
    ("1234.56", None, D("1234.56"), None),
    ("1234.56", "EUR", D("1234.56"), "EUR"),
    ("  49.9 ", "EUR", D("49.90"), "EUR"),
    ("1234.567", None, D("1234.57"), None),
    ("1.299", None, D("1299.00"), None),  # thousands, as on European pages
    (1234, None, D("1234.00"), None),
    (12.5, "GBP", D("12.50"), "GBP"),
    (0.1 + 0.2, None, D("0.30"), None),
    (D("19.999"), "USD", D("20.00"), "USD"),
    (1500, "JPY", D("1500"), "JPY"),
    (0, None, D("0.00"), None),
    # Not a price.
    ("call for price", None, None, None),
    ("N/A", "EUR", None, None),
    ("free shipping", "EUR", None, None),
    ("Sold out", None, None, None),
    ("", None, None, None),
    ("   ", None, None, None),
    (None, "EUR", None, None),
    ("abc", None, None, None),
    (True, None, None, None),
    (["12.50"], None, None, None),
    (float("nan"), None, None, None),
    (float("inf"), None, None, None),
    # Negative or absurd.
    ("-5 €", None, None, None),
    ("€ -5", None, None, None),
    ("$-5.00", None, None, None),
    ("\u22125,00 €", None, None, None),
    (-3, None, None, None),
    ("$2,000,000,000", None, None, None),
    (D("1e12"), None, None, None),
    # A dash used as a separator is not a minus sign.
    ("Price - 12.50 €", None, D("12.50"), "EUR"),
]


@pytest.mark.parametrize(("raw", "default", "amount", "currency"), PRICE_TABLE)
def test_parse_price(raw: object, default: str | None, amount: Decimal | None, currency: str | None) -> None:
    reading = read_price(raw, default)
    assert (reading.amount, reading.currency, reading.problem) == (amount, currency, None)
    assert parse_price(raw, default) == (amount, currency)
    got_amount = reading.amount
    if amount is not None:
        # Same value *and* same exponent, so "5" -> "5.00" is really quantized.
        assert str(got_amount) == str(amount)


# --------------------------------------------------------------------------- dates


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


DATE_TABLE = [
    # (raw, kwargs, expected)
    ("12 Nov 2026", {}, utc(2026, 11, 12)),
    ("12th November 2026", {}, utc(2026, 11, 12)),
    ("November 12, 2026", {}, utc(2026, 11, 12)),
    ("Nov 12, 2026 3:45 PM", {}, utc(2026, 11, 12, 15, 45)),
    ("  Nov 12, 2026\n 3:45 PM ", {}, utc(2026, 11, 12, 15, 45)),
    ("Thu, 12 Nov 2026 10:00:00 GMT", {}, utc(2026, 11, 12, 10)),
    ("12 Nov 2026 10:00 CET", {}, utc(2026, 11, 12, 9)),
    ("2026-11-12T10:00:00+01:00", {}, utc(2026, 11, 12, 9)),
    ("2026-11-12T10:00:00Z", {}, utc(2026, 11, 12, 10)),
    ("2026-11-12T10:00:00.123456Z", {}, utc(2026, 11, 12, 10, 0, 0, 123456)),
    ("2026-11-12", {}, utc(2026, 11, 12)),
    ("2026-11-12 10:00", {}, utc(2026, 11, 12, 10)),
    ("20261112", {}, utc(2026, 11, 12)),
    # Naive inputs are read in the given zone, then converted to UTC.
    ("2026-11-12", {"timezone": "Europe/Berlin"}, utc(2026, 11, 11, 23)),
    ("12 Nov 2026", {"timezone": "Europe/Berlin"}, utc(2026, 11, 11, 23)),
    ("2026-07-01 12:00", {"timezone": "America/New_York"}, utc(2026, 7, 1, 16)),
    ("2026-11-12T10:00:00+01:00", {"timezone": "Asia/Tokyo"}, utc(2026, 11, 12, 9)),
    # Numeric dates: the caller's date order decides.
    ("12.11.2026", {"date_order": "DMY"}, utc(2026, 11, 12)),
    ("11/12/2026", {"date_order": "MDY"}, utc(2026, 11, 12)),
    ("11/12/2026", {"date_order": "DMY"}, utc(2026, 12, 11)),
    ("11/12/2026", {}, utc(2026, 11, 12)),  # English default is month first
    # Other languages must be asked for.
    ("12 novembre 2026", {"languages": ["fr"]}, utc(2026, 11, 12)),
    ("12. November 2026", {"languages": ["de"]}, utc(2026, 11, 12)),
    ("12 novembre 2026", {}, None),
    # Unix timestamps (seconds or JavaScript milliseconds) are accepted.
    ("1731369600", {}, utc(2024, 11, 12)),
    ("1731369600000", {}, utc(2024, 11, 12)),
    (1731369600, {}, utc(2024, 11, 12)),
    # Python objects.
    (datetime(2026, 11, 12, 10, 0), {}, utc(2026, 11, 12, 10)),
    (datetime(2026, 11, 12, 10, 0), {"timezone": "Europe/Paris"}, utc(2026, 11, 12, 9)),
    (
        datetime(2026, 11, 12, 10, 0, tzinfo=timezone(timedelta(hours=-5))),
        {},
        utc(2026, 11, 12, 15),
    ),
    (date(2026, 11, 12), {}, utc(2026, 11, 12)),
    # Not a full date.
    ("5", {}, None),
    ("2026", {}, None),
    ("123456", {}, None),
    ("Nov 2026", {}, None),
    ("12 Nov", {}, None),
    ("abc", {}, None),
    ("N/A", {}, None),
    ("", {}, None),
    ("   ", {}, None),
    (None, {}, None),
    (True, {}, None),
    (5, {}, None),
    (["12 Nov 2026"], {}, None),
    ("2026-13-45", {}, None),
]


@pytest.mark.parametrize(("raw", "kwargs", "expected"), DATE_TABLE)
def test_parse_date(raw: object, kwargs: dict[str, object], expected: datetime | None) -> None:
    got = parse_date(raw, **kwargs)
    assert got == expected
    if got is not None:
        assert got.utcoffset() == timedelta(0)


def test_parse_date_repeated_input_gives_same_answer() -> None:
    first = parse_date("Nov 12, 2026 3:45 PM", timezone="Europe/Berlin")
    assert parse_date("Nov 12, 2026 3:45 PM", timezone="Europe/Berlin") == first
    # The zone is part of the cache key.
    assert parse_date("Nov 12, 2026 3:45 PM") != first


@pytest.mark.parametrize(
    ("raw", "delta"),
    [
        ("yesterday", timedelta(days=1)),
        ("2 days ago", timedelta(days=2)),
        ("3 hours ago", timedelta(hours=3)),
    ],
)
def test_parse_date_relative_uses_current_clock(raw: str, delta: timedelta) -> None:
    got = parse_date(raw)
    assert got is not None
    assert abs((datetime.now(UTC) - delta) - got) < timedelta(minutes=5)


# --------------------------------------------------------------------------- text

TEXT_TABLE = [
    ("  Hello   world  ", "Hello world"),
    ("Caf\u00e9 &amp; Bar", "Café & Bar"),
    ("Cafe\u0301", "Café"),  # decomposed accent -> NFC
    ("10\u00a0kg", "10 kg"),
    ("\u200bZero\u200bwidth\ufeff", "Zero width"),
    ("line one\nline two\r\n\tindented", "line one line two indented"),
    ("<p>First</p><p>Second&nbsp;para</p>", "First Second para"),
    ("Line1<br>Line2<br/>Line3", "Line1 Line2 Line3"),
    ("<b>10</b>% off", "10% off"),
    ('<span class="x">Red</span> <!-- colour --> shoe', "Red shoe"),
    ("<script>var x = 1;</script>Visible", "Visible"),
    ("&lt;b&gt; is a tag", "<b> is a tag"),
    ("a < b and c > d", "a < b and c > d"),
    ("AT&T", "AT&T"),
    ("&#8364;12 &#x2013; &euro;15", "€12 – €15"),
    (["  Red ", "\n", None, "Blue&amp;Green"], "Red Blue&Green"),
    (("a", ["b", "c"]), "a b c"),
    ([], None),
    ([None, "  "], None),
    ("", None),
    ("   \n\t\u00a0 ", None),
    ("<p> </p>", None),
    (None, None),
    (42, "42"),
    (D("12.50"), "12.50"),
    (b"caf\xc3\xa9", "café"),
    (True, None),
    ({"a": 1}, None),
]


@pytest.mark.parametrize(("raw", "expected"), TEXT_TABLE)
def test_clean_text(raw: object, expected: str | None) -> None:
    assert clean_text(raw) == expected


# --------------------------------------------------------------------------- urls

BASE = "https://shop.example.com/c/shoes/"

URL_TABLE = [
    # (raw, base, expected)
    ("https://shop.example.com/p/1", None, "https://shop.example.com/p/1"),
    ("HTTP://WWW.Example.COM/Path?b=2&a=1#reviews", None, "http://www.example.com/Path?a=1&b=2"),
    ("  https://example.com/a b  ", None, "https://example.com/a%20b"),
    ("https://example.com/%7Euser/", None, "https://example.com/~user/"),
    ("https://example.com/?q=caf%c3%a9", None, "https://example.com/?q=caf%C3%A9"),
    ("http://example.com:80/x", None, "http://example.com/x"),
    ("https://example.com:443/x", None, "https://example.com/x"),
    ("https://Example.com:8443/x", None, "https://example.com:8443/x"),
    ("https://example.com", None, "https://example.com/"),
    ("https://example.com/a/../b/./c", None, "https://example.com/b/c"),
    ("http://例え.jp/パス", None, "http://xn--r8jz45g.jp/%E3%83%91%E3%82%B9"),
    ("https://exa\nmple.com/p\t/1", None, "https://example.com/p/1"),
    ("https://example.com/p\r\n/2", None, "https://example.com/p/2"),
    (" https://example.com/p/\r3 ", None, "https://example.com/p/3"),
    # Relative references need the page URL.
    ("../boots?size=42&color=red", BASE, "https://shop.example.com/c/boots?color=red&size=42"),
    ("/p/123#top", BASE, "https://shop.example.com/p/123"),
    ("?page=2", BASE, "https://shop.example.com/c/shoes/?page=2"),
    ("//cdn.example.com/img.jpg", BASE, "https://cdn.example.com/img.jpg"),
    ("//cdn.example.com/img.jpg", None, "https://cdn.example.com/img.jpg"),
    ("https://other.example.org/x", BASE, "https://other.example.org/x"),
    ("/p/123", None, None),
    # Not web pages.
    ("javascript:void(0)", BASE, None),
    ("mailto:sales@example.com", BASE, None),
    ("tel:+441234567", BASE, None),
    ("data:image/png;base64,AAAA", BASE, None),
    ("ftp://example.com/file", None, None),
    # Garbage.
    ("", BASE, None),
    ("   ", None, None),
    (None, BASE, None),
    (123, None, None),
    ("not a url", None, None),
    ("http://", None, None),
    ("https://exa mple.com/", None, None),
    ("https://example.com:abc/", None, None),
]


@pytest.mark.parametrize(("raw", "base", "expected"), URL_TABLE)
def test_canonical_url(raw: object, base: str | None, expected: str | None) -> None:
    assert canonical_url(raw, base) == expected


def test_canonical_url_is_idempotent() -> None:
    once = canonical_url("HTTP://WWW.Example.COM:80/a b?b=2&a=1#frag")
    assert once is not None
    assert canonical_url(once) == once


DOMAIN_TABLE = [
    ("https://www.Example.com/path", "example.com"),
    ("http://WWW.EXAMPLE.CO.UK:8080/x", "example.co.uk"),
    ("https://shop.example.com/", "shop.example.com"),
    ("https://www2.example.com/", "www2.example.com"),
    ("https://user:pw@www.example.com/", "example.com"),
    ("https://example.com./", "example.com"),
    ("example.com/path", "example.com"),
    ("//www.cdn.example.com/a.jpg", "cdn.example.com"),
    ("", ""),
    ("/relative/only", ""),
]


@pytest.mark.parametrize(("url", "expected"), DOMAIN_TABLE)
def test_url_domain(url: str, expected: str) -> None:
    assert url_domain(url) == expected


# The fast path for common English layouts must answer exactly as dateparser would.
_FAST_PATH_INPUTS = [
    "12 Nov 2026",
    "1 January 2027",
    "12 Sept 2026",
    "Nov 12, 2026",
    "November 12, 2026",
    "Nov 12 2026",
    "Nov 12, 2026 3:45 PM",
    "Nov 12, 2026 12:05 am",
    "12 Nov 2026 23:59",
    "12.11.2026",
    "11/12/2026",
    "1-2-2026",
    "31.12.2026",
    "Feb 29, 2024",
    "Dec 1st, 2026",
]


@pytest.mark.parametrize("text", _FAST_PATH_INPUTS)
@pytest.mark.parametrize("order", [None, "DMY", "MDY"])
@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin"])
def test_fast_path_agrees_with_dateparser(text: str, order: str | None, zone: str) -> None:
    from scraper.cleaning.dates import _ABSOLUTE_PARSERS, _parse_common, _parse_text

    slow = _parse_text(text, order, zone, ("en",), _ABSOLUTE_PARSERS)
    fast = _parse_common(text, order, zone)
    if fast is None:  # not for the fast path (e.g. 31.12.2026 read month first): dateparser decides
        assert order != "DMY" and text == "31.12.2026"
    else:
        assert fast == slow
    if order is None and "." in text:
        # Deliberately not dateparser's English default: dotted dates are day first.
        assert parse_date(text, order, zone) == _parse_text(text, "DMY", zone, ("en",), _ABSOLUTE_PARSERS)
    else:
        assert parse_date(text, order, zone) == slow


@pytest.mark.parametrize("text", ["31 Feb 2026", "Nov 32, 2026", "13/13/2026", "Smarch 3, 2026"])
def test_fast_path_never_invents_impossible_dates(text: str) -> None:
    from scraper.cleaning.dates import _parse_common

    assert _parse_common(text, "DMY", "UTC") is None
