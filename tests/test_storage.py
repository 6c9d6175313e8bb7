"""The upsert SQL and the batched writer, against a real Postgres."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import psycopg2
import pytest
from scrapy import Field
from support.storage_items import COLUMNS, Gadget, row

from scraper.items.base import StoredItem
from scraper.storage import history, schema
from scraper.storage.upsert import Row, TableUpserter
from scraper.storage.writer import Pending, PostgresWriter, outcomes


@pytest.fixture
def conn(clean):
    connection = psycopg2.connect(clean.database_url)
    schema.migrate(connection, [Gadget])
    yield connection
    connection.close()


def write(conn, rows, resolution=3600.0):
    upserter = TableUpserter("gadgets", COLUMNS, ("shop", "code"), resolution)
    with conn, conn.cursor() as cur:
        return upserter.write(cur, rows)


def test_awkward_text_survives_exactly(conn) -> None:
    nasty = 'tab\there, newline\nthere, cr\r, back\\slash \\N "quotes" ´é€😀 and a NUL\x00!'
    write(
        conn,
        [
            row("a", nasty),
            Row(
                key=("s", "b"),
                values={
                    "shop": "s",
                    "code": "b",
                    "name": None,
                    "price": None,
                    "seen": datetime(2026, 1, 2, tzinfo=UTC),
                },
            ),
        ],
    )
    with conn.cursor() as cur:
        cur.execute("SELECT code, name, price, seen FROM gadgets ORDER BY code")
        assert cur.fetchall() == [
            ("a", nasty.replace("\x00", ""), Decimal("1.00"), None),
            ("b", None, None, datetime(2026, 1, 2, tzinfo=UTC)),
        ]


def test_values_plain_json_cannot_carry_are_stored_as_they_read(conn) -> None:
    """A batch travels as JSON, which has no NaN and whose NUL escape Postgres' text refuses:
    such rows take another path, and a word like "NaN" inside a string changes nothing."""
    rows = [
        row("a", "NaN and Infinity, in words"),
        Row(key=("s", "b"), values={"shop": "s", "code": "b", "name": "b\x00", "price": float("nan"), "seen": None}),
        Row(key=("s", "c"), values={"shop": "s", "code": "c", "name": 7, "price": 2.5, "seen": None}),
    ]
    result = write(conn, rows)
    assert result.inserted == {("s", "a"), ("s", "b"), ("s", "c")}
    with conn.cursor() as cur:
        cur.execute("SELECT code, name, price::text, content_hash FROM gadgets ORDER BY code")
        got = cur.fetchall()
    assert [g[:3] for g in got] == [("a", "NaN and Infinity, in words", "1.00"), ("b", "b", "NaN"), ("c", "7", "2.50")]
    # Written again unchanged, nothing is rewritten: the stored hash is each row's own.
    assert [g[3] for g in got] == [r.content_hash for r in rows]
    again = write(conn, [Row(r.key, dict(r.values)) for r in rows])
    assert not again.inserted and not again.updated


def test_outcomes_inserted_updated_unchanged(conn) -> None:
    first = write(conn, [row("a", "A"), row("b", "B")])
    assert first.inserted == {("s", "a"), ("s", "b")} and not first.updated
    with conn.cursor() as cur:
        cur.execute("SELECT code, updated_at, xmin::text FROM gadgets ORDER BY code")
        before = cur.fetchall()
    second = write(conn, [row("a", "A"), row("b", "B2")])
    assert not second.inserted and second.updated == {("s", "b")}
    with conn.cursor() as cur:
        cur.execute("SELECT code, updated_at, xmin::text FROM gadgets ORDER BY code")
        after = cur.fetchall()
    # The unchanged row was not even rewritten (same tuple version), the changed one was.
    assert after[0] == before[0]
    assert after[1][1] > before[1][1] and after[1][2] != before[1][2]


def test_last_seen_refresh_is_bounded_by_its_resolution(conn) -> None:
    write(conn, [row("a", "A")])
    with conn.cursor() as cur:
        cur.execute("SELECT last_seen, updated_at FROM gadgets")
        seen1, updated1 = cur.fetchone()
    result = write(conn, [row("a", "A")], resolution=0)  # 0: refresh on every sighting
    assert not result.inserted and not result.updated
    with conn.cursor() as cur:
        cur.execute("SELECT last_seen, updated_at FROM gadgets")
        seen2, updated2 = cur.fetchone()
    assert seen2 > seen1 and updated2 == updated1


def test_prepared_statements_outlive_a_rolled_back_batch_and_follow_a_new_connection(conn, clean) -> None:
    # The merge and the lock are prepared once per connection, in the first batch's
    # transaction: a rollback of that transaction does not take them away.
    upserter = TableUpserter("gadgets", COLUMNS, ("shop", "code"), 3600.0, track=True)
    with conn.cursor() as cur:
        upserter.write(cur, [row("a", "A")])
    conn.rollback()
    with conn, conn.cursor() as cur:
        result = upserter.write(cur, [row("b", "B")])
    assert result.inserted == {("s", "b")} and [c.kind for c in result.changes] == ["insert"]
    other = psycopg2.connect(clean.database_url)  # the writer's reconnect after an outage
    try:
        with other, other.cursor() as cur:
            result = upserter.write(cur, [row("b", "B2"), row("c", "C")])
        assert result.inserted == {("s", "c")} and result.updated == {("s", "b")}
        assert {c.kind: c.changes.get("name") for c in result.changes} == {"update": ["B", "B2"], "insert": [None, "C"]}
    finally:
        other.close()
    with conn.cursor() as cur:
        cur.execute("SELECT code, name FROM gadgets ORDER BY code")
        assert cur.fetchall() == [("b", "B2"), ("c", "C")]


def test_writer_carries_on_when_prepared_statements_are_gone(clean, caplog) -> None:
    # As behind a pooler in transaction mode: the next batch runs on a session that never
    # prepared them. The batch is written again, and every later one without them.
    writer = PostgresWriter(clean.database_url)
    writer._conn = writer._connect()
    schema.migrate(writer._conn, [Gadget])
    writer._register(Gadget)
    first = writer._write({"gadgets": [Pending(row("a", "A"), None)]}, [])
    assert first["gadgets"].inserted == {("s", "a")}
    with writer._conn, writer._conn.cursor() as cur:
        cur.execute("DEALLOCATE ALL")
    with caplog.at_level("WARNING"):
        again = writer._write({"gadgets": [Pending(row("a", "A2"), None), Pending(row("b", "B"), None)]}, [])
        with writer._conn, writer._conn.cursor() as cur:
            cur.execute("DEALLOCATE ALL")
        third = writer._write({"gadgets": [Pending(row("c", "C"), None)]}, [])
    assert again["gadgets"].updated == {("s", "a")} and again["gadgets"].inserted == {("s", "b")}
    assert third["gadgets"].inserted == {("s", "c")}
    assert caplog.text.count("planned for every batch from now on") == 1
    assert caplog.text.count("retrying the batch") == 1  # the third needed no retry
    with writer._conn.cursor() as cur:
        cur.execute("SELECT code, name FROM gadgets ORDER BY code")
        assert cur.fetchall() == [("a", "A2"), ("b", "B"), ("c", "C")]
    writer._conn.close()


def test_writer_isolates_a_row_the_database_refuses(clean) -> None:
    # Driven synchronously: the thread-side of the writer is plain code.
    writer = PostgresWriter(clean.database_url)
    writer._conn = writer._connect()
    schema.migrate(writer._conn, [Gadget])
    writer._register(Gadget)
    pendings = [
        Pending(row("ok1", "fine"), None),
        Pending(row("huge", "too big", "123456789.00"), None),
        Pending(row("ok2", "fine"), None),
    ]
    results = writer._write({"gadgets": pendings}, [])
    outcome = results["gadgets"]
    assert outcome.inserted == {("s", "ok1"), ("s", "ok2")}
    assert list(outcome.failed) == [("s", "huge")] and "numeric field overflow" in outcome.failed[("s", "huge")]
    writer._conn.close()


def test_a_key_twice_in_a_batch_is_one_row_and_counted_once(clean) -> None:
    writer = PostgresWriter(clean.database_url)
    writer._conn = writer._connect()
    schema.migrate(writer._conn, [Gadget])
    writer._register(Gadget)
    pendings = [Pending(row("a", "A"), None), Pending(row("b", "B"), None), Pending(row("a", "A2"), None)]
    result = writer._write({"gadgets": pendings}, [])["gadgets"]
    assert [o for _, o in outcomes(pendings, result)] == ["unchanged", "inserted", "inserted"]
    again = [Pending(row("a", "A3"), None), Pending(row("a", "A3"), None), Pending(row("b", "B"), None)]
    result = writer._write({"gadgets": again}, [])["gadgets"]
    assert [o for _, o in outcomes(again, result)] == ["unchanged", "updated", "unchanged"]
    with writer._conn.cursor() as cur:
        cur.execute("SELECT code, name FROM gadgets ORDER BY code")
        assert cur.fetchall() == [("a", "A3"), ("b", "B")]
    writer._conn.close()


class Document(StoredItem):
    table = "documents_of_a_shop_with_a_rather_long_table_name_x"  # 51 characters
    key = ("code",)
    code = Field(sql="text")
    body = Field(sql="jsonb")
    raw = Field(sql="json")


def test_json_columns_take_json_text_as_copy_did_and_long_names_with_history(clean) -> None:
    """A string for a json column is JSON text (as when batches were loaded with COPY): parsed,
    or refused with the database's reason; a dict is stored as it is. The table's name is
    past what Postgres' 63-byte statement names could hold once prefixed."""
    writer = PostgresWriter(clean.database_url, history_context=lambda: history.Context("shop", 1))
    writer._conn = writer._connect()
    schema.migrate(writer._conn, [Document])
    writer._register(Document)

    def doc(code, body, raw):
        return Pending(Row(key=(code,), values={"code": code, "body": body, "raw": raw}), None)

    results = writer._write(
        {
            Document.table: [
                doc("a", '{"n": 1}', "[1, 2]"),
                doc("b", {"n": [2, None]}, {"k": "v"}),
                doc("c", "not json", None),
                doc("d", None, '"text"'),
            ]
        },
        [],
    )
    outcome = results[Document.table]
    assert outcome.inserted == {("a",), ("b",), ("d",)}
    assert list(outcome.failed) == [("c",)] and "invalid input syntax for type json" in outcome.failed[("c",)]
    with writer._conn.cursor() as cur:
        cur.execute(f"SELECT code, body, raw::text FROM {Document.table} ORDER BY code")
        assert cur.fetchall() == [
            ("a", {"n": 1}, "[1, 2]"),
            ("b", {"n": [2, None]}, '{"k": "v"}'),
            ("d", None, '"text"'),
        ]
        cur.execute("SELECT key, changes FROM item_changes WHERE item_table = %s ORDER BY key::text", (Document.table,))
        assert [r[0] for r in cur.fetchall()] == [["a"], ["b"], ["d"]]
    writer._conn.close()


