"""A table's rows to an Apache Parquet file, typed as Postgres types them, in constant memory.

Postgres writes the rows as CSV (``COPY (SELECT ...) TO STDOUT``) and pyarrow's CSV reader turns
them into typed columns: no Python object per value, which is what makes it several times faster
than fetching rows through a cursor. A thread of its own parses and encodes while the next rows
arrive, so Postgres, the parser and the Parquet encoder share the cores instead of taking turns.
Memory stays bounded: a few chunks of rows in flight and one row group. The file is written
under a temporary name next to the target and renamed when complete, so a failed export leaves
no half file and does not touch an existing one.

Types: smallint/integer/bigint -> int16/int32/int64; ``numeric(p,s)`` -> decimal128(p,s) (p up to
38), any other numeric -> string (its exact digits, never a float); real/double -> float32/64;
boolean; timestamptz -> timestamp[us, UTC]; timestamp -> timestamp[us]; date -> date32;
json/jsonb and arrays -> JSON text (Parquet's JSON logical type: a string to readers that do not
know it); everything else (text, uuid, time, interval, enums, ...) -> its Postgres text.
"""

from __future__ import annotations

import os
import queue
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from psycopg2 import sql

# Rows are handed to the parser in chunks small enough that parsing starts early (16k rows: 8k
# was no faster, 32k slower), and written in row groups of whichever limit comes first: big
# enough for readers to skip and compress well, small enough for bounded memory.
CHUNK_ROWS = 16 * 1024
CHUNK_BYTES = 16 * 1024 * 1024
ROW_GROUP_ROWS = 128 * 1024
ROW_GROUP_BYTES = 128 * 1024 * 1024

_JSON = pa.json_(pa.string())
_SIMPLE: dict[str, pa.DataType] = {
    "smallint": pa.int16(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "real": pa.float32(),
    "double precision": pa.float64(),
    "boolean": pa.bool_(),
    "date": pa.date32(),
    "timestamp with time zone": pa.timestamp("us", "UTC"),
    "timestamp without time zone": pa.timestamp("us"),
    "json": _JSON,
    "jsonb": _JSON,
    "ARRAY": _JSON,
}
_CSV_COLUMN = re.compile(r"In CSV column #(\d+): (?:Row #\d+: )?(.*)", re.DOTALL)


class ExportError(Exception):
    """A value Parquet cannot hold as its column is typed (a NaN decimal, an infinite
    timestamp); the message names the column."""


@dataclass(frozen=True)
class Column:
    name: str
    data_type: str  # information_schema's data_type: "numeric", "ARRAY", "USER-DEFINED", ...
    precision: int | None = None
    scale: int | None = None

    @property
    def arrow_type(self) -> pa.DataType:
        if self.data_type == "numeric":
            p, s = self.precision, self.scale
            # Parquet decimals need 0 <= scale <= precision; past 38 digits readers fall back to
            # floats, so those stay exact text.
            if p is not None and s is not None and 0 <= s <= p <= 38:
                return pa.decimal128(p, s)
            return pa.string()
        return _SIMPLE.get(self.data_type, pa.string())

    @property
    def parse_type(self) -> pa.DataType:
        """What the CSV reader makes of the column before it gets its final type."""
        if self.data_type == "timestamp with time zone":
            return pa.timestamp("us")  # selected at UTC, without offset: see select_expression
        return pa.string() if self.arrow_type == _JSON else self.arrow_type

    def select_expression(self) -> sql.Composable:
        name = sql.Identifier(self.name)
        if self.data_type == "ARRAY":
            return sql.SQL("array_to_json({})::text").format(name)
        if self.data_type == "timestamp with time zone":
            # The session's zone may have offsets in seconds (LMT before 1900) that no parser
            # takes; UTC without an offset always parses, and --since keeps the session's zone.
            return sql.SQL("({} AT TIME ZONE 'UTC')").format(name)
        return name


def table_columns(conn: Any, table: str) -> list[Column]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT column_name, data_type, numeric_precision, numeric_scale FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
            (table,),
        )
        return [
            Column(name, kind, precision, scale) if kind == "numeric" else Column(name, kind)
            for name, kind, precision, scale in cur.fetchall()
        ]


def schema(columns: list[Column]) -> pa.Schema:
    return pa.schema([pa.field(c.name, c.arrow_type, metadata={"postgres_type": c.data_type}) for c in columns])


