"""The ``pages`` table: one row per spider and page identity (the request fingerprint of the
page's canonical URL, :mod:`scraper.identity`), holding its validators, the keys of the items it
yielded, and its change history.

Never read whole: a crawl node reads the rows it needs by key (:func:`fetch`, a batch at a time)
and a revisit run streams its due pages from the ``(spider, next_due, page)`` index a page of
rows at a time (:func:`due`), so what a node holds does not grow with the pages a spider knows.
Written back in batches from a worker thread. Each row is the whole state a node computed from
the state it read plus its own visit: within a run the seen-set gives each page to one node, so
two nodes never write the same page at once.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from datetime import UTC, datetime
from typing import Any

import psycopg2
from psycopg2 import sql
from psycopg2.extras import execute_values

from ..items.base import StoredItem
from ..storage.history import key_match
from .schedule import PageState

DDL = """
CREATE TABLE IF NOT EXISTS pages (
    spider            text NOT NULL,
    page              bytea NOT NULL,
    url               text NOT NULL,
    kind              text NOT NULL,
    callback          text,
    etag              text,
    last_modified     text,
    content_hash      text,
    items             jsonb NOT NULL DEFAULT '[]',
    fetched_at        timestamptz NOT NULL,
    changed_at        timestamptz,
    interval_seconds  double precision NOT NULL,
    next_due          timestamptz NOT NULL,
    lastmod           timestamptz,
    visits            integer NOT NULL DEFAULT 0,
    changes           integer NOT NULL DEFAULT 0,
    not_modified      integer NOT NULL DEFAULT 0,
    hint_misses       integer NOT NULL DEFAULT 0,
    PRIMARY KEY (spider, page)
);
-- The due set, read in keyset pages: the fingerprint breaks the ties of pages due at one
-- moment (every page of a run with one interval is due at the same second).
CREATE INDEX IF NOT EXISTS pages_due_page_idx ON pages (spider, next_due, page);
"""
# The index the due set was read by before it was read in keyset pages: dropped by `scrapy migrate`
# only, not at each node's start (a node of the earlier version would build it again on start: a
# fleet upgraded node by node would drop and build it over and over).
_RETIRED = "DROP INDEX IF EXISTS pages_due_idx"
_COLUMNS = (
    "url kind callback etag last_modified content_hash items fetched_at changed_at interval_seconds next_due "
    "lastmod visits changes not_modified hint_misses"
).split()


def ensure(cur: Any) -> None:
    """The table and its indexes, at a node's start: DDL only for what is missing. (``CREATE INDEX
    IF NOT EXISTS`` locks the table against writes before it finds the index there: a node
    starting would wait for the other nodes' writes, and hold them up meanwhile.)"""
    cur.execute("SELECT to_regclass('pages') IS NOT NULL AND to_regclass('pages_due_page_idx') IS NOT NULL")
    if not cur.fetchone()[0]:
        cur.execute(DDL)


def migrate(cur: Any) -> None:
    """What ``scrapy migrate`` does: the table and its indexes, and the retired index dropped."""
    cur.execute(DDL)
    cur.execute(_RETIRED)