def test_a_table_that_lost_a_column_fails_its_rows_not_the_flush(clean) -> None:
    writer = PostgresWriter(clean.database_url)
    writer._conn = writer._connect()
    schema.migrate(writer._conn, [Gadget, Document])
    writer._register(Gadget)
    writer._register(Document)
    with writer._conn, writer._conn.cursor() as cur:
        cur.execute("ALTER TABLE gadgets DROP COLUMN seen")
    results = writer._write(
        {
            "gadgets": [Pending(row("a", "A"), None), Pending(row("b", "B"), None)],
            Document.table: [Pending(Row(key=("x",), values={"code": "x", "body": None, "raw": None}), None)],
        },
        [],
    )
    assert sorted(results["gadgets"].failed) == [("s", "a"), ("s", "b")]
    assert all("seen" in reason for reason in results["gadgets"].failed.values())
    assert results[Document.table].inserted == {("x",)}
    writer._conn.close()


def test_writer_retries_a_serialization_failure(clean, caplog) -> None:
    import threading

    serializable = (
        clean.database_url
        + ("&" if "?" in clean.database_url else "?")
        + "options=-c%20default_transaction_isolation%3Dserializable"
    )
    writer = PostgresWriter(serializable)
    writer._conn = writer._connect()
    schema.migrate(writer._conn, [Gadget])
    writer._register(Gadget)
    write(writer._conn, [row("x", "v0")])

    # Another worker holds the row in an open serializable transaction...
    other = psycopg2.connect(serializable)
    with other.cursor() as cur:
        cur.execute("UPDATE gadgets SET name = 'v1', content_hash = 'h1' WHERE code = 'x'")
    results: list = []
    thread = threading.Thread(
        target=lambda: results.append(writer._write({"gadgets": [Pending(row("x", "v2"), None)]}, []))
    )
    with caplog.at_level("INFO"):
        thread.start()
        thread.join(timeout=1)
        assert thread.is_alive()  # ...so our batch waits on its lock,
        other.commit()  # and fails with 40001 once that transaction commits,
        thread.join(timeout=30)
    assert results and results[0]["gadgets"].updated == {("s", "x")}  # then succeeds on retry.
    assert "Retrying a batch after SerializationFailure" in caplog.text
    with other.cursor() as cur:
        cur.execute("SELECT name FROM gadgets WHERE code = 'x'")
        assert cur.fetchone() == ("v2",)
    other.close()
    writer._conn.close()


