"""Change history at the storage level: inserts and changes recorded with old and new values,
nothing for unchanged rows, and unchanged rows still (nearly) free in WAL."""

from __future__ import annotations

import json
from datetime import UTC

import psycopg2
import pytest
from support.storage_items import COLUMNS, Gadget, row

from scraper.storage import history, schema
from scraper.storage.upsert import Row, TableUpserter


@pytest.fixture
def conn(clean):
    connection = psycopg2.connect(clean.database_url)
    schema.migrate(connection, [Gadget])
    yield connection
    connection.close()


def upserter() -> TableUpserter:
    return TableUpserter("gadgets", COLUMNS, ("shop", "code"), 3600.0, spider="shop", track=True)


def write(conn, rows, reason: str = "crawl"):
    up = upserter()
    with conn, conn.cursor() as cur:
        result = up.write(cur, rows)
        history.record(cur, "gadgets", result.changes, history.Context("shop", 7, reason))
    return result


def entries(conn) -> list[tuple]:
    with conn, conn.cursor() as cur:
        cur.execute("SELECT key, kind, reason, run_id, changes FROM item_changes ORDER BY id")
        return cur.fetchall()


def test_insert_and_change_recorded_unchanged_not(conn) -> None:
    rows = [row(f"c{i}", f"n{i}", "1.00") for i in range(20)]
    write(conn, rows)
    inserted = entries(conn)
    assert len(inserted) == 20 and {e[1] for e in inserted} == {"insert"}
    assert inserted[0][0] == ["s", "c0"] and inserted[0][4]["price"] == [None, 1.0]
    assert inserted[0][3] == 7

    write(conn, rows)  # the same rows again: no history
    assert len(entries(conn)) == 20

    changed = [row(f"c{i}", f"n{i}", "2.50" if i < 3 else "1.00") for i in range(20)]
    result = write(conn, changed, reason="reprocess")
    assert result.updated == {("s", "c0"), ("s", "c1"), ("s", "c2")}
    updates = entries(conn)[20:]
    assert [(e[0], e[1], e[2], e[4]) for e in updates] == [
        (["s", f"c{i}"], "update", "reprocess", {"price": [1.0, 2.5]}) for i in range(3)
    ]


def _wal_bytes(cur, up, name, rows) -> int:
    cur.execute("EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + up.statement(cur, name), (up.rows_json(rows),))
    plan = cur.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return int(plan[0]["Plan"].get("WAL Bytes", 0))


def test_unchanged_rows_cost_at_most_two_bytes_of_wal_each(conn) -> None:
    n = 2000
    rows = [row(f"w{i:05d}", f"name {i}", "3.00") for i in range(n)]
    write(conn, rows)
    up = upserter()
    # The statements of one batch, each measured by EXPLAIN's WAL counter: this backend's
    # own WAL only, whatever else the server is doing.
    with conn, conn.cursor() as cur:
        wal = _wal_bytes(cur, up, "lock_old", rows) + _wal_bytes(cur, up, "merge", rows)
        print(f"WAL per unchanged row: {wal / n:.2f} bytes")
        assert wal / n <= 2, f"{wal / n:.1f} bytes of WAL per unchanged row"
        # And the same measure sees a change: one changed row writes WAL.
        changed = [row("w00000", "renamed", "3.00")]
        assert _wal_bytes(cur, up, "lock_old", changed) + _wal_bytes(cur, up, "merge", changed) > 0
    assert len(entries(conn)) == n


def test_inserts_recorded_by_the_merge_itself_read_as_the_writers_own(conn) -> None:
    """The writer has the merge write each insert's entry (no round trip of the row as JSON):
    the entries must be the very ones the upserter's own path records, values and order."""
    from datetime import datetime

    rows = [row(f"k{i:02d}", f'name {i}\t\\ "q" é', f"{i}.5{i % 10}") for i in range(12)]
    rows[3].values["seen"] = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    rows[4].values["name"] = None
    context = history.Context("shop", 9, "crawl")

    def by_sql(batch):
        up = TableUpserter("gadgets", COLUMNS, ("shop", "code"), 3600.0, spider="shop", track=True, sql_history=True)
        with conn, conn.cursor() as cur:
            result = up.write(cur, [Row(r.key, dict(r.values)) for r in batch], context=context)
            if result.changes:
                history.record(cur, "gadgets", result.changes, context)
        return result

    def by_python(batch):
        up = upserter()
        with conn, conn.cursor() as cur:
            result = up.write(cur, [Row(r.key, dict(r.values)) for r in batch])
            history.record(cur, "gadgets", result.changes, context)
        return result

    def wipe():
        with conn, conn.cursor() as cur:
            cur.execute("DELETE FROM gadgets; DELETE FROM item_changes")

    changed = [row(r.key[1], "renamed", "7.00") if i < 4 else r for i, r in enumerate(rows)]
    recorded = {}
    for name, write_batch in (("sql", by_sql), ("python", by_python)):
        wipe()
        first = write_batch(rows)
        assert first.inserted == {r.key for r in rows}
        # Inserts only come back in the result from the upserter's own path.
        assert [c.kind for c in first.changes] == ([] if name == "sql" else ["insert"] * 12)
        second = write_batch(changed)
        assert second.updated == {r.key for r in changed[:4]}
        recorded[name] = entries(conn)
    assert len(recorded["sql"]) == 16
    assert recorded["sql"] == recorded["python"]
    assert recorded["sql"][3][4]["seen"] == [None, "2026-01-02T03:04:05+00:00"]
    assert "name" not in recorded["sql"][4][4]