class _Pipeline:
    """The file object COPY writes to, and the thread that parses and writes what it gets.

    Postgres sends each row of a COPY TO in a message of its own and psycopg2 hands each message
    to ``write``, so a cut between two calls is always a cut between rows, even where a quoted
    value holds a newline."""

    def __init__(self, columns: list[Column], writer: pq.ParquetWriter, on_rows: Callable[[int], None]) -> None:
        self.columns = columns
        self.schema = schema(columns)
        self.writer = writer
        self.on_rows = on_rows
        self.parts: list[bytes] = []
        self.size = 0
        self.rows = 0
        self.error: BaseException | None = None
        # Two chunks waiting at most: COPY waits for the parser rather than filling memory.
        self.chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=2)
        self.group: list[pa.Table] = []
        # One parsing thread: Postgres and the COPY's thread keep the other core busy, and
        # pyarrow's own threads were no faster here, with more memory.
        self.read_options = pa_csv.ReadOptions(
            column_names=[c.name for c in columns], block_size=4 << 20, use_threads=False
        )
        self.convert_options = pa_csv.ConvertOptions(
            column_types={c.name: c.parse_type for c in columns},
            # COPY writes NULL as nothing and an empty string as "": only the first is null.
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            true_values=["t"],
            false_values=["f"],
        )
        self.worker = threading.Thread(target=self._work, name="parquet-export", daemon=True)
        self.worker.start()

    def write(self, data: bytes) -> int:
        self.parts.append(data)
        self.size += len(data)
        if len(self.parts) >= CHUNK_ROWS or self.size >= CHUNK_BYTES:
            self._hand_over()
        return len(data)

    def finish(self) -> int:
        """After COPY: the last rows written, the thread ended; the number of rows."""
        self._hand_over()
        self.close()
        if self.error is not None:
            raise self.error
        return self.rows

    def close(self) -> None:
        """End the thread (it drains what is queued, so this never waits on a full queue)."""
        if self.worker.is_alive():
            self.chunks.put(None)
            self.worker.join()

    def _hand_over(self) -> None:
        if self.error is not None:
            raise self.error  # out of write(): psycopg2 ends the COPY with it
        if self.parts:
            self.chunks.put(b"".join(self.parts))
            self.parts, self.size = [], 0

    def _work(self) -> None:
        while (chunk := self.chunks.get()) is not None:
            if self.error is None:
                try:
                    self._add(chunk)
                except BaseException as exc:  # handed to the COPY's thread, raised there
                    self.error = exc
        if self.error is None:
            try:
                self._write_group()
            except BaseException as exc:
                self.error = exc

    def _add(self, chunk: bytes) -> None:
        try:
            parsed = pa_csv.read_csv(
                pa.BufferReader(pa.py_buffer(chunk)),
                read_options=self.read_options,
                convert_options=self.convert_options,
            )
        except pa.ArrowInvalid as exc:
            raise ExportError(self._explain(str(exc))) from None
        arrays = []
        for column, chunked in zip(self.columns, parsed.columns):
            wanted = column.arrow_type
            if wanted == _JSON:
                chunked = pa.chunked_array(
                    [pa.ExtensionArray.from_storage(_JSON, part) for part in chunked.chunks], type=_JSON
                )
            elif chunked.type != wanted:
                chunked = chunked.cast(wanted)  # naive UTC -> UTC: only the type changes
            arrays.append(chunked)
        self.group.append(pa.Table.from_arrays(arrays, schema=self.schema))
        self.rows += parsed.num_rows
        if (
            sum(t.num_rows for t in self.group) >= ROW_GROUP_ROWS
            or sum(t.nbytes for t in self.group) >= ROW_GROUP_BYTES
        ):
            self._write_group()
        self.on_rows(self.rows)

    def _write_group(self) -> None:
        if self.group:
            table = pa.concat_tables(self.group)
            self.group = []
            self.writer.write_table(table, row_group_size=table.num_rows)

    def _explain(self, message: str) -> str:
        found = _CSV_COLUMN.search(message)
        if not found:
            return message.splitlines()[0]
        column = self.columns[int(found.group(1))]
        detail = found.group(2).splitlines()[0]
        return (
            f"column {column.name} ({column.data_type}): {detail}; Parquet's {column.arrow_type} cannot hold it "
            "(leave such rows out with --where, or export to .csv)"
        )


def export(
    conn: Any,
    table: str,
    columns: list[Column],
    where: sql.Composable | None,
    path: str,
    on_rows: Callable[[int], None] = lambda _rows: None,
) -> int:
    """Write the rows of *table* (that match *where*) to the Parquet file *path*; the number of
    rows. *on_rows* is called with the running count after each chunk of rows (from another thread). psycopg2 errors (a
    bad condition) and :class:`ExportError` come out as they are, with no file written."""
    query = sql.SQL("COPY (SELECT {} FROM {}{}) TO STDOUT WITH (FORMAT csv)").format(
        sql.SQL(", ").join(c.select_expression() for c in columns),
        sql.Identifier(table),
        sql.SQL(" WHERE ") + where if where is not None else sql.SQL(""),
    )
    folder, name = os.path.split(os.path.abspath(path))
    partial = os.path.join(folder, f".{name}.{os.getpid()}.partial")
    try:
        with conn.cursor() as cur:
            # Output formats only (the dates of a --where keep the session's reading of them):
            # ISO dates and the shortest text that reads back as the same float.
            cur.execute("SET LOCAL DateStyle = 'ISO'; SET LOCAL extra_float_digits = 1")
            with pq.ParquetWriter(partial, schema(columns), compression="zstd") as writer:
                pipeline = _Pipeline(columns, writer, on_rows)
                try:
                    cur.copy_expert(query, pipeline)
                    rows = pipeline.finish()
                finally:
                    pipeline.close()
        conn.rollback()  # read only: end the transaction the SET LOCALs lived in
        os.replace(partial, path)
        return rows
    except BaseException:
        if os.path.exists(partial):
            os.unlink(partial)
        raise
