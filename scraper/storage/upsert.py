"""The SQL of one batch: one ordered, idempotent ``INSERT … ON CONFLICT`` of rows sent as one
JSON parameter or, for a full batch, staged with COPY.

A batch usually travels as a single JSON array that the statement unpacks itself
(``json_populate_recordset`` over the table's own row type): one round trip, no staging table.
A batch at the lease cap holds a dozen rows or so, and for such a batch a temporary staging
table cost more than the rows: creating it (``IF NOT EXISTS``) and emptying it at commit took
1.5 ms of the backend's CPU per batch, a JSON parameter 0.4 ms (see docs/performance.md).
Each row's JSON is the one its content hash was computed from, so it is not
serialized twice. A batch of ``COPY_FROM`` rows or more (the writer's full batch, sent when rows
pile up) is staged with COPY instead, when history is kept: from about a thousand rows Postgres
reading COPY's text, and the lock reading its keys from the staging table, save more than the
staging table costs. Both paths store the same values (see copy_field).
Rows whose content hash is unchanged are filtered out *before* the insert
(an anti-join), because letting ``ON CONFLICT … WHERE`` discard them still locks and WAL-logs
every row. Rows are sorted by the natural key so that two workers writing overlapping batches
take their row locks in the same order and cannot deadlock.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
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
    # The values as the JSON object their content hash was computed from (see row_json). Both
    # are read when the row is built: a row whose values change must be built anew.
    canonical: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.content_hash:
            self.canonical = canonical_json(self.values)
            self.content_hash = hashlib.sha1(self.canonical.encode("utf-8")).hexdigest()


@dataclass
class BatchResult:
    inserted: set[tuple[Any, ...]] = field(default_factory=set)
    updated: set[tuple[Any, ...]] = field(default_factory=set)
    # key -> database error, for rows the database refused (isolated row by row)
    failed: dict[tuple[Any, ...], str] = field(default_factory=dict)
    # Inserts and changes, for the history (only when the upserter tracks them)
    changes: list[Change] = field(default_factory=list)
    # Changes kept out of the row until the run is judged (see Watch): key -> (the row as it
    # came, {field: [stored, new]})
    awaiting: dict[tuple[Any, ...], tuple[Row, dict[str, list[Any]]]] = field(default_factory=dict)
    # Rows stored before and how many of them moved beyond the shift (field -> [rows, moved]),
    # for the live guard
    pairs: dict[str, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Watch:
    """Changes of a stored row that wait for the run's judgement instead of being written.

    A value that moves by more than *shift* (prices, and numeric fields that declare a
    ``shift``) or an optional value that goes from something to nothing is what a broken layout
    writes first: a bundle price on half the pages, a class renamed. Such a change is kept
    aside with the run (``held_changes``, kind ``value``) and the row keeps its value; the last
    node out applies it once the run's checks of that field pass (:mod:`scraper.quality.settle`),
    or leaves it held when they fail. Only crawls with a run and a quality guard that holds
    watch: nobody else would judge."""

    moves: dict[str, float]  # field -> the share it may move by before it waits
    blanks: frozenset[str]  # optional fields whose blanking waits
    # A price's currency field -> the price: it waits whenever its price's changes wait.
    companions: dict[str, str] = field(default_factory=dict)
    # Fields of *moves* whose every change waits until the run's guard has judged enough of
    # them (a redesign at a run's start writes its first small moves before any break could
    # be seen): the guard takes a field out once its pairs passed a full look.
    probation: set[str] = field(default_factory=set)
    # Fields the guard found broken in this run: every change of them waits (and stays held).
    broken: set[str] = field(default_factory=set)

    def doubts(self, name: str) -> bool:
        return name in self.broken or name in self.probation


def _jsonable(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


# Stored content hashes are computed from this text: it must not change, byte for byte. What
# json.dumps(..., default=str, ensure_ascii=False) writes, calling the C encoder that
# JSONEncoder.encode builds without its Python-level set-up per call (-6 % on a demo row); a
# row's columns are those of its table, so their sorted order is looked up, not sorted again.
_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str)
_AS_IS = frozenset({str, int, float, bool, type(None)})
_SORTED: dict[tuple[str, ...], tuple[str, ...]] = {}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number - number == 0.0 else None


def _same(stored: Any, value: Any) -> bool:
    """Whether *value* is what Postgres' jsonb of the row gives as *stored* (numbers come back
    as floats, dates as ISO text)."""
    if stored == value:
        return True
    a, b = _number(stored), _number(value)
    if a is not None and b is not None:
        return a == b
    return stored is not None and value is not None and str(stored) == str(_jsonable(value))


def _blank(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def canonical_json(values: dict[str, Any]) -> str:
    names = tuple(values)
    order = _SORTED.get(names)
    if order is None:
        order = tuple(sorted(names))
        if len(_SORTED) < 1024:
            _SORTED[names] = order
    out = {}
    for name in order:
        value = values[name]
        out[name] = value if type(value) in _AS_IS else _jsonable(value)
    if c_make_encoder is None:  # a Python without the json module's C part
        return _ENCODER.encode(out)
    # Arguments as JSONEncoder.iterencode passes them for the encoder above; a fresh markers
    # dict per call, as there, keeps its circular-reference check.
    return "".join(c_make_encoder({}, str, encode_basestring, None, ": ", ", ", False, False, True)(out, 0))


def _storable(value: Any, top: bool = True) -> Any:
    """A value as Postgres can read it from JSON: NUL dropped (no text type holds it), NaN and
    the infinities as the strings numeric and float columns read (JSON has no such number).
    Anything else as :func:`canonical_json` writes it (dates, Decimals at the top level only)."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, float) and value - value != 0.0:
        return str(value).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(value, dict):
        return {str(k).replace("\x00", ""): _storable(v, False) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_storable(v, False) for v in value]
    return _jsonable(value) if top else value


