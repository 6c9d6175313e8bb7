"""History retention: the time to drop a month of ``item_changes`` at several sizes, and what
partitioning costs the writer.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test .venv/bin/python bench/history_retention.py [--sizes 10000,2000000]

Works in a database of its own (``bench_retention``, made and dropped). For each size: a month
three months back filled with that many history rows (``generate_series``, the table's three
indexes in place), then ``retention.prune`` with a 30-day retention timed (the month's drop, its
row count for the record, the feed check). The writer: ``history.record`` of 100 batches of
1,000 changes into a partitioned table and into one made as before partitioning, in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scratch import drop_database, scratch_database  # noqa: E402

from scraper.storage import history, retention  # noqa: E402

NAME = "bench_retention"


def drop_month(dsn: str, rows: int) -> dict[str, float]:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    now = datetime.now(UTC)
    month = retention.month_start(
        retention.month_start(retention.month_start(now) - timedelta(days=1)) - timedelta(days=40)
    )
    with conn.cursor() as cur:
        cur.execute(
            "DROP TABLE IF EXISTS item_changes, item_changes_pruned CASCADE; DROP SEQUENCE IF EXISTS item_changes_id_seq"
        )
        history.ensure(cur)
        retention.ensure_ahead(cur, month, months=0)
        started = time.perf_counter()
        cur.execute(
            "INSERT INTO item_changes (item_table, key, kind, reason, spider, run_id, at, changes)"
            " SELECT 'products', jsonb_build_array('demo', 'SKU-' || i), 'update', 'crawl', 'demo', 1,"
            " %s::timestamptz + (i %% 2000000) * interval '1 second', '{\"price\": [1.5, 2.5]}'"
            " FROM generate_series(1, %s) i",
            (month, rows),
        )
        fill = time.perf_counter() - started
        cur.execute("SELECT pg_total_relation_size(%s)", (retention.partition_name(month),))
        size = cur.fetchone()[0]
    started = time.perf_counter()
    report = retention.prune(conn, 30, now=now)
    took = time.perf_counter() - started
    conn.close()
    assert report.dropped and report.dropped[0][1] == rows, report
    return {"rows": rows, "bytes": size, "fill_s": fill, "prune_s": took, "drop_s": report.drop_seconds}


def writer_cost(dsn: str, batches: int = 100, size: int = 1000) -> dict[str, float]:
    conn = psycopg2.connect(dsn)
    times: dict[str, list[float]] = {"partitioned": [], "plain": []}
    with conn, conn.cursor() as cur:
        cur.execute(
            "DROP TABLE IF EXISTS item_changes, item_changes_pruned CASCADE; DROP SEQUENCE IF EXISTS item_changes_id_seq"
        )
        history.ensure(cur)
        cur.execute(
            "CREATE TABLE plain_changes (LIKE item_changes INCLUDING DEFAULTS); ALTER TABLE plain_changes ADD PRIMARY KEY (id);"
            " CREATE INDEX ON plain_changes (item_table, key, at); CREATE INDEX ON plain_changes (at);"
            " CREATE INDEX ON plain_changes (xid)"
        )
    changes = [history.Change(["demo", f"SKU-{i}"], "update", {"price": [1.5, 2.5]}) for i in range(size)]
    for n in range(batches * 2):
        kind = "partitioned" if n % 2 == 0 else "plain"
        with conn, conn.cursor() as cur:
            if kind == "plain":
                cur.execute(
                    "ALTER TABLE item_changes RENAME TO item_changes_p; ALTER TABLE plain_changes RENAME TO item_changes"
                )
            started = time.perf_counter()
            history.record(cur, "products", changes, history.Context("demo", 1))
            times[kind].append(time.perf_counter() - started)
            if kind == "plain":
                cur.execute(
                    "ALTER TABLE item_changes RENAME TO plain_changes; ALTER TABLE item_changes_p RENAME TO item_changes"
                )
    conn.close()
    return {f"{k}_ms_per_1000": statistics.median(v) * 1000 for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,2000000")
    args = parser.parse_args()
    base = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/test"
    dsn = scratch_database(base, NAME)
    results: dict[str, object] = {"at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "load": os.getloadavg()[0]}
    try:
        results["drop"] = [drop_month(dsn, int(n)) for n in args.sizes.split(",")]
        results["writer"] = writer_cost(dsn)
    finally:
        drop_database(base, NAME)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
