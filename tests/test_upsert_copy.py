"""Large batches staged with COPY: the same rows, results and history as the JSON parameter.

Every test writes the same batches twice, once staged with COPY (``copy_from=1``) and once as
one JSON parameter (``copy_from=0``), and compares what Postgres then holds, value by value."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import psycopg2
import pytest
from scrapy import Field
from support.storage_items import COLUMNS, Gadget, row

from scraper.items.base import StoredItem
from scraper.storage import history, schema, upsert
from scraper.storage.upsert import Row, TableUpserter, Watch, copy_field
from scraper.storage.writer import Pending, PostgresWriter


class Oddity(StoredItem):
    table = "oddities"
    key = ("shop", "code")
    shop = Field(sql="text")
    code = Field(sql="text")
    name = Field(sql="text")
    note = Field(sql="text")
    amount = Field(sql="numeric(12,4)")
    ratio = Field(sql="double precision")
    count = Field(sql="integer")
    flag = Field(sql="boolean")
    seen = Field(sql="timestamptz")
    day = Field(sql="date")
    body = Field(sql="jsonb")
    raw = Field(sql="json")
    tags = Field(sql="text[]")


ODD_COLUMNS = list(Oddity.columns())
JSON_COLUMNS = {"body": "jsonb", "raw": "json"}
CONTEXT = history.Context("shop", 3, "crawl")
NASTY = 'tab\there, newline\nthere, cr\r, back\\slash \\N \\. "quotes" ´é€😀 and a NUL\x00!'


@pytest.fixture
def conn(clean):
    connection = psycopg2.connect(clean.database_url)
    schema.migrate(connection, [Gadget, Oddity])
    yield connection
    connection.close()


def odd(code: str, **values) -> Row:
    base = {c: None for c in ODD_COLUMNS}
    return Row(key=("s", code), values={**base, "shop": "s", "code": code, **values})


def awkward_rows() -> list[Row]:
    return [
        odd("a", name=NASTY, note="", amount=Decimal("1.5000"), ratio=0.1, count=7, flag=True),
        odd("b", name="\\", note="\\N", amount=Decimal("-0.0001"), ratio=1e16, count=0, flag=False),
        odd(
            "c",
            name="line\nbreak",
            note="日本語 ünïcödé",
            amount=Decimal("123.45678"),  # rounded to the column's scale, alike on both paths
            seen=datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
            day=date(2026, 2, 3),
        ),
        odd("d", body={"k": "v\tw\n", "nested": [1, None, "é", {"b\\": True}]}, raw={"z": 1, "a": [2.5, "x"]}),
        odd("e", body='{"from": "text"}', raw='"a JSON string"', note="7"),
        odd("f", body="null", raw="[]", amount=Decimal("NaN"), ratio=float("inf")),
        odd("g", body=[1, 2, "three"], raw=None, ratio=float("-inf"), note="NaN and Infinity, in words"),
        odd("h", body={"nul": "a\x00b", "n": Decimal("2.50")}, raw={"ratio": float("nan")}, name="x\x00y"),
        odd("i", name=7, note=True, amount=3, count="12", flag="yes"),  # types the columns convert
        odd("j", tags=["a", "b"], name="an array: the batch goes as JSON when it holds one"),
    ]


def upserter(copy_from: int, table=Oddity) -> TableUpserter:
    return TableUpserter(
        table.table,
        list(table.columns()),
        table.key,
        3600.0,
        spider="shop",
        track=True,
        sql_history=True,
        json_columns=JSON_COLUMNS if table is Oddity else None,
        copy_from=copy_from,
    )


def write(conn, up: TableUpserter, rows: list[Row]):
    with conn, conn.cursor() as cur:
        result = up.write(cur, [Row(r.key, dict(r.values)) for r in rows], context=CONTEXT)
        if result.changes:
            history.record(cur, up.table, result.changes, CONTEXT)
    return result


def stored(conn, table: str, changes: str = "changes::text") -> tuple[list, list]:
    """The table's rows and its history, as text (what each value is, exactly), without times."""
    columns = ", ".join(f"{c}::text" for c in schema_columns(table))
    with conn, conn.cursor() as cur:
        cur.execute(f"SELECT {columns}, content_hash, spider, gone_at IS NULL FROM {table} ORDER BY shop, code")
        rows = cur.fetchall()
        cur.execute(
            f"SELECT key, kind, reason, spider, run_id, {changes}, xid IS NOT NULL FROM item_changes"
            " WHERE item_table = %s ORDER BY id",
            (table,),
        )
        return rows, cur.fetchall()


