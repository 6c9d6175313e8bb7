"""The ``pages`` table: one row per spider and page identity (the request fingerprint of the
page's canonical URL, :mod:`scraper.identity`), holding its validators, the keys of the items it
yielded, and its change history.

Read once when a crawl opens (a server-side cursor: ~200 bytes of memory per page) and written
back in batches from a worker thread. Each row is the whole state a node computed from the state
it read plus its own visit: within a run the seen-set gives each page to one node, so two nodes
never write the same page at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

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
CREATE INDEX IF NOT EXISTS pages_due_idx ON pages (spider, next_due);
"""
_COLUMNS = (
    "url kind callback etag last_modified content_hash items fetched_at changed_at interval_seconds next_due "
    "lastmod visits changes not_modified hint_misses"
).split()


def ensure(cur: Any) -> None:
    cur.execute(DDL)


def _ts(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def load(conn: Any, spider: str) -> Iterator[tuple[bytes, PageState]]:
    """Every page state of *spider*, streamed."""
    with conn.cursor(name="revisit_pages") as cur:
        cur.itersize = 10_000
        cur.execute(f"SELECT page, {', '.join(_COLUMNS)} FROM pages WHERE spider = %s", (spider,))
        for row in cur:
            (page, url, kind, callback, etag, last_modified, content_hash, items, fetched_at, changed_at,
             interval, next_due, lastmod, visits, changes, not_modified, hint_misses) = row  # fmt: skip
            yield (
                bytes(page),
                PageState(
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
                ),
            )


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
