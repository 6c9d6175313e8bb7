"""`scrapy export TABLE -o FILE.parquet` as a real process on the test Postgres, the file read back
by two readers we did not write (pyarrow and duckdb) and compared with Postgres row for row."""

from __future__ import annotations

import json
import math
import os
import struct
from datetime import UTC, datetime
from decimal import Decimal

import duckdb
import psycopg2
import pyarrow as pa
import pyarrow.parquet as pq
from support.crawls import crawl_env, run_scrapy, run_scrapy_many

GENERATED = 20_000  # past one chunk of rows (16,384): the file is assembled from several

SCHEMA = """
CREATE TYPE mood AS ENUM ('calm', 'très content');
CREATE TABLE everything (
    id          bigint PRIMARY KEY,
    n           integer,
    s           smallint,
    price       numeric(20,4),
    whole       numeric(12),
    ratio       numeric,
    huge        numeric(50,10),
    title       text,
    code        varchar(10),
    ok          boolean,
    r           real,
    d           double precision,
    at          timestamptz,
    local_at    timestamp,
    day         date,
    doc         jsonb,
    raw         json,
    tags        text[],
    nums        integer[],
    u           uuid,
    span        interval,
    t           time,
    addr        inet,
    b           bytea,
    feeling     mood,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
"""

# The awkward rows: NULLs, empty strings, quotes, commas and newlines inside values, unicode,
# decimals at the edges of their scale, several zones, values past what floats hold exactly.
AWKWARD = """
INSERT INTO everything VALUES
 (1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, DEFAULT),
 (2, -2147483648, -32768, 0.0001, 123456789012, 'NaN', '-12345678901234567890123456789012345678.0123456789',
  '', '', false, 'NaN', '-Infinity', '2026-11-30 23:59:59.999999-09:30', '0001-01-01 00:00:00',
  '0001-01-01', '{}', '[]', '{}', '{}', '00000000-0000-0000-0000-000000000000', '0', '00:00', '::1',
  '\\x', 'calm', DEFAULT),
 (3, 2147483647, 32767, 9999999999999999.9999, 999999999999,
  '3.14159265358979323846264338327950288419716939937510582097494459',
  '1234567890123456789012345678901234567890.0123456789', E'quote " comma , new\\nline\\r\\n end',
  E'tab\\there', true, 3.4028235e38, 1.7976931348623157e308, '2026-03-29 01:30:00.5+01', '2026-12-31 23:59:59.999999',
  '9999-12-31', '{"naïve": "日本語 🎉", "n": 1.10, "deep": {"list": [1, null, "x"]}, "q": "a\\"b"}',
  '{"kept":   "as written", "dup": 1, "dup": 2}', ARRAY['a', NULL, 'with "quotes"', 'comma,here', 'ü'],
  ARRAY[1, NULL, -3], 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '1 year 2 mons 3 days 04:05:06.7', '24:00:00',
  '192.168.0.1/24', '\\x00ff10', 'très content', DEFAULT),
 (4, 0, 0, -1.5, -7, '-0.00000000000000000001', 0, 'Größe «42» — 日本語 🎉 ' || repeat('x', 5000), 'NULL', true,
  0.1, 0.1, '1969-12-31 23:59:59.999999+00', '1999-01-08 04:05:06', '2000-02-29', 'null', ' "text" ',
  ARRAY['NULL', ''], ARRAY[]::int[], NULL, '-1 days', '12:34:56.789', NULL, NULL, NULL, DEFAULT)
"""

