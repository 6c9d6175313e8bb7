"""The SQL of one batch: stage with COPY, then one ordered, idempotent ``INSERT … ON CONFLICT``.

Measured on Postgres (see the README's benchmark): COPY into a temporary staging table and one
``INSERT … SELECT … ON CONFLICT DO UPDATE`` is about twice as fast as ``execute_values``. Rows
whose content hash is unchanged are filtered out *before* the insert (an anti-join), because
letting ``ON CONFLICT … WHERE`` discard them still locks and WAL-logs every row. Rows are
sorted by the natural key so that two workers writing overlapping batches take their row locks
in the same order and cannot deadlock.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import psycopg2.errors
from psycopg2 import sql

from .history import Change, Context, diff

logger = logging.getLogger(__name__)


@dataclass
class Row:
    key: tuple[Any, ...]
    values: dict[str, Any]
    content_hash: str = ""

    def __post_init__(self) -> None:
        if not self.content_hash:
            self.content_hash = content_hash(self.values)


@dataclass
class BatchResult:
    inserted: set[tuple[Any, ...]] = field(default_factory=set)
    updated: set[tuple[Any, ...]] = field(default_factory=set)
    # key -> database error, for rows the database refused (isolated row by row)
    failed: dict[tuple[Any, ...], str] = field(default_factory=dict)
    # Inserts and changes, for the history (only when the upserter tracks them)
    changes: list[Change] = field(default_factory=list)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


def content_hash(values: dict[str, Any]) -> str:
    canonical = json.dumps({k: _jsonable(v) for k, v in sorted(values.items())}, default=str, ensure_ascii=False)
    return hashlib.sha1(canonical.encode("utf-8")).hexdigest()


# COPY's text format: \N is NULL; backslash, tab, newline and CR are escaped; NUL cannot be
# stored in Postgres text at all and is dropped.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\x00": ""})


# Numbers the prepared statements of this process (see TableUpserter._prepare).
_PREPARED = itertools.count(1)


def copy_line(values: list[Any]) -> str:
    return "\t".join(
        ["\\N" if v is None else (v if type(v) is str else str(v)).translate(_COPY_ESCAPES) for v in values]
    )


class TableUpserter:
    """Builds (once) and runs the statements for one table.

    *spider* (when given) is written with each inserted or changed row: a finished run of that
    spider may mark the row gone. *track*: report each insert and change with its old and new
    values (``BatchResult.changes``) for the history.
    """

    def __init__(
        self,
        table: str,
        columns: list[str],
        key: tuple[str, ...],
        last_seen_resolution: float,
        spider: str | None = None,
        track: bool = False,
        sql_history: bool = False,
    ) -> None:
        self.table = table
        self.columns = columns
        self.key = key
        self.spider = spider
        self.track = track
        # Inserts' history entries written by the merge itself (see write()); only for keys
        # whose JSON is the same built by Postgres or by Python (text and integers).
        self.sql_history = track and sql_history
        self.stage = f"_stage_{table}"
        # Set by _prepare: the statements as text, their prepared names, and the connection.
        self._sql: dict[str, str] = {}
        self._names: dict[str, str] = {}
        self._prepared_on: Any = None
        # Off for good once prepared statements are found gone (a pooler in transaction mode).
        self._use_prepared = True
        all_cols = [*columns, "content_hash", *(["spider"] if spider is not None else [])]
        ident = sql.Identifier
        cols_sql = sql.SQL(", ").join(map(ident, all_cols))
        key_sql = sql.SQL(", ").join(map(ident, key))
        key_match = sql.SQL(" AND ").join(
            sql.SQL("t2.{k} = s.{k}").format(k=ident(k)) for k in key
        )
        s_key = sql.SQL(", ").join(sql.SQL("s.{}").format(ident(k)) for k in key)
        fresh = sql.SQL("now() - make_interval(secs => {})").format(sql.Literal(float(last_seen_resolution)))
        updates = sql.SQL(", ").join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=ident(c)) for c in all_cols if c not in key
        )
        self.create_stage = sql.SQL(
            "CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE {table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        ).format(stage=ident(self.stage), table=ident(table))
        self.clear_stage = sql.SQL("DELETE FROM {}").format(ident(self.stage))
        self.copy = sql.SQL("COPY {stage} ({cols}) FROM STDIN").format(
            stage=ident(self.stage), cols=cols_sql
        )
        # The rows about to change, read and locked (in key order, like the merge) before the
        # merge overwrites them: their old values are the history's "old". Unchanged rows are
        # filtered out before the lock, so they are neither locked nor WAL-logged.
        self.lock_old = sql.SQL(
            """
            SELECT {s_key}, to_jsonb(cur) FROM (SELECT * FROM {stage} ORDER BY {key}) s
            JOIN LATERAL (
                SELECT t2.* FROM {table} t2 WHERE {key_match}
                AND (t2.content_hash IS DISTINCT FROM s.content_hash OR t2.gone_at IS NOT NULL)
                LIMIT 1 FOR UPDATE
            ) cur ON true
            """
        ).format(s_key=s_key, stage=ident(self.stage), key=key_sql, table=ident(table), key_match=key_match)
        # The current row is looked up per staged row (LATERAL … LIMIT 1), which forces an
        # index probe: a plain NOT EXISTS lets the planner hash the whole target table for
        # every batch, which is 50 ms per 1,000 rows at 100k rows and grows with the table.
        merge_core = sql.SQL(
            """
            INSERT INTO {table} AS t ({cols})
            SELECT {s_cols} FROM {stage} s
            LEFT JOIN LATERAL (
                SELECT t2.content_hash, t2.last_seen, t2.gone_at FROM {table} t2 WHERE {key_match} LIMIT 1
            ) cur ON true
            WHERE cur.content_hash IS DISTINCT FROM s.content_hash OR cur.last_seen < {fresh}
                OR cur.gone_at IS NOT NULL
            ORDER BY {s_key}
            ON CONFLICT ({key}) DO UPDATE SET {updates},
                last_seen = now(),
                gone_at = NULL,
                updated_at = CASE WHEN t.content_hash IS DISTINCT FROM EXCLUDED.content_hash
                                  THEN now() ELSE t.updated_at END
            WHERE t.content_hash IS DISTINCT FROM EXCLUDED.content_hash OR t.last_seen < {fresh}
                OR t.gone_at IS NOT NULL
            """
        ).format(
            table=ident(table), stage=ident(self.stage), cols=cols_sql, key=key_sql,
            s_cols=sql.SQL(", ").join(sql.SQL("s.{}").format(ident(c)) for c in all_cols),
            s_key=s_key, key_match=key_match, fresh=fresh, updates=updates,
        )
        self.merge = sql.SQL("{core} RETURNING {key}, (xmax = 0) AS inserted, (updated_at = now()) AS changed{new}").format(
            core=merge_core, key=key_sql, new=sql.SQL(", to_jsonb(t)") if track else sql.SQL(""),
        )
        # The same merge writing the history entry of each insert in the statement: an insert's
        # entry is every column with a value, which the row itself holds, so Postgres builds it
        # from the row instead of the writer reading the row back as JSON and sending it again
        # (a third of the writer thread's CPU on a crawl of new pages). Changes of existing rows
        # still come back as JSON: their entry is a diff against the old row (lock_old).
        m_key = sql.SQL(", ").join(sql.SQL("m.{}").format(ident(k)) for k in key)
        self.merge_history = sql.SQL(
            """
            WITH m AS (
                {core} RETURNING {key}, (xmax = 0) AS _inserted, (updated_at = now()) AS _changed, to_jsonb(t) AS _new
            ), h AS (
                INSERT INTO item_changes (item_table, key, kind, reason, spider, run_id, changes)
                SELECT {table_name}, jsonb_build_array({m_key}), 'insert', {reason}, {spider}, {run_id},
                    coalesce((SELECT jsonb_object_agg(e.key, jsonb_build_array(NULL, e.value))
                              FROM jsonb_each(m._new) e
                              WHERE e.key = ANY({columns}) AND e.value <> 'null'::jsonb), '{{}}'::jsonb)
                FROM m WHERE m._inserted ORDER BY {m_key}
            )
            SELECT {key}, _inserted, _changed, CASE WHEN _inserted THEN NULL ELSE _new END FROM m
            """
        )
        self._merge_history_parts = dict(
            core=merge_core, key=key_sql, m_key=m_key, table_name=sql.Literal(table),
            columns=sql.SQL("ARRAY[{}]::text[]").format(sql.SQL(", ").join(map(sql.Literal, columns))),
        )

    def _copy_data(self, rows: list[Row]) -> str:
        columns = self.columns
        extra = [] if self.spider is None else [self.spider]
        return "".join(
            copy_line([row.values.get(c) for c in columns] + [row.content_hash] + extra) + "\n" for row in rows
        )

    def _prepare(self, cur: Any, before: str = "") -> None:
        """Render the statements once, and have this connection plan the two big ones once.

        A batch at the lease cap holds a dozen rows or so, and parsing and planning the merge
        and the lock were a fifth of the backend's CPU on such a batch (1.40 ms per 17-row
        batch, 1.10 prepared). Prepared statements live as long as the session, whatever
        becomes of the transaction that made them; one that finds the staging table made anew
        (a rolled-back first batch) is planned again by Postgres itself. Behind a pooler that
        hands each transaction another session they are gone at the next batch: then the
        statements are sent as text from there on (see :meth:`_run`)."""
        self._sql = {name: getattr(self, name).as_string(cur)
                     for name in ("create_stage", "clear_stage", "copy", "lock_old", "merge")}
        prepared_history = ""
        if self.sql_history:
            parts = self._merge_history_parts
            # As text, the context goes in as query parameters; prepared, as the statement's.
            self._sql["merge_history"] = self.merge_history.format(
                **parts, reason=sql.Placeholder(), spider=sql.Placeholder(), run_id=sql.Placeholder()).as_string(cur)
            prepared_history = self.merge_history.format(
                **parts, reason=sql.SQL("$1"), spider=sql.SQL("$2"), run_id=sql.SQL("$3")).as_string(cur)
        self._create_stage(cur, before)
        # Named per upserter: two upserters of one table may share a connection.
        self._names = {name: f"{self.stage}_{name}_{next(_PREPARED)}" for name in ("lock_old", "merge", "merge_history")}
        if self._use_prepared:
            for name in ("lock_old", "merge") if self.track else ("merge",):
                cur.execute(f"PREPARE {self._names[name]} AS {self._sql[name]}")
            if prepared_history:
                cur.execute(f"PREPARE {self._names['merge_history']} (text, text, bigint) AS {prepared_history}")
        self._prepared_on = cur.connection

    def _run(self, cur: Any, name: str, params: tuple[Any, ...] = ()) -> None:
        if not self._use_prepared:
            cur.execute(self._sql[name], params or None)
            return
        try:
            if params:
                cur.execute(f"EXECUTE {self._names[name]} ({', '.join(['%s'] * len(params))})", params)
            else:
                cur.execute(f"EXECUTE {self._names[name]}")
        except psycopg2.errors.InvalidSqlStatementName:
            # The writer takes this for a lost connection: it reconnects and writes the batch
            # again, then without prepared statements.
            self._use_prepared = False
            logger.warning("Prepared statements do not last between transactions on this database "
                           "connection (a pooler in transaction mode?): the upsert of %s is planned "
                           "for every batch from now on", self.table)
            raise

    def _create_stage(self, cur: Any, before: str) -> None:
        # One round trip with the caller's statement: each costs the writer thread a wait for
        # the interpreter lock (see scraper.extensions.switch_interval).
        cur.execute(f"{before}; {self._sql['create_stage']}" if before else self._sql["create_stage"])

    def write(self, cur: Any, rows: list[Row], again: bool = False, before: str = "",
              context: Context | None = None) -> BatchResult:
        """Upsert *rows* inside the caller's transaction. Keys must be unique within *rows*.

        ``again``: an earlier write in this same transaction used the staging table (the
        stage is only emptied at commit). ``before``: a statement of the caller's to run first,
        in the same round trip (the writer's ``SAVEPOINT``). ``context`` (with ``sql_history``):
        the history entries of inserts are written here, with it, and left out of
        ``BatchResult.changes``; the caller records the rest."""
        result = BatchResult()
        rows = sorted(rows, key=lambda r: tuple("" if v is None else str(v) for v in r.key))
        if self._prepared_on is not cur.connection:
            self._prepare(cur, before)
        else:
            self._create_stage(cur, before)
        if again:
            cur.execute(self._sql["clear_stage"])
        cur.copy_expert(self._sql["copy"], io.StringIO(self._copy_data(rows)))
        width = len(self.key)
        old: dict[tuple[Any, ...], dict[str, Any]] = {}
        if self.track:
            self._run(cur, "lock_old")
            old = {tuple(r[:width]): r[width] for r in cur.fetchall()}
        in_sql = self.sql_history and context is not None
        if in_sql:
            self._run(cur, "merge_history", (context.reason, context.spider, context.run_id))
        else:
            self._run(cur, "merge")
        for record in cur.fetchall():
            key = tuple(record[:width])
            inserted, changed = record[width], record[width + 1]
            if inserted:
                result.inserted.add(key)
            elif changed:
                result.updated.add(key)
            if self.track and not (in_sql and inserted):
                self._note_change(result, key, inserted, old.get(key), record[width + 2])
        return result

    def _note_change(self, result: BatchResult, key: tuple[Any, ...], inserted: bool,
                     old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        if inserted:
            values = {c: [None, new.get(c)] for c in self.columns if new.get(c) is not None}
            result.changes.append(Change(list(key), "insert", values))
        elif old is not None:
            changed = diff(old, new, self.columns)
            if changed or old.get("gone_at") is not None:
                result.changes.append(Change(list(key), "back" if old.get("gone_at") is not None else "update", changed))