def _reusable(text: str) -> bool:
    # The canonical JSON is reused unless it holds what Postgres cannot read back: a NUL
    # escape, or a NaN/Infinity token (the test also catches those words inside strings,
    # which then merely take the slower path).
    return bool(text) and "\\u0000" not in text and "NaN" not in text and "Infinity" not in text


def row_json(row: Row, extra: str) -> str:
    """*row*'s values as one JSON object, with *extra* (``"column": value`` pairs) added."""
    text = row.canonical
    if not _reusable(text):
        text = json.dumps({k: _storable(v) for k, v in row.values.items()}, default=str, ensure_ascii=False)
    return f"{text[:-1]}, {extra}}}" if len(text) > 2 else f"{{{extra}}}"


# COPY's text format: \N is NULL; backslash, tab, newline and CR are escaped. NUL is dropped, as
# the JSON path drops it (no text type holds it).
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\x00": ""})
_COPY_SPECIAL = re.compile("[\\\\\t\n\r\x00]")
_COPY_UNUSUAL = re.compile("[\\\\\n\r\x00]")
_INFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def copy_field(value: Any, json_column: bool, canonical: str) -> str | None:
    """*value* as a field of COPY's text format, the very text the JSON path hands the column's
    input function (``json_populate_recordset``: a string as it is, a number or ``true`` as its
    JSON token; dates and Decimals as canonical_json writes them), or None when only the JSON
    path knows how to store it (a list for an array column, a dict for a text column, a type
    canonical_json writes with ``str()``). *json_column*: the column is json or jsonb, which
    parses a string as JSON text and takes a list or dict as the JSON the row's text holds:
    its *canonical* JSON, unless row_json writes it anew."""
    kind = type(value)
    if kind is str:
        text = value
    elif value is None:
        return "\\N"
    elif kind is bool:
        return "true" if value else "false"
    elif kind is int or kind is Decimal:
        return str(value)
    elif kind is float:
        text = repr(value)
        return _INFINITE.get(text, text)
    elif isinstance(value, (datetime, date)):
        return value.isoformat()
    elif json_column and (kind is dict or kind is list or kind is tuple):
        if _reusable(canonical):
            text = _ENCODER.encode(value)
        else:
            text = json.dumps(_storable(value), default=str, ensure_ascii=False)
    else:
        return None
    return text.translate(_COPY_ESCAPES) if _COPY_SPECIAL.search(text) is not None else text