def schema_columns(table: str) -> list[str]:
    return ODD_COLUMNS if table == Oddity.table else COLUMNS


def wipe(conn) -> None:
    with conn, conn.cursor() as cur:
        cur.execute("DELETE FROM oddities; DELETE FROM gadgets; DELETE FROM item_changes")


def outcome(result) -> tuple:
    return (
        sorted(result.inserted),
        sorted(result.updated),
        [(c.key, c.kind, c.changes) for c in result.changes],
    )


def both_paths(conn, batches: list[list[Row]], table=Oddity, between=None) -> dict[str, tuple]:
    """Each batch written in turn, staged and as JSON: results, rows and history of each."""
    seen = {}
    for name, copy_from in (("copy", 1), ("json", 0)):
        wipe(conn)
        up = upserter(copy_from, table)
        results = []
        for n, batch in enumerate(batches):
            if between is not None:
                between(conn, n)
            results.append(outcome(write(conn, up, batch)))
        seen[name] = (results, *stored(conn, table.table))
    return seen


def test_awkward_values_round_trip_through_copy_as_through_json(conn) -> None:
    rows = awkward_rows()
    assert upserter(1).copy_text(rows[:-1]) is not None  # staged: only the last row needs JSON
    seen = both_paths(conn, [rows[:-1], [rows[-1]]])
    assert seen["copy"] == seen["json"]
    results, table, changes = seen["copy"]
    by_code = {r[1]: r for r in table}
    assert by_code["a"][2] == NASTY.replace("\x00", "") and by_code["a"][3] == ""
    assert by_code["b"][2:4] == ("\\", "\\N")
    assert by_code["c"][4] == "123.4568" and by_code["c"][9] == "2026-02-03"
    assert by_code["d"][11] == '{"z": 1, "a": [2.5, "x"]}'  # json keeps the text as the row held it
    assert by_code["e"][10:12] == ('{"from": "text"}', '"a JSON string"')
    assert by_code["f"][4:6] == ("NaN", "Infinity") and by_code["f"][10] == "null"
    assert by_code["h"][2] == "xy" and by_code["h"][10] == '{"n": "2.50", "nul": "ab"}'
    assert by_code["i"][2:8] == ("7", "true", "3.0000", None, "12", "true")
    assert by_code["j"][12] == "{a,b}"
    assert len(changes) == len(rows) and {c[1] for c in changes} == {"insert"}
    assert all(c[6] for c in changes)  # the history's xid default still applies


def test_a_batch_with_a_value_only_json_stores_goes_as_json() -> None:
    up = upserter(1)
    assert up.copy_text([odd("a", name="x")]) is not None
    # A list for an array column, a dict for a text column, a type written with str().
    assert up.copy_text([odd("a", name="x"), odd("b", tags=["x"])]) is None
    assert up.copy_text([odd("a", note={"k": 1})]) is None
    assert up.copy_text([odd("a", note=uuid.uuid4())]) is None
    assert copy_field(float("nan"), False, "") == "NaN" and copy_field(None, True, "") == "\\N"
    assert copy_field("a\tb\\c\nd\re\x00", False, "") == "a\\tb\\\\c\\nd\\re"


