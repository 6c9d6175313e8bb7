"""Held changes: what a run whose quality broke would have written, kept aside with the run.

When the live guard (:mod:`.guard`) holds, an item that lacks a broken field is not stored: its
values, as they would have been upserted, go to ``held_changes`` with the run. At the end of such
a run the rows it did not see are not marked gone either: their keys are held the same way. The
stored rows stay as they were, and an operator decides later:

* ``scrapy runs SPIDER --report RUN`` lists them;
* ``--apply RUN`` writes them as the run would have (upserts, gone-marks, and the blanks the
  guard wrote back at the run's end, each in the history with the run's id and the reason
  ``apply``), except where a later run has seen the row since (its data is newer than the held
  change, which is then dropped as superseded);
* ``--discard RUN`` drops them: the table and the history are as if the run never held them.

A table rather than rejects: a held item is not wrong, it is undecided, and applying it needs
the values as the upsert takes them (the text their content hash is computed from).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from psycopg2 import sql
from psycopg2.extras import execute_values

from ..items.base import StoredItem
from . import history
from .upsert import Row, TableUpserter, canonical_json

TABLE = "held_changes"
DDL = """
CREATE TABLE IF NOT EXISTS held_changes (
    spider      text NOT NULL,
    run_id      bigint NOT NULL,
    item_table  text NOT NULL,
    key         jsonb NOT NULL,
    kind        text NOT NULL,   -- item | gone | value
    item_type   text,
    url         text,
    reasons     text NOT NULL DEFAULT '',
    item        jsonb,           -- kind item: the values the run would have upserted
    held_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (spider, run_id, item_table, key, kind)
);
-- kind value: the fields that wait for the run's judgement, {field: [stored, new]}
ALTER TABLE held_changes ADD COLUMN IF NOT EXISTS changes jsonb;
"""


def ensure(cur: Any) -> None:
    cur.execute(DDL)


def awaiting_record(
    spider: str, run_id: int, item_type: type[StoredItem], row: Row, waiting: dict[str, list[Any]], reasons: str
) -> dict[str, Any]:
    """A row's changes that wait for the run's judgement (see :class:`scraper.storage.upsert.Watch`),
    as :func:`write` takes it: the whole row as it came, and the fields that wait."""
    url = row.values.get("url")
    return {
        "held": "value",
        "spider": spider,
        "run_id": run_id,
        "item_table": item_type.table,
        "item_type": item_type.__name__,
        "key": list(row.key),
        "url": url if isinstance(url, str) else None,
        "reasons": reasons,
        "item": row.canonical or canonical_json(row.values),
        "changes": json.dumps(waiting, default=str),
    }


def item_record(spider: str, run_id: int, item: StoredItem, reasons: list[str]) -> dict[str, Any]:
    """The held change of *item* as the writer takes it (see ``PostgresWriter.add_reject``)."""
    values = item._values
    columns = {c: values.get(c) for c in item.columns()}
    return {
        "held": "item",
        "spider": spider,
        "run_id": run_id,
        "item_table": item.table,
        "item_type": type(item).__name__,
        "key": [values.get(k) for k in item.key],
        "url": values.get("url") if isinstance(values.get("url"), str) else getattr(item, "_origin", None),
        "reasons": "; ".join(reasons),
        "item": canonical_json(columns),
    }


def write(cur: Any, records: list[dict[str, Any]]) -> None:
    """Insert held records inside the writer's transaction; a later hold of the same key wins."""
    unique = {
        (r["spider"], r["run_id"], r["item_table"], json.dumps(r["key"], default=str), r["held"]): r for r in records
    }
    execute_values(
        cur,
        "INSERT INTO held_changes (spider, run_id, item_table, key, kind, item_type, url, reasons, item, changes) "
        "VALUES %s ON CONFLICT (spider, run_id, item_table, key, kind) DO UPDATE SET item = EXCLUDED.item, "
        "reasons = EXCLUDED.reasons, url = EXCLUDED.url, changes = EXCLUDED.changes, held_at = now()",
        [
            (
                spider,
                run_id,
                table,
                key,
                kind,
                r["item_type"],
                r.get("url"),
                r["reasons"],
                r.get("item"),
                r.get("changes"),
            )
            for (spider, run_id, table, key, kind), r in sorted(unique.items(), key=lambda kv: kv[0])
        ],
    )


