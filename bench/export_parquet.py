"""``scrapy export`` from Postgres: rows/s to Parquet, and to CSV for comparison.

    .venv/bin/python bench/export_parquet.py [--rows N] [--runs K]

Works in a database of its own (``scraper_bench_export``, made and dropped on the server of
``BENCH_DATABASE_URL``, default ``postgresql://postgres@127.0.0.1:5432/``): a ``products`` table
made by the project's own migration, filled with N rows (default 200,000) by ``generate_series``
(titles and descriptions with some non-ASCII, prices with four decimals, a few NULLs). Each run is
``scrapy export products -o FILE`` as a process, the way a user runs it. Two figures per run:
the command's own rows/s (query to file closed, as its last line reports it) and end to end
(N over the process' wall time, Python's and Scrapy's start included). Median of K runs each;
the Parquet file is then read back with duckdb and its row count and price sum checked. Also
printed: each process' peak RSS (constant memory shows as the same peak for 200,000 rows and for
1,000,000) and the file's row groups.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import psycopg2
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scratch import drop_database, scratch_database  # noqa: E402

from scraper.items.product import ProductItem  # noqa: E402
from scraper.storage import schema  # noqa: E402

DATABASE = "scraper_bench_export"
FILL = """
INSERT INTO products (source, sku, title, price, price_high, currency, url, brand, description,
                      category, availability, image, released_at, content_hash, first_seen,
                      last_seen, updated_at, gone_at, spider)
SELECT 'demo', format('SKU-%s', lpad(i::text, 8, '0')),
       format('Produit n°%s — Kaffeemühle «deluxe» %s', i, md5(i::text)),
       round((i % 100000) / 100.0 + 0.0099, 4),
       CASE WHEN i % 7 = 0 THEN round((i % 100000) / 50.0, 4) END,
       (ARRAY['EUR', 'USD', 'JPY', 'GBP'])[1 + i % 4],
       format('https://shop.example/p/%s.html', i),
       CASE WHEN i % 5 <> 0 THEN format('Brand %s', i % 300) END,
       repeat(md5(i::text) || ' ', 4) || 'Größe: 42 cm; «très» bien',
       format('Category %s/Sub %s', i % 40, i % 11),
       CASE WHEN i % 3 = 0 THEN 'OutOfStock' ELSE 'InStock' END,
       format('https://shop.example/img/%s.jpg', i),
       timestamptz '2020-01-01 00:00:00+00' + i * interval '37 minutes 13.25 seconds',
       md5(i::text || 'h'),
       now() - interval '30 days', now(), now() - (i % 1000) * interval '1 minute',
       CASE WHEN i % 50 = 0 THEN now() END, 'demo'
FROM generate_series(1, {rows}) AS i
"""


def fill(dsn: str, n: int) -> None:
    conn = psycopg2.connect(dsn)
    schema.migrate(conn, [ProductItem])
    with conn, conn.cursor() as cur:
        cur.execute(FILL.replace("{rows}", str(int(n))))  # no parameters: the % in the SQL stay as they are
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("VACUUM ANALYZE products")  # visibility map set: no hint-bit writes on the first read
    conn.close()


def export(dsn: str, path: str) -> tuple[float, float, int, float]:
    """(the command's own rows/s, wall seconds of the process, rows, its peak RSS in MiB) of one
    export."""
    env = {**os.environ, "DATABASE_URL": dsn, "REDIS_URL": "", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "scrapy", "export", "products", "-o", path],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        _, status, usage = os.wait4(proc.pid, 0)  # wait4: this child's own peak RSS
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read()
    assert proc.returncode == 0, stderr[-2000:]
    found = re.search(r"exported (\d+) row\(s\) .* \(([\d.]+) s, ([\d,]+)/s\)", stderr)
    assert found, stderr[-2000:]
    return float(found.group(3).replace(",", "")), wall, int(found.group(1)), usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    base = os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/")
    dsn = scratch_database(base, DATABASE)
    results: dict[str, object] = {
        "rows": args.rows,
        "at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
    }
    try:
        started = time.perf_counter()
        fill(dsn, args.rows)
        results["fill_s"] = round(time.perf_counter() - started, 1)
        with tempfile.TemporaryDirectory() as folder:
            for fmt in ("parquet", "csv"):
                path = os.path.join(folder, f"products.{fmt}")
                runs = [export(dsn, path) for _ in range(args.runs)]
                assert all(rows == args.rows for _, _, rows, _ in runs), runs
                own = statistics.median(rate for rate, _, _, _ in runs)
                wall = statistics.median(wall for _, wall, _, _ in runs)
                results[fmt] = {
                    "rows_per_s": round(own),
                    "rows_per_s_each_run": [round(rate) for rate, _, _, _ in runs],
                    "end_to_end_rows_per_s": round(args.rows / wall),
                    "wall_s": round(wall, 2),
                    "peak_rss_mib": round(max(rss for _, _, _, rss in runs)),
                    "file_mib": round(os.path.getsize(path) / 2**20, 1),
                }
            row_groups = pq.read_metadata(os.path.join(folder, "products.parquet")).num_row_groups
            results["parquet_row_groups"] = row_groups  # streamed: one per 131,072 rows, not one file-wide
            count, total = duckdb.sql(f"SELECT count(*), sum(price) FROM '{folder}/products.parquet'").fetchall()[0]
            conn = psycopg2.connect(dsn)
            with conn.cursor() as cur:
                cur.execute("SELECT count(*), sum(price) FROM products")
                assert (count, total) == cur.fetchone(), (count, total)
            conn.close()
        results["load_average_after"] = os.getloadavg()[0]
    finally:
        drop_database(base, DATABASE)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
