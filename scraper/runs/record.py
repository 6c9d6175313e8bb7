"""The ``crawl_runs`` table: one row per run of a spider, with its figures.

Written by the nodes of the run as it goes (at start, at each node's close) and by whoever
notices that it finished. A row is upserted whole each time from the run's figures in Redis
(the sum over its nodes' last reports), so rows converge on the same numbers whoever writes.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg2

#: Column -> the Scrapy stat each node reports for it (summed over the run's nodes).
FIGURES = {
    "pages": "response_received_count",
    "items_new": "postgres/inserted",
    "items_updated": "postgres/updated",
    "items_unchanged": "postgres/unchanged",
    "items_rejected": "item_rejected_count",
    "duplicates": "item_duplicates_dropped",
    "dead_letters": "dead_letters/count",
    "api_credits": "scraping_api/credits",
    "redeliveries": "scheduler/redelivered",
    # Pages a site throttled (429/503) at least once, each tried again at the fleet's lowered rate.
    "throttled": "politeness/throttled_pages",
    # Pages fetched but not archived because the archive's storage failed.
    "not_archived": "archive/not_archived",
}

DDL = """
CREATE TABLE IF NOT EXISTS crawl_runs (
    spider          text NOT NULL,
    run_id          integer NOT NULL,
    state           text NOT NULL,
    started         timestamptz NOT NULL,
    finished        timestamptz,
    finish_reason   text,
    nodes_seen      integer NOT NULL DEFAULT 0,
    pages           bigint NOT NULL DEFAULT 0,
    items_new       bigint NOT NULL DEFAULT 0,
    items_updated   bigint NOT NULL DEFAULT 0,
    items_unchanged bigint NOT NULL DEFAULT 0,
    items_rejected  bigint NOT NULL DEFAULT 0,
    duplicates      bigint NOT NULL DEFAULT 0,
    dead_letters    bigint NOT NULL DEFAULT 0,
    api_credits     double precision NOT NULL DEFAULT 0,
    redeliveries    bigint NOT NULL DEFAULT 0,
    throttled       bigint NOT NULL DEFAULT 0,
    not_archived    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (spider, run_id)
)
"""
# Columns added since the table was first made, for a table an earlier version made.
ADDED = {"throttled": "bigint NOT NULL DEFAULT 0", "not_archived": "bigint NOT NULL DEFAULT 0"}
_LOCK = 0x5C12A9E6  # serialises concurrent first creations of the table

COLUMNS = ["spider", "run_id", "state", "started", "finished", "finish_reason", "nodes_seen", *FIGURES]


def ensure_table(conn: Any) -> None:
    with conn, conn.cursor() as cur:
        cur.execute("SELECT to_regclass('crawl_runs') IS NOT NULL")
        if not cur.fetchone()[0]:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
            cur.execute(DDL)
        cur.execute(
            "SELECT count(*) FROM information_schema.columns WHERE table_name = 'crawl_runs' "
            "AND table_schema = current_schema() AND column_name = ANY(%s)",
            (list(ADDED),),
        )
        if cur.fetchone()[0] < len(ADDED):
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
            for column, kind in ADDED.items():
                cur.execute(f"ALTER TABLE crawl_runs ADD COLUMN IF NOT EXISTS {column} {kind}")


def connect(dsn: str) -> Any:
    conn = psycopg2.connect(dsn, connect_timeout=10, application_name="scraper:runs")
    ensure_table(conn)
    return conn


def highest_run_id(dsn: str, spider: str) -> int:
    """The highest run id recorded for *spider* (0 if none): a Redis that lost its state must
    not hand out an id that already names a run."""
    conn = connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT coalesce(max(run_id), 0) FROM crawl_runs WHERE spider = %s", (spider,))
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def last_run(dsn: str, spider: str) -> tuple[int, str]:
    """The id and recorded state of *spider*'s latest run ((0, "") if none)."""
    conn = connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(
                "SELECT run_id, state FROM crawl_runs WHERE spider = %s ORDER BY run_id DESC LIMIT 1", (spider,)
            )
            row = cur.fetchone()
            return (int(row[0]), str(row[1])) if row else (0, "")
    finally:
        conn.close()


def _ts(value: Any) -> dt.datetime | None:
    if value in (None, "", 0, "0"):
        return None
    return dt.datetime.fromtimestamp(float(value), tz=dt.UTC)


def upsert(conn: Any, spider: str, run_id: int, run: dict[str, str], figures: dict[str, float], nodes: int) -> None:
    """Write the row of run *run_id* from its Redis record *run* (the current run's hash, or
    {} when it is no longer current) and its summed *figures*."""
    state = run.get("state") or "running"
    values = {
        "spider": spider,
        "run_id": run_id,
        "state": state,
        "started": _ts(run.get("started")) or dt.datetime.now(dt.UTC),
        "finished": _ts(run.get("finished")) if state == "finished" else None,
        "finish_reason": run.get("reason") if state in ("finished", "stopped", "lost") else None,
        "nodes_seen": nodes,
        **{column: figures.get(stat, 0) for column, stat in FIGURES.items()},
    }
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in COLUMNS[2:] if c not in ("started", "finished", "finish_reason"))
    # Nodes write the row as they go, each from what it saw: a node that left while the run went
    # on, or one that reads after the next run began, may commit after the last node out. A
    # finished row takes only a finished view, and keeps its time and reason.
    with conn, conn.cursor() as cur:
        cur.execute(
            f"INSERT INTO crawl_runs ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))}) "
            f"ON CONFLICT (spider, run_id) DO UPDATE SET {updates}, "
            "finished = COALESCE(EXCLUDED.finished, crawl_runs.finished), "
            "finish_reason = CASE WHEN crawl_runs.state = 'finished' AND crawl_runs.finish_reason IS NOT NULL "
            "THEN crawl_runs.finish_reason ELSE EXCLUDED.finish_reason END "
            "WHERE crawl_runs.state <> 'finished' OR EXCLUDED.state = 'finished'",
            [values[c] for c in COLUMNS],
        )


def runs(conn: Any, spider: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
    with conn, conn.cursor() as cur:
        where = "WHERE spider = %s" if spider else ""
        cur.execute(
            f"SELECT {', '.join(COLUMNS)} FROM crawl_runs {where} ORDER BY spider, run_id DESC",
            (spider,) if spider else None,
        )
        rows = [dict(zip(COLUMNS, row)) for row in cur.fetchall()]
    per_spider: dict[str, int] = {}
    kept = []
    for row in rows:
        per_spider[row["spider"]] = per_spider.get(row["spider"], 0) + 1
        if per_spider[row["spider"]] <= limit:
            kept.append(row)
    return kept