def hold_gone(cur: Any, spider: str, run_id: int, item_type: type[StoredItem], keys: list[tuple[Any, ...]]) -> int:
    """Hold the gone-marks of *keys* (rows the run did not see) instead of writing them."""
    if not keys:
        return 0
    # Rows whose items the run held were seen: not gone (apply checks again, for items held by
    # a node still writing when this ran).
    execute_values(
        cur,
        "INSERT INTO held_changes (spider, run_id, item_table, key, kind, item_type, reasons) "
        "SELECT v.spider, v.run_id, v.item_table, v.key::jsonb, 'gone', v.item_type, v.reasons "
        "FROM (VALUES %s) AS v(spider, run_id, item_table, key, item_type, reasons) WHERE NOT EXISTS ("
        "SELECT 1 FROM held_changes h WHERE h.spider = v.spider AND h.run_id = v.run_id "
        "AND h.item_table = v.item_table AND h.key = v.key::jsonb AND h.kind = 'item') "
        "ON CONFLICT DO NOTHING",
        [
            (
                spider,
                run_id,
                item_type.table,
                json.dumps(list(k), default=str),
                item_type.__name__,
                "not seen in a run whose quality broke",
            )
            for k in keys
        ],
        page_size=len(keys),  # one statement, so that rowcount is the whole count
    )
    return cur.rowcount


@dataclass
class Held:
    kind: str
    item_table: str
    key: list[Any]
    url: str | None
    reasons: str


def summary(conn: Any, spider: str, run_id: int) -> dict[str, int]:
    """Kind -> how many changes run *run_id* holds."""
    with conn, conn.cursor() as cur:
        ensure(cur)
        cur.execute(
            "SELECT kind, count(*) FROM held_changes WHERE spider = %s AND run_id = %s GROUP BY kind", (spider, run_id)
        )
        return dict(cur.fetchall())


def listed(conn: Any, spider: str, run_id: int, limit: int = 20) -> list[Held]:
    with conn, conn.cursor() as cur:
        ensure(cur)
        cur.execute(
            "SELECT kind, item_table, key, url, reasons FROM held_changes WHERE spider = %s AND run_id = %s "
            "ORDER BY kind DESC, item_table, key LIMIT %s",
            (spider, run_id, limit),
        )
        return [Held(*row) for row in cur.fetchall()]


@dataclass
class Applied:
    upserted: int = 0
    gone: int = 0
    superseded: int = 0


def apply(conn: Any, spider: str, run_id: int, item_types: Iterable[type[StoredItem]]) -> Applied:
    """Write what run *run_id* held, as it would have, in one transaction; then drop it."""
    done = Applied()
    context = history.Context(spider, run_id, "apply")
    with conn, conn.cursor() as cur:
        ensure(cur)
        for item_type in item_types:
            table = sql.Identifier(item_type.table)
            newer = sql.SQL("EXISTS (SELECT 1 FROM {} t WHERE {} AND t.last_seen > h.held_at)").format(
                table, history.key_match(item_type, "t", "h.key")
            )
            cur.execute(
                sql.SQL(
                    "SELECT h.kind, h.key, h.item, {} FROM held_changes h WHERE h.spider = %s AND h.run_id = %s "
                    "AND h.item_table = %s"
                ).format(newer),
                (spider, run_id, item_type.table),
            )
            found = cur.fetchall()
            # A held item's row was seen by the run, though it was not written: never gone.
            seen = {json.dumps(key, default=str) for kind, key, _, _ in found if kind != "gone"}
            rows: dict[tuple[Any, ...], Row] = {}
            gone = []
            for kind, key, item, superseded in found:
                if superseded:
                    done.superseded += 1
                elif kind in ("item", "value"):
                    row_key = tuple(item.get(k) for k in item_type.key)
                    rows[row_key] = Row(key=row_key, values=item)
                elif json.dumps(key, default=str) not in seen:
                    gone.append(key)
            if rows:
                columns = list(item_type.columns())
                upserter = TableUpserter(item_type.table, columns, item_type.key, 0.0, spider=spider, track=True)
                result = upserter.write(cur, list(rows.values()))
                if result.changes:
                    history.record(cur, item_type.table, result.changes, context)
                done.upserted += len(result.inserted) + len(result.updated)
            if gone:
                cur.execute(
                    sql.SQL(
                        """
                    WITH g AS (
                        UPDATE {table} t SET gone_at = now()
                        FROM jsonb_array_elements(%(keys)s::jsonb) AS k(key)
                        WHERE {match} AND t.spider = %(spider)s AND t.gone_at IS NULL
                        RETURNING k.key
                    )
                    INSERT INTO item_changes (item_table, key, kind, reason, spider, run_id)
                    SELECT %(name)s, g.key, 'gone', 'apply', %(spider)s, %(run)s FROM g
                    """
                    ).format(table=table, match=history.key_match(item_type, "t", "k.key")),
                    {"keys": json.dumps(gone, default=str), "spider": spider, "name": item_type.table, "run": run_id},
                )
                done.gone += cur.rowcount
            done.upserted += _reblank(cur, spider, run_id, item_type)
        cur.execute("DELETE FROM held_changes WHERE spider = %s AND run_id = %s", (spider, run_id))
    return done


