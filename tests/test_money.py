"""Money by currency: CLDR marks, ISO 4217 minor units, the corpus figures, the wider column."""

from __future__ import annotations

import json
import sys
from decimal import Decimal

import psycopg2
import pytest
from support.crawls import ROOT

from scraper.cleaning import read_price
from scraper.cleaning.currency import INDEX_PATH, build_index, currency_of, minor_units, territory_of
from scraper.items import ProductItem
from scraper.storage import schema
from scraper.storage.upsert import Row, TableUpserter

D = Decimal

# (text, default currency, territory, amount, code)
READINGS = [
    # Three-decimal currencies keep their fils; "12.500" is not twelve thousand five hundred.
    ("KWD 12.500", None, None, D("12.500"), "KWD"),
    ("423.923 KD", None, None, D("423.923"), "KWD"),
    ("12.500 د.ك.\u200f", None, None, D("12.500"), "KWD"),
    ("BHD 1,250.125", None, None, D("1250.125"), "BHD"),
    ("1.168,757 OMR", None, None, D("1168.757"), "OMR"),
    ("JOD 7.250", None, None, D("7.250"), "JOD"),
    ("1 دينار كويتي", None, None, D("1.000"), "KWD"),
    # Zero-decimal ones round to whole units.
    ("¥1,200", None, None, D("1200"), "JPY"),
    ("₩12,000", None, None, D("12000"), "KRW"),
    # Prefixed dollars and other marks from CLDR (or common on shops).
    ("AU$ 5", None, None, D("5.00"), "AUD"),
    ("AU $59.95", None, None, D("59.95"), "AUD"),
    ("A$190.00", None, None, D("190.00"), "AUD"),
    ("C$5.95", None, None, D("5.95"), "CAD"),
    ("NZ$ 12", None, None, D("12.00"), "NZD"),
    ("HK$ 88", None, None, D("88.00"), "HKD"),
    ("S$ 4.90", None, None, D("4.90"), "SGD"),
    ("R$ 12,50", None, None, D("12.50"), "BRL"),
    ("US$ 3", "CAD", None, D("3.00"), "USD"),
    ("G$ 500", None, None, D("500.00"), "GYD"),
    ("GY$ 500", None, None, D("500.00"), "GYD"),
    ("45 E£", None, None, D("45.00"), "EGP"),
    ("12,50 zł", None, None, D("12.50"), "PLN"),
    ("99 ₴", None, None, D("99.00"), "UAH"),
    ("3,439.00 درهم", None, None, D("3439.00"), "AED"),
    ("106.61 ريال", None, None, D("106.61"), "SAR"),
    ("1 kn", None, None, D("1.00"), "HRK"),
    ("1 Lek", None, None, D("1.00"), "ALL"),  # ISO 4217: 2, where CLDR rounds to 0
    ("1 BZ$", None, None, D("1.00"), "BZD"),
    ("749,00 euro", None, None, D("749.00"), "EUR"),
    # Shared marks: the default, then the page's territory, then CLDR's English reading.
    ("$19.99", "CAD", None, D("19.99"), "CAD"),
    ("$19.99", None, "CA", D("19.99"), "CAD"),
    ("$19.99", "EUR", None, D("19.99"), "USD"),
    ("99 kr", "SEK", None, D("99.00"), "SEK"),
    ("99 kr", None, "NO", D("99.00"), "NOK"),
    ("£5", None, None, D("5.00"), "GBP"),
    # Words that are no currency leave the amount alone and the default in charge.
    ("Размер 42", "EUR", None, D("42.00"), "EUR"),
    ("Артикул: 12345", "EUR", None, D("12345.00"), "EUR"),
    ("a partire da 7,32 € *", None, None, D("7.32"), "EUR"),
    ("3 Ausgaben für nur 14,85 EUR", None, None, D("14.85"), "EUR"),
    ("12,99 €/Stück", None, None, D("12.99"), "EUR"),
]


@pytest.mark.parametrize(("text", "default", "territory", "amount", "code"), READINGS)
def test_read_price(text: str, default: str | None, territory: str | None, amount: Decimal, code: str) -> None:
    reading = read_price(text, default, territory)
    assert (reading.amount, reading.currency, reading.problem) == (amount, code, None)
    assert str(reading.amount) == str(amount)  # rounded to the currency's own unit