def _ts(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _state(row: tuple[Any, ...]) -> PageState:
    (url, kind, callback, etag, last_modified, content_hash, items, fetched_at, changed_at,
     interval, next_due, lastmod, visits, changes, not_modified, hint_misses) = row  # fmt: skip
    return PageState(
        url=url,
        kind=kind,
        fetched_at=fetched_at.timestamp(),
        interval=interval,
        next_due=next_due.timestamp(),
        callback=callback,
        etag=etag,
        last_modified=last_modified,
        content_hash=content_hash,
        items=items or [],
        changed_at=_epoch(changed_at),
        lastmod=_epoch(lastmod),
        visits=visits,
        changes=changes,
        not_modified=not_modified,
        hint_misses=hint_misses,
    )


def fetch(cur: Any, spider: str, keys: Collection[bytes]) -> dict[bytes, PageState]:
    """The states of those of *keys* the *spider* knows (one index scan of the primary key)."""
    if not keys:
        return {}
    cur.execute(
        f"SELECT page, {', '.join(_COLUMNS)} FROM pages WHERE spider = %s AND page = ANY(%s)",
        (spider, [psycopg2.Binary(k) for k in keys]),
    )
    return {bytes(row[0]): _state(row[1:]) for row in cur.fetchall()}


def due(
    cur: Any,
    spider: str,
    now: float,
    after: tuple[datetime, bytes] | None,
    limit: int,
    trusted_after: float,
    hint_misses: int,
) -> list[tuple[bytes, PageState, tuple[datetime, bytes]]]:
    """The next *limit* pages of *spider* due at *now* by their history, in ``(next_due, page)``
    order after *after* (a keyset page: each query is short, no cursor stays open across a run).

    Rows a revisit run would not queue by itself are left in the database: listing pages, and
    pages whose sitemap is trusted and was read after *trusted_after* (now less the maximum
    interval; see :func:`.schedule.due_without_sitemap`, which the caller still applies).
    """
    where = "spider = %s AND next_due <= %s"
    params: list[Any] = [spider, _ts(now)]
    if after is not None:
        where += " AND (next_due, page) > (%s, %s)"
        params += [after[0], psycopg2.Binary(after[1])]
    cur.execute(
        f"SELECT page, {', '.join(_COLUMNS)} FROM pages WHERE {where} "
        "AND kind = 'items' AND (content_hash IS NULL OR lastmod IS NULL OR hint_misses >= %s OR fetched_at <= %s) "
        "ORDER BY next_due, page LIMIT %s",
        (*params, hint_misses, _ts(trusted_after), limit),
    )
    return [(bytes(row[0]), _state(row[1:]), (row[11], bytes(row[0]))) for row in cur.fetchall()]


def save(cur: Any, spider: str, states: Iterable[tuple[bytes, PageState]]) -> int:
    rows = [
        (
            spider,
            key,
            s.url,
            s.kind,
            s.callback,
            s.etag,
            s.last_modified,
            s.content_hash,
            json.dumps(s.items or [], default=str),
            _ts(s.fetched_at),
            _ts(s.changed_at),
            s.interval,
            _ts(s.next_due),
            _ts(s.lastmod),
            s.visits,
            s.changes,
            s.not_modified,
            s.hint_misses,
        )
        for key, s in states
    ]
    if not rows:
        return 0
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _COLUMNS)
    execute_values(
        cur,
        f"INSERT INTO pages (spider, page, {', '.join(_COLUMNS)}) VALUES %s "
        f"ON CONFLICT (spider, page) DO UPDATE SET {updates}",
        rows,
        page_size=1000,
    )
    return len(rows)


def touch(cur: Any, spider: str, item_type: type[StoredItem], keys: list[list[Any]]) -> set[str]:
    """Refresh ``last_seen`` of the *spider*'s live rows under *keys* (the items of pages that
    answered "not modified" are still on the site); returns the keys found (as JSON text): a key
    not found is a row no longer there (deleted by hand, never stored)."""
    if not keys:
        return set()
    cur.execute("CREATE TEMP TABLE IF NOT EXISTS _touched_keys (key jsonb) ON COMMIT DROP")
    execute_values(cur, "INSERT INTO _touched_keys (key) VALUES %s", [(json.dumps(k, default=str),) for k in keys])
    cur.execute(
        sql.SQL(
            "UPDATE {table} t SET last_seen = now() FROM _touched_keys g "
            "WHERE {match} AND t.spider = %s RETURNING g.key::text"
        ).format(table=sql.Identifier(item_type.table), match=key_match(item_type, "t", "g.key")),
        (spider,),
    )
    found = {json.dumps(json.loads(row[0]), default=str) for row in cur.fetchall()}
    cur.execute("DELETE FROM _touched_keys")
    return found
