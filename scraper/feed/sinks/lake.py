"""The lake: Apache Iceberg tables (Parquet files) in a folder or a bucket (S3, GCS), catalogued
in our own Postgres.

Two tables in the namespace ``CHANGEFEED_LAKE_NAMESPACE``:

- ``changes``: every event, appended (partitioned by spider and day): the history as a table.
- ``current``: one row per item, upserted on ``(item_table, key)``: its values as Postgres holds
  them (JSON), its ``content_hash``, ``gone`` (flagged, not deleted: a gone item may come back),
  the last event that touched it. Its rows are read from the item tables when an event of the
  item goes out, so ``current`` is Postgres' state as of the feed's position, which
  ``scrapy feed verify`` compares row by row (the content hashes).

The catalog is pyiceberg's SQL catalog in the project's database (tables ``iceberg_tables`` and
``iceberg_namespace_properties``): no other service. Each commit records the last event id of
its batch in the snapshot summary (``changefeed.last_event_id``). A relay that dies after the
lake committed a batch but before its position was saved sends that batch again: the first batch
after a start is checked against ``changes`` and what is there already is not written twice;
``current`` is an upsert and comes out the same either way.

pyiceberg is synchronous: its calls run in a thread, off the relay's event loop.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pyarrow as pa
from psycopg2 import sql
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import And, EqualTo, In, Or
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import BooleanType, LongType, NestedField, StringType, TimestamptzType

from ...config import mask_url
from ..config import FeedConfig
from ..events import Event
from . import lake_io
from .base import Delivery, Sink, SinkError, failure

# New items have no row to replace yet: pyiceberg says so for every batch that brings one.
warnings.filterwarnings("ignore", "Delete operation did not match any records", UserWarning)

CHANGES_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "item_table", StringType(), required=False),
    NestedField(3, "key", StringType(), required=False),
    NestedField(4, "kind", StringType(), required=False),
    NestedField(5, "reason", StringType(), required=False),
    NestedField(6, "spider", StringType(), required=False),
    NestedField(7, "run_id", LongType(), required=False),
    NestedField(8, "at", TimestamptzType(), required=False),
    NestedField(9, "changes", StringType(), required=False),
)
CHANGES_PARTITIONS = PartitionSpec(
    PartitionField(source_id=6, field_id=1000, transform=IdentityTransform(), name="spider"),
    PartitionField(source_id=8, field_id=1001, transform=DayTransform(), name="at_day"),
)
CURRENT_SCHEMA = Schema(
    NestedField(1, "item_table", StringType(), required=False),
    NestedField(2, "key", StringType(), required=False),
    NestedField(3, "spider", StringType(), required=False),
    NestedField(4, "content_hash", StringType(), required=False),
    NestedField(5, "gone", BooleanType(), required=False),
    NestedField(6, "row", StringType(), required=False),
    NestedField(7, "event_id", LongType(), required=False),
)
_CHANGES_ARROW = pa.schema(
    [
        ("id", pa.int64()),
        ("item_table", pa.string()),
        ("key", pa.string()),
        ("kind", pa.string()),
        ("reason", pa.string()),
        ("spider", pa.string()),
        ("run_id", pa.int64()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("changes", pa.string()),
    ]
)
_CURRENT_ARROW = pa.schema(
    [
        ("item_table", pa.string()),
        ("key", pa.string()),
        ("spider", pa.string()),
        ("content_hash", pa.string()),
        ("gone", pa.bool_()),
        ("row", pa.string()),
        ("event_id", pa.int64()),
    ]
)
LAST_EVENT = "changefeed.last_event_id"
# Each commit writes a metadata file; the table properties of the Iceberg spec that delete the
# oldest with each commit, so that a bucket does not keep one per batch forever.
METADATA_PROPERTIES = {
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "50",
}


def key_text(key: Any) -> str:
    """An item key as the lake keeps it: compact JSON, as ``Event.key_text``."""
    return json.dumps(key, ensure_ascii=False, separators=(",", ":"), default=str)


def catalog_uri(database_url: str) -> str:
    """*database_url* as SQLAlchemy names a psycopg2 connection."""
    parts = urlsplit(database_url)
    return urlunsplit(("postgresql+psycopg2", *parts[1:]))


def open_catalog(database_url: str, location: str, endpoint: str | None = None, timeout: float = 30.0) -> SqlCatalog:
    """The lake's catalog, its tables' files in *location* (a folder, ``s3://`` or ``gs://``)."""
    return SqlCatalog(
        "changefeed",
        uri=catalog_uri(database_url),
        warehouse=lake_io.warehouse(location),
        **lake_io.properties(location, endpoint, timeout),
    )


def _key_columns(cur: Any, table: str) -> list[tuple[str, str]]:
    """The primary key columns of *table* and their types, in key order."""
    cur.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_index i"
        " JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
        " WHERE i.indrelid = to_regclass(%s) AND i.indisprimary ORDER BY k.n",
        (table,),
    )
    return cur.fetchall()