def _reblank(cur: Any, spider: str, run_id: int, item_type: type[StoredItem]) -> int:
    """Undo the guard's restorations of run *run_id* (see :mod:`scraper.quality.restore`): applied,
    the run blanks those values as it would have. A value changed since is left alone."""
    total = 0
    for field in item_type.columns():
        if field in item_type.key:
            continue
        cur.execute(
            sql.SQL(
                """
            WITH g AS (
                SELECT DISTINCT ON (c.key) c.key, c.changes->%(f)s->1 AS restored
                FROM item_changes c
                WHERE c.item_table = %(table)s AND c.spider = %(spider)s AND c.run_id = %(run)s
                    AND c.reason = 'guard' AND c.changes ? %(f)s
                ORDER BY c.key, c.id DESC
            ), u AS (
                UPDATE {table} t SET {field} = NULL FROM g
                WHERE {match} AND t.spider = %(spider)s AND to_jsonb(t.{field}) = g.restored
                RETURNING g.key, g.restored
            )
            INSERT INTO item_changes (item_table, key, kind, reason, spider, run_id, changes)
            SELECT %(table)s, u.key, 'update', 'apply', %(spider)s, %(run)s,
                jsonb_build_object(%(f)s, jsonb_build_array(u.restored, NULL))
            FROM u
            """
            ).format(
                table=sql.Identifier(item_type.table),
                field=sql.Identifier(field),
                match=history.key_match(item_type, "t", "g.key"),
            ),
            {"f": field, "table": item_type.table, "spider": spider, "run": run_id},
        )
        total += cur.rowcount
    return total


@dataclass
class Settled:
    applied: int = 0  # rows whose waiting changes were written
    kept: dict[str, int] | None = None  # "Type.field" -> values left held (their check failed)