@pytest.mark.parametrize(
    ("text", "default", "problem"),
    [
        # A mark that cannot be read is a problem, never the default currency.
        ("12,50 â‚¬", "USD", "unknown currency 'â‚¬'"),
        ("12,50 \ufffd", "USD", "unknown currency '\ufffd'"),
        ("13800 ₶", "EUR", "unknown currency '₶'"),
        ("99 kr", None, "ambiguous currency 'kr'"),
        ("99 kr", "EUR", "ambiguous currency 'kr'"),
    ],
)
def test_unreadable_or_ambiguous_marks_are_problems(text: str, default: str | None, problem: str) -> None:
    reading = read_price(text, default)
    assert reading.currency is None and reading.problem is not None and reading.problem.startswith(problem)


def test_schema_org_price_uses_a_dot_as_decimal_mark() -> None:
    assert read_price("1.299", "EUR", decimal_separator=".").amount == D("1.30")
    assert read_price("1.299", "EUR").amount == D("1299.00")  # a European page's thousands
    assert read_price("12.500", "KWD", decimal_separator=".").amount == D("12.500")


@pytest.mark.parametrize(
    ("field", "code"),
    [("EUR", "EUR"), ("€", "EUR"), ("руб.", "RUB"), ("zł", "PLN"), ("euro", "EUR"), ("KD", "KWD"), ("usd", "USD")],
)
def test_currency_field_accepts_symbols_and_names(field: str, code: str) -> None:
    assert currency_of(field).code == code


def test_minor_units_follow_iso_4217() -> None:
    assert [
        minor_units(c) for c in ("JPY", "KRW", "USD", "EUR", "KWD", "BHD", "OMR", "JOD", "TND", "LYD", "IQD", "CLF")
    ] == [0, 0, 2, 2, 3, 3, 3, 3, 3, 3, 3, 4]


def test_territory_from_language_tags() -> None:
    assert [territory_of(t) for t in ("en-CA", "sv", "ar-KW", "de", None, "zz")] == ["CA", "SE", "KW", "DE", None, None]


def test_shipped_currency_index_is_what_babel_gives() -> None:
    # Never edited by hand: rebuilt with `currency.main()`.
    assert json.loads(INDEX_PATH.read_text(encoding="utf-8")) == json.loads(json.dumps(build_index()))


def test_price_parser_corpus_figures() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from price_corpus import measure

    figures = measure()
    assert figures.examples == 1185
    assert figures.amounts_right >= 1171, figures.wrong_amounts
    assert figures.currencies_right / figures.named >= 0.95, figures.wrong_currencies


def test_price_column_is_widened_in_place_on_a_populated_table(clean) -> None:
    conn = psycopg2.connect(clean.database_url)
    try:
        schema.migrate(conn, [ProductItem])
        with conn, conn.cursor() as cur:
            cur.execute("ALTER TABLE products ALTER COLUMN price TYPE numeric(14,2)")
        columns = list(ProductItem.columns())
        upserter = TableUpserter("products", columns, ProductItem.key, 3600.0)
        rows = [
            Row(
                key=("s", f"sku{n}"),
                values={c: None for c in columns}
                | {
                    "source": "s",
                    "sku": f"sku{n}",
                    "title": "t",
                    "price": D(f"{n}99999999.99"),
                    "currency": "USD",
                    "url": "http://x/",
                },
            )
            for n in range(1, 4)
        ]
        with conn, conn.cursor() as cur:
            assert upserter.write(cur, rows).inserted == {r.key for r in rows}
        changes = schema.migrate(conn, [ProductItem])
        assert "widened column products.price to numeric(20,4)" in changes
        assert "widened column products.price to numeric(20,4)" not in schema.migrate(conn, [ProductItem])
        with conn, conn.cursor() as cur:
            cur.execute("SELECT sku, price FROM products ORDER BY sku")
            assert cur.fetchall() == [(f"sku{n}", D(f"{n}99999999.99")) for n in range(1, 4)]
            cur.execute(
                "SELECT numeric_precision, numeric_scale FROM information_schema.columns"
                " WHERE table_name = 'products' AND column_name = 'price'"
            )
            assert cur.fetchone() == (20, 4)
            # A third decimal and a larger amount now fit.
            cur.execute("UPDATE products SET price = 123456789012.125 WHERE sku = 'sku1' RETURNING price")
            assert cur.fetchone() == (D("123456789012.1250"),)
    finally:
        conn.close()