def current_rows(cur: Any, table: str, keys: list[Any] | None) -> list[dict[str, Any]]:
    """Rows of item table *table* as ``current`` holds them: those of *keys* (JSON arrays), or
    all of them (None)."""
    columns = _key_columns(cur, table)
    if not columns:
        return []
    key_sql = sql.SQL("jsonb_build_array({})").format(
        sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c)) for c, _t in columns)
    )
    # The bookkeeping columns every item table has; a table of another kind that writes history
    # too gets NULLs rather than stopping the lake.
    cur.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND table_name = %s AND column_name IN ('spider', 'content_hash', 'gone_at')",
        (table,),
    )
    has = {name for (name,) in cur.fetchall()}
    query = sql.SQL("SELECT {key}, {spider}, {content_hash}, {gone}, to_jsonb(t) FROM {table} t").format(
        key=key_sql,
        spider=sql.SQL("t.spider" if "spider" in has else "NULL::text"),
        content_hash=sql.SQL("t.content_hash" if "content_hash" in has else "md5(to_jsonb(t)::text)"),
        gone=sql.SQL("t.gone_at IS NOT NULL" if "gone_at" in has else "false"),
        table=sql.Identifier(table),
    )
    params: tuple[Any, ...] = ()
    if keys is not None:
        match = sql.SQL(" AND ").join(
            sql.SQL("t.{} = (k.key->>{})::{}").format(sql.Identifier(c), sql.Literal(i), sql.SQL(kind))
            for i, (c, kind) in enumerate(columns)
        )
        query = sql.SQL("{} JOIN jsonb_array_elements(%s::jsonb) AS k(key) ON {}").format(query, match)
        params = (json.dumps(keys, default=str),)
    cur.execute(query, params)
    out = []
    for key, spider, content_hash, gone, row in cur.fetchall():
        for bookkeeping in ("first_seen", "last_seen", "updated_at", "gone_at", "content_hash", "spider"):
            row.pop(bookkeeping, None)
        out.append(
            {
                "item_table": table,
                "key": key_text(key),
                "spider": spider,
                "content_hash": content_hash,
                "gone": gone,
                "row": json.dumps(row, ensure_ascii=False, sort_keys=True, default=str),
            }
        )
    return out


