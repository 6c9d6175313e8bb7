"""Change history at the storage level: inserts and changes recorded with old and new values,
nothing for unchanged rows, and unchanged rows still (nearly) free in WAL."""

from __future__ import annotations

import io
import json
from decimal import Decimal

import psycopg2
import pytest

from scraper.storage import history, schema
from scraper.storage.upsert import Row, TableUpserter
from test_storage import COLUMNS, Gadget, row


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


def _wal_bytes(cur, statement) -> int:
    cur.execute(psycopg2.sql.SQL("EXPLAIN (ANALYZE, WAL, FORMAT JSON) ") + statement)
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
        cur.execute(up.create_stage)
        cur.copy_expert(up.copy, io.StringIO(up._copy_data(rows)))
        wal = _wal_bytes(cur, up.lock_old) + _wal_bytes(cur, up.merge)
        print(f"WAL per unchanged row: {wal / n:.2f} bytes")
        assert wal / n <= 2, f"{wal / n:.1f} bytes of WAL per unchanged row"
        # And the same measure sees a change: one changed row writes WAL.
        cur.execute(up.clear_stage)
        cur.copy_expert(up.copy, io.StringIO(up._copy_data([row("w00000", "renamed", "3.00")])))
        assert _wal_bytes(cur, up.lock_old) + _wal_bytes(cur, up.merge) > 0
    assert len(entries(conn)) == n
