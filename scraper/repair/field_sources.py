"""The ``field_sources`` table: per spider, run and item type, how many items took each field from
each source (a selector chain, or ``url``, ``constant``, ``missing``...: see
:mod:`scraper.repair.provenance`).

One row per (spider, run, item type, field, source); each node adds its counts to it in batches
(an upsert that sums), so the rows of a run crawled by several nodes are the run's totals.
``first_seen`` and ``last_seen`` are those of the batches that counted the source, within a
batch's interval (a few seconds).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg2.extras import execute_values

DDL = """
CREATE TABLE IF NOT EXISTS field_sources (
    spider      text NOT NULL,
    run_id      bigint NOT NULL,
    item_type   text NOT NULL,
    field       text NOT NULL,
    selector    text NOT NULL,
    items       bigint NOT NULL,
    first_seen  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL,
    PRIMARY KEY (spider, run_id, item_type, field, selector)
);
"""

#: (run id, item type, field, source) -> items; run id 0 when runs are not tracked.
Key = tuple[int, str, str, str]


def ensure(cur: Any) -> None:
    cur.execute(DDL)


def save(cur: Any, spider: str, counts: dict[Key, int], first: datetime, last: datetime) -> None:
    # Sorted: two nodes adding to the same rows lock them in the same order, never a deadlock.
    rows = [(spider, *key, n, first, last) for key, n in sorted(counts.items()) if n]
    if not rows:
        return
    execute_values(
        cur,
        "INSERT INTO field_sources (spider, run_id, item_type, field, selector, items, first_seen, last_seen)"
        " VALUES %s ON CONFLICT (spider, run_id, item_type, field, selector) DO UPDATE SET"
        " items = field_sources.items + EXCLUDED.items,"
        " first_seen = LEAST(field_sources.first_seen, EXCLUDED.first_seen),"
        " last_seen = GREATEST(field_sources.last_seen, EXCLUDED.last_seen)",
        rows,
    )


@dataclass(frozen=True)
class Source:
    item_type: str
    field: str
    selector: str
    items: int
    first_seen: datetime
    last_seen: datetime


def latest_run(cur: Any, spider: str) -> int | None:
    cur.execute("SELECT max(run_id) FROM field_sources WHERE spider = %s", (spider,))
    row = cur.fetchone()
    return None if row is None or row[0] is None else int(row[0])


def load(cur: Any, spider: str, run_id: int) -> list[Source]:
    """The run's sources, by item type and field, the most used first."""
    cur.execute(
        "SELECT item_type, field, selector, items, first_seen, last_seen FROM field_sources"
        " WHERE spider = %s AND run_id = %s ORDER BY item_type, field, items DESC, selector",
        (spider, run_id),
    )
    return [Source(*row) for row in cur.fetchall()]


def shares(sources: Iterable[Source]) -> dict[tuple[str, str], list[tuple[Source, float]]]:
    """(item type, field) -> each source with its share of the items that set the field."""
    grouped: dict[tuple[str, str], list[Source]] = {}
    for source in sources:
        grouped.setdefault((source.item_type, source.field), []).append(source)
    out: dict[tuple[str, str], list[tuple[Source, float]]] = {}
    for key, found in grouped.items():
        total = sum(s.items for s in found) or 1
        out[key] = [(s, s.items / total) for s in found]
    return out