class LakeSink(Sink):
    kind = "lake"

    def __init__(
        self,
        database_url: str,
        folder: str,
        namespace: str = "changefeed",
        endpoint: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        self._database_url = database_url
        self.folder = folder
        self.namespace = namespace
        self.endpoint = endpoint
        self.timeout = timeout
        self._catalog: Any = None
        self._changes: Any = None
        self._current: Any = None
        self._conn: Any = None
        self._fresh = True  # the first batch after a start may have been committed already

    @classmethod
    def from_config(cls, conf: FeedConfig, database_url: str) -> LakeSink:
        return cls(database_url, conf.lake_folder, conf.lake_namespace, conf.lake_endpoint, conf.lake_timeout)

    def describe(self) -> str:
        at = f" at {mask_url(self.endpoint)}" if self.endpoint else ""
        return (
            f"lake {self.folder}{at} (Iceberg, catalog in {mask_url(self._database_url)}, namespace {self.namespace})"
        )

    def _open(self) -> None:
        self._catalog = open_catalog(self._database_url, self.folder, self.endpoint, self.timeout)
        self._catalog.create_namespace_if_not_exists(self.namespace)
        self._changes = self._catalog.create_table_if_not_exists(
            f"{self.namespace}.changes",
            schema=CHANGES_SCHEMA,
            partition_spec=CHANGES_PARTITIONS,
            properties=METADATA_PROPERTIES,
        )
        self._current = self._catalog.create_table_if_not_exists(
            f"{self.namespace}.current", schema=CURRENT_SCHEMA, properties=METADATA_PROPERTIES
        )
        self._conn = psycopg2.connect(self._database_url)
        self._conn.autocommit = True
        self._fresh = True

    async def open(self) -> None:
        try:
            await asyncio.to_thread(self._open)
        except Exception as exc:  # noqa: BLE001 - a folder or the catalog: said, waited for
            await self.close()
            raise SinkError(f"lake unavailable: {failure(exc)}") from None

    def _write(self, batch: Sequence[Event]) -> None:
        events = list(batch)
        if self._fresh:
            ids = [e.id for e in events]
            written = self._changes.scan(row_filter=In("id", ids), selected_fields=("id",)).to_arrow()
            done = set(written.column("id").to_pylist())
            events = [e for e in events if e.id not in done]
            self._fresh = False
        properties = {LAST_EVENT: str(batch[-1].id)} if batch else {}
        if events:
            rows = [
                {
                    "id": e.id,
                    "item_table": e.item_table,
                    "key": key_text(e.key),
                    "kind": e.kind,
                    "reason": e.reason,
                    "spider": e.spider,
                    "run_id": e.run_id,
                    "at": e.at,
                    "changes": json.dumps(e.changes, ensure_ascii=False, default=str),
                }
                for e in events
            ]
            self._changes.append(pa.Table.from_pylist(rows, schema=_CHANGES_ARROW), snapshot_properties=properties)
        # The items touched, as Postgres holds them now (the last event of each names it). From
        # the whole batch: a batch sent again because ``current`` failed after ``changes`` took it
        # must still reach ``current``.
        last: dict[tuple[str, str], Event] = {}
        for e in batch:
            last[(e.item_table, key_text(e.key))] = e
        by_table: dict[str, list[Any]] = {}
        for e in last.values():
            by_table.setdefault(e.item_table, []).append(e.key)
        current = []
        with self._conn.cursor() as cur:
            for table, keys in by_table.items():
                for row in current_rows(cur, table, keys):
                    row["event_id"] = last[(table, row["key"])].id
                    current.append(row)
        if current:
            # An upsert as one overwrite: the rows of these keys deleted, the new ones appended,
            # in one commit. pyiceberg's own upsert matches with one predicate per row, whose
            # binding alone took ~0.6 ms a row (a 5,000-event batch: 4.4 s); a set per table
            # takes a few ms.
            keys: dict[str, list[str]] = {}
            for row in current:
                keys.setdefault(row["item_table"], []).append(row["key"])
            match = [And(EqualTo("item_table", table), In("key", ks)) for table, ks in keys.items()]
            self._current.overwrite(
                pa.Table.from_pylist(current, schema=_CURRENT_ARROW),
                overwrite_filter=match[0] if len(match) == 1 else Or(*match),
                snapshot_properties=properties,
            )

    async def publish(self, events: Sequence[Event]) -> Delivery:
        if self._catalog is None:
            await self.open()
        try:
            await asyncio.to_thread(self._write, list(events))
        except Exception as exc:  # noqa: BLE001 - a commit that failed is sent again
            await self.close()
            raise SinkError(f"lake commit failed: {failure(exc)}") from None
        return Delivery()

    async def close(self) -> None:
        conn, self._conn, self._catalog = self._conn, None, None
        self._changes = self._current = None
        if conn is not None:
            try:
                conn.close()
            except psycopg2.Error:
                pass


def compare_current(
    database_url: str, folder: str, namespace: str, endpoint: str | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """The lake's ``current`` beside Postgres' item tables, row by row (content hash and gone):
    counts of rows in each, of rows differing, missing from the lake, or only in the lake."""
    catalog = open_catalog(database_url, folder, endpoint, timeout)
    lake = catalog.load_table(f"{namespace}.current").scan(
        selected_fields=("item_table", "key", "content_hash", "gone")
    )
    held = {(r["item_table"], r["key"]): (r["content_hash"], r["gone"]) for r in lake.to_arrow().to_pylist()}
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT DISTINCT item_table FROM item_changes")
            tables = [t for (t,) in cur.fetchall()]
            pg = {}
            for table in tables:
                for row in current_rows(cur, table, None):
                    pg[(table, row["key"])] = (row["content_hash"], row["gone"])
    finally:
        conn.close()
    differ = sum(1 for k, v in pg.items() if k in held and held[k] != v)
    return {
        "postgres": len(pg),
        "lake": len(held),
        "differ": differ,
        "missing": sum(1 for k in pg if k not in held),
        "extra": sum(1 for k in held if k not in pg),
    }