def settle(conn: Any, spider: str, run_id: int, item_types: Iterable[type[StoredItem]], failed: set[str]) -> Settled:
    """Judge the changes run *run_id* kept waiting (kind ``value``): those of fields whose checks
    passed are written as the crawl would have (history reason ``crawl``); those of fields in
    *failed* ("Type.field") stay held for ``--apply`` or ``--discard``. One transaction."""
    done = Settled(kept={})
    context = history.Context(spider, run_id, "crawl")
    with conn, conn.cursor() as cur:
        ensure(cur)
        for item_type in item_types:
            name = item_type.__name__
            cur.execute(
                "SELECT key, item, changes FROM held_changes WHERE spider = %s AND run_id = %s AND item_table = %s "
                "AND kind = 'value' FOR UPDATE",
                (spider, run_id, item_type.table),
            )
            rows: list[Row] = []
            still: list[tuple[str, str]] = []
            done_keys: list[str] = []
            for key, item, changes in cur.fetchall():
                changes = changes or {}
                bad = {f: pair for f, pair in changes.items() if f"{name}.{f}" in failed}
                for f in bad:
                    done.kept[f"{name}.{f}"] = done.kept.get(f"{name}.{f}", 0) + 1
                if len(bad) < len(changes):
                    values = {**item, **{f: pair[0] for f, pair in bad.items()}}
                    rows.append(Row(key=tuple(values.get(k) for k in item_type.key), values=values))
                key_text = json.dumps(key, default=str)
                if bad:
                    still.append((key_text, json.dumps(bad, default=str)))
                else:
                    done_keys.append(key_text)
            if rows:
                upserter = TableUpserter(
                    item_type.table, list(item_type.columns()), item_type.key, 0.0, spider=spider, track=True
                )
                result = upserter.write(cur, rows)
                if result.changes:
                    history.record(cur, item_type.table, result.changes, context)
                done.applied += len(result.updated)
            if done_keys:
                cur.execute(
                    "DELETE FROM held_changes WHERE spider = %s AND run_id = %s AND item_table = %s AND kind = 'value' "
                    "AND key = ANY(%s::jsonb[])",
                    (spider, run_id, item_type.table, done_keys),
                )
            for key_text, bad_text in still:
                cur.execute(
                    "UPDATE held_changes SET changes = %s::jsonb WHERE spider = %s AND run_id = %s "
                    "AND item_table = %s AND kind = 'value' AND key = %s::jsonb",
                    (bad_text, spider, run_id, item_type.table, key_text),
                )
    return done


def awaiting(conn: Any, spider: str, run_id: int) -> dict[str, dict[str, int]]:
    """ "Type.field" -> {"moved": n, "blanked": n}: the changes of run *run_id* that wait."""
    with conn, conn.cursor() as cur:
        ensure(cur)
        cur.execute(
            "SELECT h.item_type || '.' || c.key, count(*) FILTER (WHERE c.value->1 <> 'null'::jsonb), "
            "count(*) FILTER (WHERE c.value->1 = 'null'::jsonb) "
            "FROM held_changes h, jsonb_each(h.changes) c WHERE h.spider = %s AND h.run_id = %s AND h.kind = 'value' "
            "GROUP BY 1",
            (spider, run_id),
        )
        return {name: {"moved": moved, "blanked": blanked} for name, moved, blanked in cur.fetchall()}


def value_moves(
    conn: Any, spider: str, run_id: int, item_types: Iterable[type[StoredItem]], shifts: dict[str, float]
) -> dict[str, tuple[int, int]]:
    """ "Type.field" -> (held values paired with a stored one, how many of them moved by more than
    the field's shift): what applying run *run_id*'s held changes would write, as the run's pair
    checks judge it. *shifts*: field -> share (prices, numeric fields declaring ``shift``)."""
    out: dict[str, tuple[int, int]] = {}
    with conn, conn.cursor() as cur:
        ensure(cur)
        for item_type in item_types:
            columns = item_type.columns()
            for field, shift in shifts.items():
                if field not in columns:
                    continue
                cur.execute(
                    sql.SQL(
                        """
                    SELECT count(*), count(*) FILTER (
                        WHERE abs((h.item->>%(f)s)::numeric - t.{f}::numeric)
                            > %(shift)s * greatest(abs(t.{f}::numeric), 0.01))
                    FROM held_changes h JOIN {table} t ON {match}
                    WHERE h.spider = %(spider)s AND h.run_id = %(run)s AND h.item_table = %(name)s
                        AND h.kind IN ('item', 'value') AND t.{f} IS NOT NULL
                        AND h.item->>%(f)s ~ '^-?[0-9]+([.][0-9]+)?$'
                    """
                    ).format(
                        f=sql.Identifier(field),
                        table=sql.Identifier(item_type.table),
                        match=history.key_match(item_type, "t", "h.key"),
                    ),
                    {"f": field, "shift": shift, "spider": spider, "run": run_id, "name": item_type.table},
                )
                pairs, moved = cur.fetchone()
                if pairs:
                    out[f"{item_type.__name__}.{field}"] = (pairs, moved)
    return out


def discard(conn: Any, spider: str, run_id: int) -> int:
    """Drop what run *run_id* held; how many changes."""
    with conn, conn.cursor() as cur:
        ensure(cur)
        cur.execute("DELETE FROM held_changes WHERE spider = %s AND run_id = %s", (spider, run_id))
        return cur.rowcount