def _column_value(column: str, json_type: str | None) -> sql.Composable:
    """The staged value of *column* as the merge inserts it. A string given for a json or jsonb
    column is JSON text, as it was when batches were loaded with COPY, not a JSON string."""
    if json_type not in ("json", "jsonb"):
        return sql.SQL("s.{}").format(sql.Identifier(column))
    return sql.SQL("CASE WHEN {kind}(s.{c}) = 'string' THEN (s.{c} #>> '{{}}')::{t} ELSE s.{c} END").format(
        kind=sql.SQL(f"{json_type}_typeof"), c=sql.Identifier(column), t=sql.SQL(json_type)
    )


# Numbers the prepared statements of this process (see TableUpserter._prepare).
_PREPARED = itertools.count(1)
# Batches of at least this many rows are staged with COPY rather than sent as one JSON
# parameter (see TableUpserter.write and docs/performance.md).
COPY_FROM = 1000


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
        json_columns: dict[str, str] | None = None,
        copy_from: int | None = None,
    ) -> None:
        self.table = table
        self.columns = columns
        self.key = key
        self.spider = spider
        self.track = track
        # Inserts' history entries written by the merge itself (see write()); only for keys
        # whose JSON is the same built by Postgres or by Python (text and integers).
        self.sql_history = track and sql_history
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
        key_match = sql.SQL(" AND ").join(sql.SQL("t2.{k} = s.{k}").format(k=ident(k)) for k in key)
        s_key = sql.SQL(", ").join(sql.SQL("s.{}").format(ident(k)) for k in key)
        fresh = sql.SQL("now() - make_interval(secs => {})").format(sql.Literal(float(last_seen_resolution)))
        updates = sql.SQL(", ").join(sql.SQL("{c} = EXCLUDED.{c}").format(c=ident(c)) for c in all_cols if c not in key)
        json_columns = json_columns or {}
        # The batch comes from one of two sources: unpacked from its JSON parameter ({rows}) into
        # the table's own row type, or, for a large batch, a temporary table filled with COPY
        # (see write()). Each statement is built for both; "copy_" names the second.
        self.rows = sql.SQL("json_populate_recordset(NULL::{table}, {{rows}})").format(table=ident(table))
        self.stage = "_upsert_stage_" + hashlib.sha1("\x00".join([table, *all_cols]).encode()).hexdigest()[:16]
        staged = sql.SQL("pg_temp.{}").format(ident(self.stage))
        self.statements: dict[str, sql.Composed] = {}
        for prefix, rows in (("", self.rows), ("copy_", staged)):
            # The rows about to change, read and locked (in key order, like the merge) before the
            # merge overwrites them: their old values are the history's "old". Unchanged rows are
            # filtered out before the lock, so they are neither locked nor WAL-logged.
            lock_old = sql.SQL(
                """
            SELECT {s_key}, to_jsonb(cur) FROM (SELECT * FROM {rows} ORDER BY {key}) s
            JOIN LATERAL (
                SELECT t2.* FROM {table} t2 WHERE {key_match}
                AND (t2.content_hash IS DISTINCT FROM s.content_hash OR t2.gone_at IS NOT NULL)
                LIMIT 1 FOR UPDATE
            ) cur ON true
            """
            ).format(s_key=s_key, rows=rows, key=key_sql, table=ident(table), key_match=key_match)
            # The current row is looked up per staged row (LATERAL … LIMIT 1), which forces an
            # index probe: a plain NOT EXISTS lets the planner hash the whole target table for
            # every batch, which is 50 ms per 1,000 rows at 100k rows and grows with the table.
            merge_core = sql.SQL(
                """
            INSERT INTO {table} AS t ({cols})
            SELECT {s_cols} FROM {rows} s
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
                table=ident(table),
                rows=rows,
                cols=cols_sql,
                key=key_sql,
                # COPY hands a json column its text as it is: only the JSON source needs the CASE.
                s_cols=sql.SQL(", ").join(
                    _column_value(c, json_columns.get(c) if not prefix else None) for c in all_cols
                ),
                s_key=s_key,
                key_match=key_match,
                fresh=fresh,
                updates=updates,
            )
            merge = sql.SQL(
                "{core} RETURNING {key}, (xmax = 0) AS inserted, (updated_at = now()) AS changed{new}"
            ).format(
                core=merge_core,
                key=key_sql,
                new=sql.SQL(", to_jsonb(t)") if track else sql.SQL(""),
            )
            self.statements[prefix + "lock_old"] = lock_old
            self.statements[prefix + "merge"] = merge
            self.statements[prefix + "merge_history"] = self._merge_history(merge_core, key, json_columns)
        self.lock_old, self.merge, self.merge_history = (
            self.statements[n] for n in ("lock_old", "merge", "merge_history")
        )
        self.stage_sql = self._stage_sql(all_cols)
        self.json_columns = frozenset(c for c, t in json_columns.items() if t in ("json", "jsonb"))
        # The spider's name travels in each row's JSON (a column like the others), and after the
        # content hash in each line of COPY.
        self._extra = "" if spider is None else f'"spider": {json.dumps(spider, ensure_ascii=False)}, '
        self._copy_tail = "" if spider is None else "\t" + (copy_field(spider, False, "") or "")
        # Batches of at least this many rows are staged with COPY (0: never), see write(). By
        # default only when tracking: then the lock reads its keys from the staging table too;
        # without it, parsing COPY instead of JSON saved what the staging table cost (the
        # upsert bench, new and unchanged rows at 1,000 rows per batch).
        self.copy_from = (COPY_FROM if track else 0) if copy_from is None else copy_from
        self.watch: Watch | None = None

    def _merge_history(self, core: sql.Composable, key: tuple[str, ...], json_columns: dict[str, str]) -> sql.Composed:
        """The merge that also writes each insert's history entry (see write()).

        An insert's entry is every column with a value, which the row itself holds, so Postgres
        builds it from the row instead of the writer reading the row back as JSON and sending it
        again (a third of the writer thread's CPU on a crawl of new pages). Changes of existing
        rows still come back as JSON: their entry is a diff against the old row (lock_old).

        The entry is built from the inserted row's own columns, returned by the merge, with
        ``jsonb_build_object``: each value converted as ``to_jsonb`` converts it inside a row,
        so the entry is the one the Python path records from ``to_jsonb(t)``. Building it by
        taking ``to_jsonb(t)`` apart again (``jsonb_each`` … ``jsonb_object_agg``) cost 13 µs
        of the backend's CPU per new row, a third of the whole statement. Columns without a
        value are left out: SQL NULL, and JSON null in a json column (what ``to_jsonb`` writes
        as ``null``); ``num_nulls``, not ``IS NULL``, which is true of a composite value whose
        fields are all NULL. Only updated rows come back as JSON, for their diff against lock_old."""
        ident = sql.Identifier
        m_key = sql.SQL(", ").join(sql.SQL("m.{}").format(ident(k)) for k in key)
        pairs = [sql.SQL("{}, jsonb_build_array(NULL, m.{})").format(sql.Literal(c), ident(c)) for c in self.columns]
        # A function takes at most 100 arguments: wide tables are built in parts and joined.
        entry = sql.SQL(" || ").join(
            sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(pairs[i : i + 50]))
            for i in range(0, len(pairs), 50)
        )
        empty = sql.SQL(", ").join(
            sql.SQL("CASE WHEN num_nulls(m.{c}) = 1{json_null} THEN {name} END").format(
                c=ident(c),
                name=sql.Literal(c),
                json_null=sql.SQL(" OR {kind}(m.{c}) = 'null'").format(
                    kind=sql.SQL(f"{json_columns[c]}_typeof"), c=ident(c)
                )
                if json_columns.get(c) in ("json", "jsonb")
                else sql.SQL(""),
            )
            for c in self.columns
        )
        return sql.SQL(
            """
            WITH m AS (
                {core} RETURNING {columns}, (xmax = 0) AS _inserted, (updated_at = now()) AS _changed,
                    CASE WHEN xmax = 0 THEN NULL ELSE to_jsonb(t) END AS _new
            ), h AS (
                INSERT INTO item_changes (item_table, key, kind, reason, spider, run_id, changes)
                SELECT {table_name}, jsonb_build_array({m_key}), 'insert', {reason}, {spider}, {run_id},
                    ({entry}) - array_remove(ARRAY[{empty}]::text[], NULL)
                FROM m WHERE m._inserted ORDER BY {m_key}
            )
            SELECT {key}, _inserted, _changed, _new FROM m
            """
        ).format(
            core=core,
            columns=sql.SQL(", ").join(map(ident, self.columns)),
            key=sql.SQL(", ").join(map(ident, key)),
            m_key=m_key,
            table_name=sql.Literal(self.table),
            entry=entry,
            empty=empty,
            reason=sql.SQL("{reason}"),
            spider=sql.SQL("{spider}"),
            run_id=sql.SQL("{run_id}"),
        )

    def _stage_sql(self, all_cols: list[str]) -> sql.Composed:
        """What fills the staging table with one COPY: made when missing, and made again when
        a column of the table changed type since (a migration widens numerics: a stale
        ``numeric(14,2)`` would round a value the table now keeps with four decimals); emptied
        first, for a second batch in one transaction; then ``COPY … FROM STDIN``.

        A temporary table, so it is per session, never WAL-logged, and emptied at every commit
        (``ON COMMIT DELETE ROWS``). Made by the statement itself, not once per connection: a
        rolled back transaction takes it away with it, and behind a pooler in transaction mode
        each transaction may have another session."""
        ident = sql.Identifier
        cols = sql.SQL(", ").join(map(ident, all_cols))
        staged = sql.SQL("pg_temp.{}").format(ident(self.stage))
        return sql.SQL(
            """
            DO $upsert_stage$ BEGIN
                IF EXISTS (
                    SELECT FROM pg_attribute a JOIN pg_attribute b ON b.attname = a.attname
                    WHERE a.attrelid = to_regclass({staged_name}) AND b.attrelid = to_regclass(quote_ident({table_name}))
                        AND a.attnum > 0 AND b.attnum > 0 AND NOT b.attisdropped
                        AND (a.atttypid, a.atttypmod) IS DISTINCT FROM (b.atttypid, b.atttypmod)
                ) THEN
                    DROP TABLE {staged};
                END IF;
                IF to_regclass({staged_name}) IS NULL THEN
                    CREATE TEMPORARY TABLE {stage} ON COMMIT DELETE ROWS AS SELECT {cols} FROM {table} WITH NO DATA;
                END IF;
            END $upsert_stage$;
            DELETE FROM {staged};
            COPY {staged} ({cols}) FROM STDIN
            """
        ).format(
            staged=staged,
            stage=ident(self.stage),
            staged_name=sql.Literal(f"pg_temp.{self.stage}"),
            table=ident(self.table),
            table_name=sql.Literal(self.table),
            cols=cols,
        )

    def copy_text(self, rows: list[Row]) -> str | None:
        """The batch in COPY's text format, one line per row (the columns, the content hash, the
        spider), or None when a value of it only the JSON path stores as it should (see
        copy_field)."""
        names = self.columns
        json_columns = self.json_columns
        tail = self._copy_tail
        # A line needs no escape when it holds no backslash, newline, CR or NUL and no tab but
        # its separators: one test per line, not one per field.
        tabs = len(names) + tail.count("\t")
        unusual = _COPY_UNUSUAL.search
        lines = []
        for row in rows:
            values = row.values
            fields = [
                value if type(value) is str else copy_field(value, name in json_columns, row.canonical)
                for name, value in zip(names, map(values.get, names))
            ]
            if None in fields:
                return None
            fields.append(row.content_hash + tail)
            line = "\t".join(fields)  # type: ignore[arg-type]
            if unusual(line) is not None or line.count("\t") != tabs:
                fields = [copy_field(values.get(name), name in json_columns, row.canonical) for name in names]
                line = "\t".join([*fields, row.content_hash + tail])  # type: ignore[list-item]
            lines.append(line)
        lines.append("")
        return "\n".join(lines)

    def rows_json(self, rows: list[Row]) -> str:
        """The batch as the JSON array the statements take ({rows})."""
        extra = self._extra
        return (
            "["
            + ", ".join(row_json(row, f'{extra}"content_hash": {json.dumps(row.content_hash)}') for row in rows)
            + "]"
        )

    def keys_json(self, rows: list[Row]) -> str:
        """The batch's keys and content hashes alone, as the JSON array lock_old takes ({rows}):
        Postgres parses and converts every field it is sent, and lock_old reads no other."""
        return json.dumps(
            [
                {**{k: _storable(v) for k, v in zip(self.key, row.key)}, "content_hash": row.content_hash}
                for row in rows
            ],
            default=str,
            ensure_ascii=False,
        )

    # The parameters of each statement, in the order they appear in its text.
    _PARAMS = {
        "lock_old": ("rows",),
        "merge": ("rows",),
        "merge_history": ("rows", "reason", "spider", "run_id"),
        "copy_lock_old": (),
        "copy_merge": (),
        "copy_merge_history": ("reason", "spider", "run_id"),
    }
    _TYPES = {"rows": "json", "reason": "text", "spider": "text", "run_id": "bigint"}

    def statement(self, cur: Any, name: str, prepared: bool = False) -> str:
        """Statement *name* as text: with ``$1``… for PREPARE, else with ``%s`` for execute()."""
        text = self.statements[name].as_string(cur)
        if not prepared and self._PARAMS[name]:
            text = text.replace("%", "%%")
        for n, param in enumerate(self._PARAMS[name], 1):
            text = text.replace("{" + param + "}", f"${n}" if prepared else "%s")
        return text

    def _prepare(self, cur: Any) -> None:
        """Render the statements once, and have this connection plan them once.

        A batch at the lease cap holds a dozen rows or so, and parsing and planning the merge
        and the lock were a fifth of the backend's CPU on such a batch (1.40 ms per 17-row
        batch, 1.10 prepared). Prepared statements live as long as the session, whatever
        becomes of the transaction that made them. Behind a pooler that hands each transaction
        another session they are gone at the next batch: then the statements are sent as text
        from there on (see :meth:`_run`)."""
        names = ["merge", *(["lock_old"] if self.track else []), *(["merge_history"] if self.sql_history else [])]
        # The statements of staged batches are sent as text: they are planned once per batch of
        # hundreds of rows, and a prepared one would outlive its staging table.
        self._sql = {name: self.statement(cur, name) for name in [*names, *("copy_" + name for name in names)]}
        self._sql["stage"] = self.stage_sql.as_string(cur)
        # Named per upserter: two upserters of one table may share a connection.
        # Short: a name built from the table's could pass Postgres' 63 bytes and clash when cut.
        self._names = {name: f"_upsert_{next(_PREPARED)}_{name}" for name in names}
        if self._use_prepared:
            cur.execute(
                "; ".join(
                    f"PREPARE {self._names[name]} ({', '.join(self._TYPES[p] for p in self._PARAMS[name])}) "
                    f"AS {self.statement(cur, name, prepared=True)}"
                    for name in names
                )
            )
        self._prepared_on = cur.connection

    def _run(self, cur: Any, name: str, params: tuple[Any, ...]) -> None:
        if not self._use_prepared or name.startswith("copy_"):
            cur.execute(self._sql[name], params or None)
            return
        try:
            cur.execute(f"EXECUTE {self._names[name]} ({', '.join(['%s'] * len(params))})", params)
        except psycopg2.errors.InvalidSqlStatementName:
            # The writer takes this for a lost connection: it reconnects and writes the batch
            # again, then without prepared statements.
            self._use_prepared = False
            logger.warning(
                "Prepared statements do not last between transactions on this database "
                "connection (a pooler in transaction mode?): the upsert of %s is planned "
                "for every batch from now on",
                self.table,
            )
            raise

    def write(self, cur: Any, rows: list[Row], context: Context | None = None) -> BatchResult:
        """Upsert *rows* inside the caller's transaction. Keys must be unique within *rows*.

        ``context`` (with ``sql_history``): the history entries of inserts are written here,
        with it, and left out of ``BatchResult.changes``; the caller records the rest."""
        result = BatchResult()
        rows = sorted(rows, key=lambda r: tuple("" if v is None else str(v) for v in r.key))
        if self._prepared_on is not cur.connection:
            self._prepare(cur)
        width = len(self.key)
        # A large batch is staged with COPY: Postgres reads COPY's text faster than it unpacks
        # JSON, and the lock reads its keys from the staging table instead of a second JSON
        # document (CPU per row with history at 1,000 rows, writer and backend: new 26.9 ->
        # 24.7 µs, unchanged 12.7 -> 9.7). A small one is not: the staging table costs a round
        # trip and 0.5-6 ms per batch (its file is cut back at each commit, slower while the
        # disk is busy), which at 200 rows made unchanged batches 11 % slower (see
        # docs/performance.md, P2).
        text = self.copy_text(rows) if self.copy_from and len(rows) >= self.copy_from else None
        source = ""
        if text is not None:
            try:
                cur.copy_expert(self._sql["stage"], io.StringIO(text), size=len(text) + 1)
            except (psycopg2.errors.InsufficientPrivilege, psycopg2.errors.UndefinedObject):
                # A role that may not make temporary tables (or a database without PL/pgSQL):
                # the writer writes this flush again row by row, and later batches as JSON.
                self.copy_from = 0
                logger.warning(
                    "Cannot stage batches of %s with COPY on this database (no temporary tables?): "
                    "they are sent as JSON from now on",
                    self.table,
                )
                raise
            source = "copy_"
        old: dict[tuple[Any, ...], dict[str, Any]] = {}
        if self.track:
            self._run(cur, source + "lock_old", () if source else (self.keys_json(rows),))
            old = {tuple(r[:width]): r[width] for r in cur.fetchall()}
            if old and self.watch is not None and context is not None and context.reason == "crawl" and context.run_id:
                rows = self._hold_back(rows, old, result)
                if result.awaiting:
                    # The staging table holds the rows as they came, not as they are kept.
                    source = ""
        in_sql = self.sql_history and context is not None
        history_params: tuple[Any, ...] = (context.reason, context.spider, context.run_id) if in_sql else ()
        name = "merge_history" if in_sql else "merge"
        if source:
            self._run(cur, source + name, history_params)
        else:
            self._run(cur, name, (self.rows_json(rows), *history_params))
        for record in cur.fetchall():
            key = tuple(record[:width])
            inserted, changed = record[width], record[width + 1]
            if inserted:
                result.inserted.add(key)
            elif changed:
                result.updated.add(key)
            if self.track and not (in_sql and inserted):
                self._note_change(result, key, inserted, old.get(key), record[width + 2])
        if self.watch is not None and self.watch.moves:
            # Every row of the batch that was stored before is a pair, changed or not (the lock
            # reads only the changed ones): the share moved is over all of them.
            known = len(rows) - len(result.inserted)
            for name in self.watch.moves:
                result.pairs.setdefault(name, [0, 0])[0] += known
        return result

    def _hold_back(self, rows: list[Row], old: dict[tuple[Any, ...], dict[str, Any]], result: BatchResult) -> list[Row]:
        """*rows* with the changes the watch keeps waiting replaced by the stored values; the
        rows as they came go to ``result.awaiting``."""
        watch = self.watch
        assert watch is not None
        out = []
        for row in rows:
            stored = old.get(row.key)
            if stored is None or stored.get("gone_at") is not None:
                out.append(row)
                continue
            waiting: dict[str, list[Any]] = {}
            values = row.values
            for name, shift in watch.moves.items():
                before, now = _number(stored.get(name)), _number(values.get(name))
                if before is not None and now is not None and abs(now - before) > shift * max(abs(before), 0.01):
                    result.pairs.setdefault(name, [0, 0])[1] += 1
                    waiting[name] = [stored.get(name), values.get(name)]
            for name in watch.blanks:
                if _blank(values.get(name)) and not _blank(stored.get(name)):
                    waiting[name] = [stored.get(name), None]
            if watch.broken or watch.probation:
                for name in (*watch.broken, *watch.probation, *watch.companions):
                    doubted = watch.doubts(name) or (name in watch.companions and watch.doubts(watch.companions[name]))
                    if doubted and name not in waiting and not _same(stored.get(name), values.get(name)):
                        waiting[name] = [stored.get(name), values.get(name)]
            if not waiting:
                out.append(row)
                continue
            result.awaiting[row.key] = (row, waiting)
            kept = {**values, **{name: pair[0] for name, pair in waiting.items()}}
            # Nothing else changed: the row keeps its content hash, so the merge leaves it as it is.
            others = any(
                not _same(stored.get(c), kept.get(c)) for c in self.columns if c not in waiting and c not in self.key
            )
            out.append(Row(row.key, kept) if others else Row(row.key, kept, content_hash=stored["content_hash"]))
        return out

    def _note_change(
        self, result: BatchResult, key: tuple[Any, ...], inserted: bool, old: dict[str, Any] | None, new: dict[str, Any]
    ) -> None:
        if inserted:
            values = {c: [None, new.get(c)] for c in self.columns if new.get(c) is not None}
            result.changes.append(Change(list(key), "insert", values))
        elif old is not None:
            changed = diff(old, new, self.columns)
            if changed or old.get("gone_at") is not None:
                result.changes.append(
                    Change(list(key), "back" if old.get("gone_at") is not None else "update", changed)
                )