GENERATE = f"""
INSERT INTO everything (id, n, s, price, whole, ratio, huge, title, code, ok, r, d, at, local_at, day, doc, raw,
                        tags, nums, u, span, t, addr, b, feeling, updated_at)
SELECT 100 + i, i, (i % 30000)::smallint, round(i / 7.0, 4), i * 1000, i / 3.0, i::numeric / 11,
       format('Produkt %s — «%s»', i, md5(i::text)), left(md5(i::text), 10), i % 2 = 0,
       i / 9.0, i / 13.0, timestamptz '2020-01-01 00:00:00+00' + i * interval '61 minutes 0.123457 seconds',
       timestamp '2020-01-01' + i * interval '1 hour', date '2020-01-01' + i % 3000,
       jsonb_build_object('i', i, 'name', format('n°%s', i)), format('{{"i": %s}}', i)::json,
       ARRAY[format('t%s', i % 5)], ARRAY[i, i + 1], md5(i::text)::uuid, i * interval '1 minute',
       time '00:00' + i * interval '1 second', '10.0.0.1', decode(md5(i::text), 'hex'),
       (ARRAY['calm', 'très content']::mood[])[1 + i % 2],
       now() - (i % 48) * interval '1 hour'
FROM generate_series(1, {GENERATED}) AS i
"""


def _text(column: str) -> str:
    # Postgres' own text of a value: its output function (format's %s; ::text differs for inet).
    return f"CASE WHEN {column} IS NULL THEN NULL ELSE format('%s', {column}) END"


# What Postgres holds, as the comparison takes it: values whose Parquet column is text as
# Postgres' text of them; arrays parsed by psycopg2; jsonb as text (parsed, 'null' would be None).
POSTGRES_ROWS = f"""
SELECT id, n, s, price, whole, {_text("ratio")}, {_text("huge")}, title, code, ok, r, d, at, local_at, day,
       {_text("doc")}, {_text("raw")}, tags, nums, {_text("u")}, {_text("span")}, {_text("t")}, {_text("addr")},
       {_text("b")}, {_text("feeling")}, updated_at
FROM everything {{where}} ORDER BY id
"""

EXPECTED_TYPES = {
    "id": pa.int64(),
    "n": pa.int32(),
    "s": pa.int16(),
    "price": pa.decimal128(20, 4),
    "whole": pa.decimal128(12, 0),
    "ratio": pa.string(),  # numeric without precision: its exact text
    "huge": pa.string(),  # past 38 digits: its exact text
    "title": pa.string(),
    "code": pa.string(),
    "ok": pa.bool_(),
    "r": pa.float32(),
    "d": pa.float64(),
    "at": pa.timestamp("us", "UTC"),
    "local_at": pa.timestamp("us"),
    "day": pa.date32(),
    "doc": pa.json_(pa.string()),
    "raw": pa.json_(pa.string()),
    "tags": pa.json_(pa.string()),
    "nums": pa.json_(pa.string()),
    "u": pa.string(),
    "span": pa.string(),
    "t": pa.string(),
    "addr": pa.string(),
    "b": pa.string(),
    "feeling": pa.string(),  # an enum: a type the export does not know, as text
    "updated_at": pa.timestamp("us", "UTC"),
}
JSON_COLUMNS = ("tags", "nums")  # compared parsed: psycopg2 hands arrays over as lists


def _fill(services) -> None:
    conn = psycopg2.connect(services.database_url)
    with conn, conn.cursor() as cur:
        cur.execute(SCHEMA)
        cur.execute(AWKWARD)
        cur.execute(GENERATE)
    conn.close()


def _same(column: str, ours: object, theirs: object) -> bool:
    if theirs is None or ours is None:
        return ours is None and theirs is None
    if column in JSON_COLUMNS:
        return json.loads(ours) == theirs
    if column == "r":  # a real: the same 32-bit float
        return struct.pack("f", theirs) == struct.pack("f", ours) or (math.isnan(ours) and math.isnan(theirs))
    if column == "d" and isinstance(theirs, float) and math.isnan(theirs):
        return math.isnan(ours)
    if isinstance(theirs, Decimal):
        # Exact, scale included: 19.9900 stays 19.9900.
        return isinstance(ours, Decimal) and str(ours) == str(theirs)
    if isinstance(theirs, datetime) and theirs.tzinfo is not None:
        return ours.tzinfo is not None and ours.utcoffset().total_seconds() == 0 and ours == theirs
    return type(ours) is type(theirs) and ours == theirs