def test_canonical_json_is_the_text_stored_hashes_were_computed_from() -> None:
    """Content hashes in existing tables were computed from this exact text: a change would make
    every stored row look changed on its next sighting."""
    import json
    from datetime import date

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from scraper.storage.upsert import _jsonable, canonical_json

    def before(values):
        return json.dumps({k: _jsonable(v) for k, v in sorted(values.items())}, default=str, ensure_ascii=False)

    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(),
        st.decimals(),
        st.datetimes(timezones=st.none() | st.just(UTC)),
        st.dates(),
        st.builds(lambda n: type("Odd", (), {"__str__": lambda self: f"odd{n}"})(), st.integers()),
    )
    values = st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3), max_leaves=8
    )

    @given(st.dictionaries(st.text(), values, max_size=12))
    @settings(max_examples=500, deadline=None)
    def same(row):
        assert canonical_json(row) == before(row)
        assert canonical_json(row) == before(row)  # its sorted order now remembered

    same()
    assert canonical_json({"b": date(2026, 1, 2), "a": Decimal("1.50")}) == '{"a": "1.50", "b": "2026-01-02"}'
    looped: list = []
    looped.append(looped)
    for _ in range(2):  # the check holds on a next call too: nothing is left marked by the failed one
        with pytest.raises(ValueError, match="Circular reference"):
            canonical_json({"a": looped})
    assert canonical_json({"a": [1.5, float("nan")], "b": {"c": None}}) == '{"a": [1.5, NaN], "b": {"c": null}}'