def test_inserts_changes_unchanged_gone_and_back_alike(conn) -> None:
    first = [row(f"k{i:03d}", f"name {i}", f"{i}.25") for i in range(40)]
    changed = [row(r.key[1], "renamed", "9.99") if i % 3 == 0 else r for i, r in enumerate(first)]
    more = [*changed, *(row(f"n{i:03d}", "new", "1.00") for i in range(5))]

    def between(conn, n):
        if n == 3:  # a finished run did not see some rows: marked gone, then seen again
            with conn, conn.cursor() as cur:
                cur.execute("UPDATE gadgets SET gone_at = now() WHERE code IN ('k001', 'k002')")

    seen = both_paths(conn, [first, first, changed, more], table=Gadget, between=between)
    assert seen["copy"] == seen["json"]
    results, _, changes = seen["copy"]
    assert [len(r[0]) for r in results] == [40, 0, 0, 5]
    # Seen again unchanged, a gone row is back (its history says so) but not updated.
    assert [len(r[1]) for r in results] == [0, 0, 14, 0]
    kinds = [c[1] for c in changes]
    assert kinds.count("insert") == 45 and kinds.count("update") == 14 and kinds.count("back") == 2


def test_the_staging_table_follows_a_widened_column(conn) -> None:
    up = upserter(1, Gadget)
    write(conn, up, [row("a", "A", "1.25")])
    with conn, conn.cursor() as cur:
        cur.execute("ALTER TABLE gadgets ALTER COLUMN price TYPE numeric(12,4)")
    # The same session's staging table was made with numeric(8,2): it would round to 2.35.
    write(conn, up, [row("b", "B", "2.3456")])
    with conn, conn.cursor() as cur:
        cur.execute("SELECT code, price::text FROM gadgets ORDER BY code")
        assert cur.fetchall() == [("a", "1.2500"), ("b", "2.3456")]


def test_staging_survives_a_rollback_and_two_batches_in_one_transaction(conn) -> None:
    up = upserter(1, Gadget)
    with conn.cursor() as cur:
        up.write(cur, [row("a", "A")], context=CONTEXT)
    conn.rollback()  # took the staging table it made with it
    with conn, conn.cursor() as cur:
        one = up.write(cur, [row("b", "B"), row("c", "C")], context=CONTEXT)
        two = up.write(cur, [row("d", "D")], context=CONTEXT)  # not the first batch's rows again
    assert one.inserted == {("s", "b"), ("s", "c")} and two.inserted == {("s", "d")}
    with conn, conn.cursor() as cur:
        cur.execute("SELECT code FROM gadgets ORDER BY code")
        assert cur.fetchall() == [("b",), ("c",), ("d",)]
        cur.execute("SELECT key FROM item_changes ORDER BY id")
        assert [k for (k,) in cur.fetchall()] == [["s", "b"], ["s", "c"], ["s", "d"]]


def test_changes_held_back_by_the_watch_alike(conn) -> None:
    first = [row(f"p{i}", f"name {i}", "10.00") for i in range(6)]
    moved = [
        row(r.key[1], "renamed" if i < 2 else r.values["name"], "50.00" if i % 2 else "10.50")
        for i, r in enumerate(first)
    ]
    seen = {}
    for name, copy_from in (("copy", 1), ("json", 0)):
        wipe(conn)
        up = upserter(copy_from, Gadget)
        write(conn, up, first)
        up.watch = Watch(moves={"price": 0.2}, blanks=frozenset())
        result = write(conn, up, moved)
        awaiting = {k: waiting for k, (_, waiting) in result.awaiting.items()}
        seen[name] = (outcome(result), awaiting, result.pairs, *stored(conn, "gadgets"))
    assert seen["copy"] == seen["json"]
    assert set(seen["copy"][1]) == {("s", "p1"), ("s", "p3"), ("s", "p5")}


def test_the_writer_isolates_a_refused_row_of_a_staged_batch(clean, monkeypatch) -> None:
    monkeypatch.setattr(upsert, "COPY_FROM", 2)
    writer = PostgresWriter(clean.database_url, history_context=lambda: CONTEXT)
    writer._conn = writer._connect()
    schema.migrate(writer._conn, [Gadget])
    writer._register(Gadget)
    assert writer._upserters["gadgets"].copy_from == 2
    pendings = [Pending(row("ok1", "fine"), None), Pending(row("huge", "too big", "123456789.00"), None)]
    pendings.append(Pending(row("ok2", "fine"), None))
    outcome = writer._write({"gadgets": pendings}, [])["gadgets"]
    assert outcome.inserted == {("s", "ok1"), ("s", "ok2")}
    assert list(outcome.failed) == [("s", "huge")] and "numeric field overflow" in outcome.failed[("s", "huge")]
    with writer._conn, writer._conn.cursor() as cur:
        cur.execute("SELECT key FROM item_changes ORDER BY id")
        assert [k for (k,) in cur.fetchall()] == [["s", "ok1"], ["s", "ok2"]]
    writer._conn.close()


