"""``scrapy export TABLE -o FILE [--where SQL] [--since WHEN]``: rows of a table to a file.

The format follows the file's extension: ``.csv`` (with a header), ``.jsonl`` (one object per
line), ``.json`` (one array) or ``.parquet`` (typed columns, see ``storage.parquet_export``);
``-o -`` writes JSON lines to standard output. Rows are streamed (through a server-side cursor,
or ``COPY`` for Parquet), so a table of any size is exported in constant memory; a progress line
goes to stderr every ``--progress`` seconds (5). ``--since`` keeps rows changed since a time
(``updated_at``, or ``last_seen`` for a table without it): an ISO date or time (``2026-11-30``,
``2026-11-30T12:00Z``) or an age (``90m``, ``6h``, ``2d``). ``--where`` adds any SQL condition on
the table's columns.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import time
from argparse import ArgumentParser, Namespace
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from datetime import date, datetime
from decimal import Decimal
from typing import Any, TextIO

import psycopg2
from psycopg2 import sql
from scrapy.commands import ScrapyCommand

from ..runtime.secrets import redact
from . import backends_or_report, report_error

FORMATS = ("csv", "jsonl", "json", "parquet")
BATCH = 2000
PROGRESS_EVERY = 5.0  # seconds between progress lines on stderr
_AGE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)  # exact: a float would round prices
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return value


def _cell(value: Any) -> Any:
    value = _plain(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return "" if value is None else value


class Progress:
    """``export: 1,200,000 rows (240,000/s)`` on stderr, at most every *every* seconds."""

    def __init__(self, every: float = PROGRESS_EVERY) -> None:
        self.every = every
        self.started = self.last = time.monotonic()

    def __call__(self, rows: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            print(f"export: {rows:,} rows ({rows / (now - self.started):,.0f}/s)", file=sys.stderr, flush=True)


def write_rows(
    out: TextIO, fmt: str, columns: list[str], rows: Iterator[tuple], on_rows: Callable[[int], None] = lambda _n: None
) -> int:
    count = 0
    if fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(v) for v in row])
            count += 1
            if count % BATCH == 0:
                on_rows(count)
        return count
    if fmt == "json":
        out.write("[")
    for row in rows:
        text = json.dumps({c: _plain(v) for c, v in zip(columns, row)}, ensure_ascii=False, default=str)
        if fmt == "json":
            out.write(("," if count else "") + "\n" + text)
        else:
            out.write(text + "\n")
        count += 1
        if count % BATCH == 0:
            on_rows(count)
    if fmt == "json":
        out.write("\n]\n")
    return count


def since_condition(value: str, column: str) -> sql.Composable:
    age = _AGE.match(value.strip())
    if age:
        amount, unit = age.groups()
        return sql.SQL("{} >= now() - {}::interval").format(
            sql.Identifier(column), sql.Literal(f"{amount} {_UNITS[unit]}")
        )
    return sql.SQL("{} >= {}::timestamptz").format(sql.Identifier(column), sql.Literal(value))


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False  # no crawl: no Scrapy banner either

    def syntax(self) -> str:
        return "TABLE -o FILE.{csv,jsonl,json,parquet} [--where SQL] [--since WHEN]"

    def short_desc(self) -> str:
        return "Export a table's rows to CSV, JSON or Parquet, streamed"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument(
            "-o", "--output", default=None, help="file to write; .csv, .jsonl, .json or .parquet; - for stdout"
        )
        parser.add_argument("--where", default=None, help="an SQL condition on the table's columns")
        parser.add_argument("--since", default=None, help="rows changed since: 2026-11-30, 2026-11-30T12:00Z, 6h, 2d")
        parser.add_argument("--progress", type=float, default=PROGRESS_EVERY, help="seconds between progress lines")

    def run(self, args: list[str], opts: Namespace) -> None:
        if len(args) != 1:
            return report_error(self, "usage: scrapy export TABLE -o FILE.{csv,jsonl,json,parquet}")
        if not opts.output:
            return report_error(self, "export: -o FILE is required (.csv, .jsonl, .json or .parquet; - for stdout)")
        fmt = "jsonl" if opts.output == "-" else opts.output.rsplit(".", 1)[-1].lower()
        if fmt not in FORMATS:
            return report_error(self, f"export: -o {opts.output}: the file must end in .csv, .jsonl, .json or .parquet")
        folder = os.path.dirname(os.path.abspath(opts.output))
        if opts.output != "-" and not os.path.isdir(folder):
            return report_error(self, f"export: -o {opts.output}: no folder {folder}")
        found = backends_or_report(self, need_redis=False)
        if found is None:
            return
        table = args[0]
        conn = psycopg2.connect(found.database_url)
        try:
            columns = self._columns(conn, table)
            if not columns:
                return report_error(self, f"export: no table {table!r} (tables: {', '.join(self._tables(conn))})")
            conditions: list[sql.Composable] = []
            if opts.since:
                since_column = "updated_at" if "updated_at" in columns else "last_seen"
                if since_column not in columns:
                    return report_error(self, f"export: --since: table {table!r} has no updated_at or last_seen column")
                conditions.append(since_condition(opts.since, since_column))
            if opts.where:
                conditions.append(sql.SQL("({})").format(sql.SQL(opts.where)))
            where = sql.SQL(" AND ").join(conditions) if conditions else None
            progress = Progress(opts.progress)
            # pyarrow only for a Parquet export: every scrapy command (a crawl too) loads this module.
            parquet_export: Any = None
            export_errors: tuple[type[Exception], ...] = ()
            if fmt == "parquet":
                from ..storage import parquet_export

                export_errors = (parquet_export.ExportError,)
            try:
                if fmt == "parquet":
                    typed = parquet_export.table_columns(conn, table)
                    count = parquet_export.export(conn, table, typed, where, opts.output, progress)
                else:
                    count = self._write(conn, table, columns, where, fmt, opts.output, progress)
            except psycopg2.Error as exc:
                option = "--since" if opts.since and "timestamp" in str(exc) else "--where" if opts.where else "query"
                message = getattr(exc.diag, "message_primary", None) or str(exc).splitlines()[0]
                return report_error(self, f"export: {option}: {redact(message)}")
            except export_errors as exc:
                return report_error(self, f"export: {exc}", status=1)
            except OSError as exc:
                return report_error(self, f"export: -o {opts.output}: {exc.strerror or exc}", status=1)
        finally:
            conn.close()
        took = time.monotonic() - progress.started
        print(
            f"exported {count} row(s) from {table} to {opts.output} ({took:.1f} s, {count / max(took, 1e-6):,.0f}/s)",
            file=sys.stderr,
        )

    @staticmethod
    def _write(
        conn: Any,
        table: str,
        columns: list[str],
        where: sql.Composable | None,
        fmt: str,
        output: str,
        progress: Callable[[int], None],
    ) -> int:
        query = sql.SQL("SELECT {} FROM {}{}").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in columns),
            sql.Identifier(table),
            sql.SQL(" WHERE ") + where if where is not None else sql.SQL(""),
        )
        # A named cursor lives on the server: rows arrive BATCH at a time, never all at once.
        with conn.cursor(name="scraper_export") as cursor:
            cursor.itersize = BATCH
            cursor.execute(query)
            target = nullcontext(sys.stdout) if output == "-" else open(output, "w", encoding="utf-8", newline="")
            with target as out:
                return write_rows(out, fmt, columns, iter(cursor), progress)

    @staticmethod
    def _columns(conn: Any, table: str) -> list[str]:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
                (table,),
            )
            return [name for (name,) in cur.fetchall()]

    @staticmethod
    def _tables(conn: Any) -> list[str]:
        with conn.cursor() as cur:
            # Partitions (a month of item_changes) are read through their table, not named.
            cur.execute(
                "SELECT c.relname FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace"
                " AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND NOT c.relispartition ORDER BY 1"
            )
            return [name for (name,) in cur.fetchall()]
