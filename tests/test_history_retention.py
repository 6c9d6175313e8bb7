"""History kept for HISTORY_RETENTION_DAYS: monthly partitions of item_changes, a month dropped
in O(1) once every change-feed sink has published it, reverts and the history command refusing
or saying what is gone, and an old unpartitioned table converted in place."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import psycopg2
import pytest
from support.crawls import crawl_env, run_scrapy

from scraper.feed import position, verify
from scraper.runs import record as run_record
from scraper.storage import history, retention, revert
from scraper.storage.retention import month_start, next_month

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
OLD_DDL = """
CREATE TABLE item_changes (
    id bigserial PRIMARY KEY, item_table text NOT NULL, key jsonb NOT NULL, kind text NOT NULL,
    reason text NOT NULL, spider text, run_id bigint, at timestamptz NOT NULL DEFAULT now(),
    changes jsonb NOT NULL DEFAULT '{}'::jsonb, xid xid8 DEFAULT pg_current_xact_id()
);
CREATE INDEX item_changes_key_idx ON item_changes (item_table, key, at);
CREATE INDEX item_changes_at_idx ON item_changes (at);
CREATE INDEX item_changes_xid_idx ON item_changes (xid);
"""


@pytest.fixture
def conn(clean):
    conn = psycopg2.connect(clean.database_url)
    conn.autocommit = True
    yield conn
    conn.close()


def _months_back(n: int) -> datetime:
    start = month_start(NOW)
    for _ in range(n):
        start = month_start(start - timedelta(days=1))
    return start


def _fill(cur, start: datetime, rows: int, run_id: int = 1) -> None:
    """*rows* history rows spread over the month from *start*."""
    seconds = (next_month(start) - start).total_seconds() - 1
    cur.execute(
        "INSERT INTO item_changes (item_table, key, kind, reason, spider, run_id, at, changes)"
        " SELECT 'products', jsonb_build_array('demo', 'SKU-' || i), 'update', 'crawl', 'demo', %s,"
        " %s::timestamptz + (i * %s / %s) * interval '1 second', '{\"price\": [1, 2]}'"
        " FROM generate_series(1, %s) i",
        (run_id, start, seconds, rows, rows),
    )


def _parts(cur) -> dict[str, int]:
    out = {}
    for part in retention.partitions(cur):
        cur.execute(f"SELECT count(*) FROM {part.name}")
        out[part.name] = cur.fetchone()[0]
    return out


def test_history_is_partitioned_by_month_and_a_month_goes_in_constant_time(conn) -> None:
    with conn.cursor() as cur:
        history.ensure(cur)
        assert retention.is_partitioned(cur)
        names = {p.name for p in retention.partitions(cur)}
        this_month = month_start(datetime.now(UTC))
        assert retention.partition_name(this_month) in names and retention.DEFAULT in names
        for back in (1, 2, 3):  # the months to drop, made as a node running then made them
            retention.ensure_ahead(cur, _months_back(back), months=0)
        _fill(cur, _months_back(3), 300_000)
        _fill(cur, _months_back(2), 2_000)
        _fill(cur, _months_back(1), 1_000)
        history.record(
            cur,
            "products",
            [history.Change(["demo", "new"], "insert", {"price": [None, 1]})],
            history.Context("demo", 9),
        )
        before = _parts(cur)
        assert before[retention.partition_name(_months_back(3))] == 300_000
        assert before[retention.partition_name(this_month)] == 1 and before[retention.DEFAULT] == 0

    # Keep 30 days on 12-05 (since 11-05): October and before go whole; November stays.
    started = time.perf_counter()
    report = retention.prune(conn, 30, now=NOW)
    took = time.perf_counter() - started
    gone = {retention.partition_name(_months_back(3)), retention.partition_name(_months_back(2))}
    assert {name for name, _ in report.dropped} == gone, report
    assert dict(report.dropped)[retention.partition_name(_months_back(3))] == 300_000
    assert took < 1.0, f"dropping two months took {took:.2f} s"
    with conn.cursor() as cur:
        after = _parts(cur)
        assert not gone & set(after) and after[retention.partition_name(_months_back(1))] == 1_000
        assert retention.kept_since(cur) == _months_back(1)
        assert retention.dropped_rows(cur) == 302_000
    assert retention.prune(conn, 30, now=NOW).dropped == []  # nothing twice


def test_a_month_a_sink_has_not_published_is_kept_until_it_has(conn) -> None:
    with conn.cursor() as cur:
        history.ensure(cur)
        position.ensure(cur)
        retention.ensure_ahead(cur, _months_back(2), months=0)
        _fill(cur, _months_back(2), 50)
    reader = position.Reader(conn, "nats")
    events = reader.read(20)
    reader.advance(events)  # 30 of the month's events not published yet
    report = retention.prune(conn, 30, now=NOW)
    assert report.dropped == [] and report.kept_for_feed == [(retention.partition_name(_months_back(2)), "nats")]
    assert "sink nats has not published all of it yet" in report.lines()[0]
    while events := reader.read(20):
        reader.advance(events)
    assert retention.prune(conn, 30, now=NOW).dropped == [(retention.partition_name(_months_back(2)), 50)]
    # The feed's own check counts the dropped events as delivered: nothing was lost.
    checks = verify.check(conn, ["nats"])
    assert checks[0].problems == [], checks[0].problems


def test_reverting_a_run_older_than_the_history_kept_is_refused_by_name(conn) -> None:
    run_record.ensure_table(conn)
    with conn.cursor() as cur:
        history.ensure(cur)
        retention.ensure_ahead(cur, _months_back(3), months=0)
        _fill(cur, _months_back(3), 10, run_id=4)
        cur.execute(
            "INSERT INTO crawl_runs (spider, run_id, state, started) VALUES ('demo', 4, 'finished', %s)",
            (_months_back(3) + timedelta(days=2),),
        )
    retention.prune(conn, 30, now=NOW)
    with pytest.raises(
        retention.RetentionError, match=r"run 4 of demo is older than the history kept .*HISTORY_RETENTION_DAYS"
    ):
        revert.revert_run(conn, "demo", 4, [])


def test_migrate_converts_an_old_history_table_in_place_and_retention_needs_it(clean) -> None:
    conn = psycopg2.connect(clean.database_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(OLD_DDL)
        _fill(cur, _months_back(4), 500)
        cur.execute("SELECT max(id) FROM item_changes")
        last_old_id = cur.fetchone()[0]
    env = crawl_env(clean, HISTORY_RETENTION_DAYS="60")
    refused = run_scrapy(env, "migrate")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "HISTORY_RETENTION_DAYS" in refused.stderr and "scrapy migrate --partition-history" in refused.stderr

    done = run_scrapy(env, "migrate", "--partition-history")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "converted item_changes to monthly partitions" in done.stdout
    # Its newest row is four months old: past 60 days, so the converted table went at once.
    assert "history: dropped item_changes_before (500 changes)" in done.stdout
    with conn.cursor() as cur:
        assert retention.is_partitioned(cur)
        history.record(
            cur, "products", [history.Change(["demo", "x"], "insert", {"price": [None, 1]})], history.Context("demo", 2)
        )
        cur.execute("SELECT id FROM item_changes")
        assert [r[0] for r in cur.fetchall()] == [last_old_id + 1]  # ids go on from the old table's
    again = run_scrapy(env, "migrate", "--partition-history")
    assert again.returncode == 0 and "converted" not in again.stdout
    conn.close()


def test_a_converted_table_keeps_its_rows_readable_and_ids_unique(clean) -> None:
    conn = psycopg2.connect(clean.database_url)
    with conn, conn.cursor() as cur:
        cur.execute(OLD_DDL)
        _fill(cur, _months_back(1), 40)
    with conn, conn.cursor() as cur:
        assert retention.convert(cur, NOW)
    conn.autocommit = True
    with conn.cursor() as cur:
        history.ensure(cur)
        history.record(
            cur, "products", [history.Change(["demo", "y"], "update", {"price": [1, 3]})], history.Context("demo", 3)
        )
        cur.execute("SELECT count(*), count(DISTINCT id), max(id) FROM item_changes")
        assert cur.fetchone() == (41, 41, 41)
        cur.execute("SELECT tableoid::regclass::text, count(*) FROM item_changes GROUP BY 1 ORDER BY 1")
        assert dict(cur.fetchall())[retention.LEGACY] == 40
    conn.close()