def _compare(reader: str, columns: list[str], got: list[tuple], expected: list[tuple]) -> None:
    assert len(got) == len(expected), (reader, len(got), len(expected))
    for ours, theirs in zip(got, expected):
        for column, a, b in zip(columns, ours, theirs):
            assert _same(column, a, b), (reader, column, theirs[0], a, b)


def _read_back(path: str) -> tuple[list[str], list[tuple], list[tuple]]:
    """(column names, rows by pyarrow, rows by duckdb), both in id order."""
    table = pq.read_table(path).sort_by("id")
    by_pyarrow = list(zip(*(table.column(c).to_pylist() for c in table.column_names)))
    db = duckdb.connect()
    db.execute("SET TimeZone = 'UTC'")
    by_duckdb = db.sql(f"SELECT * FROM read_parquet('{path}') ORDER BY id").fetchall()
    return table.column_names, by_pyarrow, by_duckdb


def test_parquet_holds_what_postgres_holds_typed_row_for_row(clean, tmp_path) -> None:
    _fill(clean)
    path = str(tmp_path / "everything.parquet")
    result = run_scrapy(crawl_env(clean), "export", "everything", "-o", path, "--progress", "0")
    total = GENERATED + 4
    assert result.returncode == 0, result.stderr
    assert f"exported {total} row(s) from everything to {path}" in result.stderr, result.stderr
    # The progress line, after each chunk of rows here (--progress 0).
    assert "export: 16,384 rows (" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not [name for name in os.listdir(tmp_path) if name != "everything.parquet"]  # no partial file left

    schema = pq.read_schema(path)
    assert {f.name: f.type for f in schema} == EXPECTED_TYPES
    assert schema.field("doc").metadata == {b"postgres_type": b"jsonb"}
    parquet_schema = str(pq.ParquetFile(path).schema)
    assert "doc (JSON)" in parquet_schema and "isAdjustedToUTC=true" in parquet_schema
    db = duckdb.connect()
    described = dict((name, kind) for name, kind, *_ in db.sql(f"DESCRIBE SELECT * FROM '{path}'").fetchall())
    assert described["price"] == "DECIMAL(20,4)" and described["at"] == "TIMESTAMP WITH TIME ZONE"
    assert described["doc"] == "JSON" and described["ratio"] == "VARCHAR" and described["ok"] == "BOOLEAN"

    expected = clean.query(POSTGRES_ROWS.format(where=""))
    columns, by_pyarrow, by_duckdb = _read_back(path)
    assert columns == list(EXPECTED_TYPES)
    _compare("pyarrow", columns, by_pyarrow, expected)
    _compare("duckdb", columns, by_duckdb, expected)

    # A few values spelled out, so that a bug shared by both readers and the comparison shows.
    rows = {row[0]: dict(zip(columns, row)) for row in by_pyarrow[:4]}
    assert all(value is None for name, value in rows[1].items() if name not in ("id", "updated_at"))
    assert rows[2]["title"] == "" and rows[2]["code"] == "" and rows[2]["ratio"] == "NaN"
    assert rows[2]["huge"] == "-12345678901234567890123456789012345678.0123456789"
    assert rows[2]["at"] == datetime(2026, 12, 1, 9, 29, 59, 999999, tzinfo=UTC)
    assert rows[3]["price"] == Decimal("9999999999999999.9999") and rows[4]["price"] == Decimal("-1.5000")
    assert rows[3]["title"] == 'quote " comma , new\nline\r\n end' and rows[4]["code"] == "NULL"
    assert json.loads(rows[3]["doc"])["naïve"] == "日本語 🎉" and rows[4]["doc"] == "null"
    assert rows[3]["raw"] == '{"kept":   "as written", "dup": 1, "dup": 2}'  # json keeps its text
    assert json.loads(rows[3]["tags"]) == ["a", None, 'with "quotes"', "comma,here", "ü"]
    assert rows[3]["t"] == "24:00:00" and rows[3]["feeling"] == "très content"
    assert by_duckdb[2][columns.index("price")] == Decimal("9999999999999999.9999")
    (price_sum,) = db.sql(f"SELECT sum(price) FROM '{path}'").fetchall()[0]
    assert price_sum == clean.query("SELECT sum(price) FROM everything")[0][0]


