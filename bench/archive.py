"""The archive's cost, in one run: bytes per page (with and without revisit dedupe), crawl
pages/s with and without the archive, and reprocess pages/s against the live crawl's.

    REDIS_URL=... DATABASE_URL=... .venv/bin/python bench/archive.py [PRODUCTS]

Uses Redis database 7 and a Postgres database ``bench_archive`` (both emptied first).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from scraper.demo_site import Catalog, DemoSite  # noqa: E402

# The bench site listens on loopback, which crawl nodes refuse to fetch unless allowed.
os.environ.setdefault("FETCH_ALLOW_NETWORKS", "127.0.0.0/8")
# Its crawls share a Redis, which requires a fleet secret to sign queue entries with.
os.environ.setdefault("SCHEDULER_SECRET", "bench-fleet-secret-0123456789")


def run(env: dict[str, str], *args: str) -> float:
    out = subprocess.run([sys.executable, "-m", "scrapy", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    match = re.search(r"Crawl summary \(finished\): (\d+) pages.*in ([\d.]+) s", out.stderr)
    return int(match.group(1)) / float(match.group(2))


def main() -> None:
    products = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    parts = urlsplit(os.environ["DATABASE_URL"])
    admin = psycopg2.connect(os.environ["DATABASE_URL"])
    admin.autocommit = True
    db = urlunsplit((parts.scheme, parts.netloc, "/bench_archive", parts.query, ""))
    redis_url = urlunsplit((*urlsplit(os.environ["REDIS_URL"])[:2], "/7", "", ""))
    archive = tempfile.mkdtemp(prefix="bench-archive-")

    def fresh() -> None:
        with admin.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS bench_archive WITH (FORCE)")
            cur.execute("CREATE DATABASE bench_archive")
        redis.Redis.from_url(redis_url).flushdb()

    with DemoSite(Catalog(products=products)) as site:
        env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "DATABASE_URL": db,
            "DEMO_SITE_URL": site.url,
            "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
            "SCHEDULER_IDLE_TIMEOUT": "1",
            "METRICS_ENABLED": "false",
            "PYTHONPATH": str(ROOT),
        }
        fresh()
        plain = run(env, "crawl", "demo")
        fresh()
        archived = run({**env, "ARCHIVE_URL": archive}, "crawl", "demo")
    conn = psycopg2.connect(db)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT count(*), sum(record_length), sum(CASE WHEN record_type = 'revisit' THEN payload_length"
            " ELSE record_length END), count(*) FILTER (WHERE record_type = 'revisit') FROM archive_index"
        )
        pages, stored, undeduped, revisits = cur.fetchone()
    conn.close()
    replay = run({**env, "ARCHIVE_URL": archive}, "reprocess", "demo")
    print(f"demo shop, {products} products, {pages} pages archived ({revisits} revisits)")
    print(f"archive bytes per page: {stored / pages:.0f} with revisit dedupe, {undeduped / pages:.0f} without")
    print(f"crawl: {plain:.0f} pages/s without the archive, {archived:.0f} with it ({archived / plain:.2f}x)")
    print(f"reprocess: {replay:.0f} pages/s, {replay / archived:.1f}x the live crawl's")


if __name__ == "__main__":
    main()