def test_history_entries_leave_out_sql_and_json_nulls_as_the_python_path(conn) -> None:
    """The merge builds an insert's entry itself; the upserter's own path reads the row back
    with to_jsonb: both leave out a column without a value, SQL NULL or JSON null."""
    rows = [odd("n1", body="null", raw="null", name="x"), odd("n2", body={"k": None}, raw=[None]), *awkward_rows()[:-1]]
    recorded = {}
    for name, sql_history in (("sql", True), ("python", False)):
        wipe(conn)
        up = TableUpserter(
            "oddities", ODD_COLUMNS, ("shop", "code"), 3600.0, spider="shop", track=True,
            sql_history=sql_history, json_columns=JSON_COLUMNS,
        )  # fmt: skip
        with conn, conn.cursor() as cur:
            result = up.write(cur, [Row(r.key, dict(r.values)) for r in rows], context=CONTEXT if sql_history else None)
            if result.changes:
                history.record(cur, "oddities", result.changes, CONTEXT)
        # As JSON values: the Python path's numbers went through floats (1.5000 -> 1.5).
        recorded[name] = stored(conn, "oddities", changes="changes")[1]
    assert recorded["sql"] == recorded["python"]
    entries = {tuple(k): c for k, _, _, _, _, c, _ in recorded["sql"]}
    assert "body" not in entries[("s", "n1")] and "raw" not in entries[("s", "n1")]
    assert entries[("s", "n2")]["body"] == [None, {"k": None}] and entries[("s", "n2")]["raw"] == [None, [None]]


def test_a_role_without_temporary_tables_falls_back_to_json(clean, monkeypatch, caplog) -> None:
    """A role that may not make temporary tables cannot stage: its flush is written again row
    by row, and every later batch goes as JSON, with the same rows and history."""
    from urllib.parse import urlsplit, urlunsplit

    role = f"upsert_no_temp_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(clean.database_url)
    admin.autocommit = True
    database = urlsplit(clean.database_url).path.lstrip("/")
    schema.migrate(admin, [Gadget])
    with admin.cursor() as cur:
        cur.execute(f"CREATE ROLE {role} LOGIN")
        cur.execute(f"GRANT ALL ON SCHEMA public TO {role}; GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        cur.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
        cur.execute(f'REVOKE TEMPORARY ON DATABASE "{database}" FROM PUBLIC')
    parts = urlsplit(clean.database_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    dsn = urlunsplit((parts.scheme, f"{role}@{host}", parts.path, parts.query, ""))
    monkeypatch.setattr(upsert, "COPY_FROM", 2)
    writer = PostgresWriter(dsn, history_context=lambda: CONTEXT)
    try:
        writer._conn = writer._connect()
        writer._register(Gadget)
        with caplog.at_level("WARNING"):
            first = writer._write({"gadgets": [Pending(row("a", "A"), None), Pending(row("b", "B"), None)]}, [])
            second = writer._write({"gadgets": [Pending(row("c", "C"), None), Pending(row("d", "D"), None)]}, [])
        assert first["gadgets"].inserted == {("s", "a"), ("s", "b")} and not first["gadgets"].failed
        assert second["gadgets"].inserted == {("s", "c"), ("s", "d")}
        assert writer._upserters["gadgets"].copy_from == 0
        assert caplog.text.count("Cannot stage batches of gadgets with COPY") == 1
        with writer._conn, writer._conn.cursor() as cur:
            cur.execute("SELECT key, kind FROM item_changes ORDER BY id")
            assert cur.fetchall() == [(["s", k], "insert") for k in "abcd"]
    finally:
        if writer._conn is not None:
            writer._conn.close()
        with admin.cursor() as cur:
            cur.execute(f'GRANT TEMPORARY ON DATABASE "{database}" TO PUBLIC')
            cur.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")
        admin.close()