def test_where_and_since_apply_and_stdout_stays_json_lines(clean, tmp_path) -> None:
    _fill(clean)
    env = crawl_env(clean)
    where = "n % 3 = 0 AND title IS NOT NULL"
    both, since, stdout = run_scrapy_many(
        env,
        ("export", "everything", "-o", str(tmp_path / "both.parquet"), "--since", "6h", "--where", where),
        ("export", "everything", "-o", str(tmp_path / "since.parquet"), "--since", "6h"),
        ("export", "everything", "-o", "-", "--where", "id < 5"),
    )
    for result in (both, since, stdout):
        assert result.returncode == 0, result.stderr
    recent = "updated_at >= now() - interval '6 hours'"
    for name, condition in (("both", f"{recent} AND ({where})"), ("since", recent)):
        expected = clean.query(POSTGRES_ROWS.format(where=f"WHERE {condition}"))
        assert 0 < len(expected) < GENERATED
        columns, by_pyarrow, by_duckdb = _read_back(str(tmp_path / f"{name}.parquet"))
        _compare(f"pyarrow {name}", columns, by_pyarrow, expected)
        _compare(f"duckdb {name}", columns, by_duckdb, expected)
    assert [json.loads(line)["id"] for line in stdout.stdout.splitlines()] == [1, 2, 3, 4]


def test_bad_path_bad_condition_and_unholdable_values_leave_no_file(clean, tmp_path) -> None:
    conn = psycopg2.connect(clean.database_url)
    with conn, conn.cursor() as cur:
        # The bad values in the second and third chunk of rows: the export stops in mid-COPY.
        cur.execute(
            "CREATE TABLE odd (id int, p numeric(10,2), day date);"
            "INSERT INTO odd SELECT i, CASE WHEN i = 20000 THEN 'NaN'::numeric ELSE i END,"
            " CASE WHEN i = 40000 THEN 'infinity' ELSE date '2026-01-01' END FROM generate_series(1, 60000) i"
        )
    conn.close()
    existing = tmp_path / "kept.parquet"
    existing.write_bytes(b"an earlier export")
    missing_folder = tmp_path / "no" / "such" / "odd.parquet"
    env = crawl_env(clean)
    no_folder, bad_where, nan, infinite, fine = run_scrapy_many(
        env,
        ("export", "odd", "-o", str(missing_folder)),
        ("export", "odd", "-o", str(existing), "--where", "nope > 1"),
        ("export", "odd", "-o", str(existing)),
        ("export", "odd", "-o", str(existing), "--where", "p <> 'NaN'"),
        ("export", "odd", "-o", str(tmp_path / "fine.parquet"), "--where", "p <> 'NaN' AND isfinite(day)"),
    )
    assert no_folder.returncode == 2, no_folder.stderr
    assert no_folder.stderr == f"error: export: -o {missing_folder}: no folder {missing_folder.parent}\n"
    assert bad_where.returncode == 2 and bad_where.stderr.startswith('error: export: --where: column "nope"')
    assert nan.returncode == 1 and nan.stderr.startswith("error: export: column p (numeric): "), nan.stderr
    assert "'NaN'" in nan.stderr and "--where" in nan.stderr and len(nan.stderr.splitlines()) == 1
    assert infinite.returncode == 1 and "column day (date)" in infinite.stderr and "'infinity'" in infinite.stderr
    assert fine.returncode == 0 and pq.read_metadata(tmp_path / "fine.parquet").num_rows == 59998, fine.stderr
    # What failed wrote nothing: the earlier file as it was, no partial file beside it.
    assert existing.read_bytes() == b"an earlier export"
    assert sorted(os.listdir(tmp_path)) == ["fine.parquet", "kept.parquet"]
