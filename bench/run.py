"""Benchmarks, in one run, as ratios: `make bench` (or `.venv/bin/python bench/run.py`).

1. Crawl throughput on the demo shop (>= 5,000 pages), the same spider both times:
   (a) plain Scrapy: memory scheduler, no item pipelines (items dropped);
   (b) the whole pipeline: shared Redis scheduler + clean/validate/dedupe/store into Postgres.
   Prints pages/s, CPU per page and peak memory of each, and the ratio (b)/(a).
2. Scaling out through the scraping API: the demo shop crawled through the local API stand-in
   with 200 ms added per page, by 1, 2 and 4 worker processes sharing one queue; pages/s and the
   ratio to one process.
   The pipeline is also run with at-least-once delivery off (``SCHEDULER_LEASE_TIMEOUT=0``):
   the cost of leases is the ratio of the two.
2a. The scraping-API path's own cost: the same shop (0 ms per page) crawled through the whole
   pipeline directly and through the local stand-in (0 ms added); CPU ms per page of the crawler
   process (the stand-in's own CPU is not counted) and the difference.
2b. Redelivery: a worker holding leases is SIGKILLed; a fresh worker starts at once. Prints how
   long until the first of the dead worker's requests is back in the queue and until all of them
   have been fetched again (bounded by the lease timeout plus one reaping tick).
3. Upsert throughput on the same Postgres, against two baselines: a plain COPY into an indexed
   table (the bulk-load limit) and the textbook bulk upsert (COPY everything into a staging
   table, one ``INSERT … SELECT … ON CONFLICT DO UPDATE``). Ours runs in batches as the crawl
   does, with the content-hash skip; it is measured on new rows and on the same rows again.

4. The dupefilter's memory per URL, set vs Bloom filter, for ``--dupefilter-urls`` (1M) URLs
   (see ``bench/dupefilter_memory.py``).

Uses REDIS_URL / DATABASE_URL when set, the embedded servers otherwise. It writes only to
Redis database 7 and a Postgres database ``scraper_bench``, which it recreates.
"""

from __future__ import annotations

import argparse
import io
import json
import signal
import urllib.request
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import psycopg2  # noqa: E402
import redis  # noqa: E402
from scrapy.settings import Settings  # noqa: E402

from scraper import backends  # noqa: E402
from scraper.storage.upsert import Row, TableUpserter, copy_line  # noqa: E402

BENCH_DB = "scraper_bench"

PLAIN = [
    "-s", "SCHEDULER=scrapy.core.scheduler.Scheduler",
    "-s", "DUPEFILTER_CLASS=scrapy.dupefilters.RFPDupeFilter",
    "-s", "ITEM_PIPELINES={}",
    "-s", "ADDONS={}",
    "-s", "EXTENSIONS={}",
    "-s", "SPIDER_MIDDLEWARES={}",
]


def start_site(products: int, delay_ms: int = 0) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "scraper.demo_site", "--port", "0", "--products", str(products),
         "--delay-ms", str(delay_ms)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    line = proc.stdout.readline()
    match = re.search(r"(http://\S+/)", line)
    if not match:
        proc.kill()
        raise SystemExit(f"demo site did not start: {line!r}")
    return proc, match.group(1)


def start_standin(key: str, delay_ms: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scraper.scraping_api.standin", "--port", str(port), "--delay-ms", str(delay_ms)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "SCRAPING_API_STANDIN_KEY": key},  # never on the command line: ps shows it
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the scraping-API stand-in did not start")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_STAT_TIME = r"'{name}': datetime\.datetime\((\d+), (\d+), (\d+), (\d+), (\d+), (\d+)(?:, (\d+))?"


def _stat_time(log: str, name: str) -> float:
    match = re.search(_STAT_TIME.format(name=name), log)
    parts = [int(p or 0) for p in match.groups()]
    when = datetime(*parts[:6], parts[6], tzinfo=timezone.utc)
    return when.timestamp()


def api_scaling(products: int, redis_url: str, dsn: str, delay_ms: int = 200) -> list[tuple[int, float, float]]:
    """(workers, pages, pages/s) crawling through the stand-in with *delay_ms* per page."""
    site, url = start_site(products)
    key = "bench-key"
    api, api_url = start_standin(key, delay_ms)
    results = []
    try:
        for workers in (1, 2, 4):
            redis.Redis.from_url(redis_url).flushdb()
            env = {**os.environ, "PYTHONPATH": str(ROOT), "DEMO_SITE_URL": url, "REDIS_URL": redis_url,
                   "DATABASE_URL": dsn, "SCHEDULER_IDLE_TIMEOUT": "3", "SCRAPING_API_KEY": key,
                   "SCRAPING_API_URL": api_url, "METRICS_ENABLED": "false"}
            logs = [tempfile.TemporaryFile("w+") for _ in range(workers)]
            procs = [subprocess.Popen([sys.executable, "-m", "scrapy", "crawl", "demo"], cwd=ROOT, env=env,
                                      stdout=subprocess.DEVNULL, stderr=log, text=True) for log in logs]
            texts = []
            for proc, log in zip(procs, logs):
                proc.wait()
                log.seek(0)
                texts.append(log.read())
                if proc.returncode != 0:
                    sys.stderr.write(texts[-1][-3000:])
                    raise SystemExit("crawl through the API failed")
            pages = sum(float(re.search(r"'response_received_count': (\d+)", t).group(1)) for t in texts)
            # From the first worker's start to the last response, less the idle wait at the end.
            span = max(_stat_time(t, "finish_time") for t in texts) - min(_stat_time(t, "start_time") for t in texts)
            results.append((workers, pages, pages / max(0.001, span - 3.0)))
            print(f"  {workers} worker(s): {pages:.0f} pages, {results[-1][2]:.1f} pages/s", flush=True)
    finally:
        for proc in (site, api):
            proc.terminate()
            proc.wait()
    return results


def api_overhead(products: int, redis_url: str, dsn: str) -> dict[str, dict[str, float]]:
    """The crawler's CPU per page fetching directly vs through the stand-in, at 0 ms latency."""
    site, url = start_site(products)
    key = "bench-key-overhead"
    api, api_url = start_standin(key, 0)
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DEMO_SITE_URL": url, "REDIS_URL": redis_url,
               "DATABASE_URL": dsn, "SCHEDULER_IDLE_TIMEOUT": "0", "METRICS_ENABLED": "false"}
        out = {}
        for name, extra in (("direct", {}), ("api", {"SCRAPING_API_KEY": key, "SCRAPING_API_URL": api_url})):
            redis.Redis.from_url(redis_url).flushdb()
            drop_tables(dsn)
            out[name] = crawl({**env, **extra}, [])
        return out
    finally:
        for proc in (site, api):
            proc.terminate()
            proc.wait()


def crawl(env: dict[str, str], extra: list[str]) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "scrapy", "crawl", "demo", "-s", "LOG_LEVEL=INFO", *extra],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True,
        )
        peak = 0
        watched = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                peak = max(peak, watched.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.1)
        log.seek(0)
        stderr = log.read()
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.stderr.write(stderr[-4000:])
        raise SystemExit("crawl failed")
    result = subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)
    stat = lambda name: float(re.search(rf"'{name}': ([\d.]+)", result.stderr).group(1))  # noqa: E731
    pages = stat("response_received_count")
    elapsed = stat("elapsed_time_seconds")
    items = re.search(r"'item_scraped_count': (\d+)", result.stderr)
    return {
        "pages": pages,
        "items": float(items.group(1)) if items else 0.0,
        "elapsed": elapsed,
        "wall": wall,
        "pages_per_s": pages / elapsed,
        "cpu_ms_per_page": 1000 * ((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)) / pages,
        "peak_rss_mb": peak / 2**20,
    }


def drop_tables(dsn: str) -> None:
    """Start a crawl on empty tables, so that each variant inserts the same rows."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS products, rejects")
    conn.close()


def site_counts(url: str) -> dict[str, int]:
    with urllib.request.urlopen(url + "_admin/stats", timeout=10) as answer:
        return json.load(answer)["requests"]


def redelivery(redis_url: str, dsn: str, lease: float, products: int = 400) -> dict[str, float]:
    """Kill a lone worker mid-crawl, start another; time the return of the dead one's requests."""
    server = redis.Redis.from_url(redis_url)
    server.flushdb()
    drop_tables(dsn)
    site, url = start_site(products, 100)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DEMO_SITE_URL": url, "REDIS_URL": redis_url,
           "DATABASE_URL": dsn, "SCHEDULER_IDLE_TIMEOUT": "3", "SCHEDULER_LEASE_TIMEOUT": str(lease),
           "CONCURRENT_REQUESTS": "8", "METRICS_ENABLED": "false"}
    command = [sys.executable, "-m", "scrapy", "crawl", "demo"]
    victim = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    successor = None
    try:
        while sum(site_counts(url).values()) < 60:
            time.sleep(0.1)
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        victim.wait()
        held = {lease_id: json.loads(value.split(b"|", 1)[1])["url"]
                for lease_id, value in server.hgetall("demo:leased").items()}
        # A redelivered request is leased again under the same id, with a new deadline.
        deadlines = {lease_id: server.zscore("demo:lease_deadlines", lease_id) for lease_id in held}
        fetched = site_counts(url)
        paths = ["/" + u.split("/", 3)[3] for u in held.values()]
        successor = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        requeued = refetched = None
        while refetched is None and time.monotonic() - killed < lease + 120:
            time.sleep(0.05)
            if requeued is None and any(server.zscore("demo:lease_deadlines", i) != d for i, d in deadlines.items()):
                requeued = time.monotonic() - killed
            counts = site_counts(url)
            if requeued is not None and all(counts.get(p, 0) > fetched.get(p, 0) for p in paths):
                refetched = time.monotonic() - killed
        successor.wait(timeout=300)
    finally:
        for proc in (victim, successor, site):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait()
    if requeued is None or refetched is None:
        raise SystemExit("the killed worker's requests were not redelivered")
    return {"held": float(len(held)), "requeued_s": requeued, "refetched_s": refetched, "lease": lease}


def with_redis_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}?db={db}"
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, ""))


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


def recreate_database(url: str) -> str:
    admin = psycopg2.connect(url)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {BENCH_DB}")
    admin.close()
    return with_database(url, BENCH_DB)


def upsert_bench(dsn: str, rows: int, batch: int) -> dict[str, float]:
    columns = {"source": "text", "sku": "text", "title": "text", "price": "numeric(14,2)", "currency": "text",
               "url": "text", "brand": "text", "description": "text"}
    data = [
        {"source": "bench", "sku": f"SKU-{i:08d}", "title": f"Product {i}", "price": Decimal(i % 5000) / 7,
         "currency": "EUR", "url": f"http://shop.example/p/{i}", "brand": f"Brand {i % 97}",
         "description": "A fine product, " * 4}
        for i in range(rows)
    ]
    for d in data:
        d["price"] = d["price"].quantize(Decimal("0.01"))
    conn = psycopg2.connect(dsn)
    cols_sql = ", ".join(f"{c} {t}" for c, t in columns.items())
    with conn, conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS bench_copy, bench_reference, bench_upsert")
        cur.execute(f"CREATE TABLE bench_copy ({cols_sql}, PRIMARY KEY (source, sku))")
        cur.execute(f"CREATE TABLE bench_reference ({cols_sql}, PRIMARY KEY (source, sku))")
        cur.execute(f"CREATE TABLE bench_upsert ({cols_sql}, content_hash text NOT NULL,"
                    " first_seen timestamptz NOT NULL DEFAULT now(), last_seen timestamptz NOT NULL DEFAULT now(),"
                    " updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (source, sku))")
    names = ", ".join(columns)

    def text() -> io.StringIO:
        return io.StringIO("".join(copy_line([d[c] for c in columns]) + "\n" for d in data))

    # The bulk-load limit: one COPY of every row into an indexed table, no conflict handling.
    started = time.monotonic()
    with conn, conn.cursor() as cur:
        cur.copy_expert(f"COPY bench_copy ({names}) FROM STDIN", text())
    copy_rate = rows / (time.monotonic() - started)

    # The textbook bulk upsert, in one statement for all rows.
    started = time.monotonic()
    with conn, conn.cursor() as cur:
        cur.execute("CREATE TEMP TABLE bench_stage (LIKE bench_reference) ON COMMIT DROP")
        cur.copy_expert(f"COPY bench_stage ({names}) FROM STDIN", text())
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in ("source", "sku"))
        cur.execute(f"INSERT INTO bench_reference ({names}) SELECT {names} FROM bench_stage"
                    f" ON CONFLICT (source, sku) DO UPDATE SET {updates}")
    reference_rate = rows / (time.monotonic() - started)

    upserter = TableUpserter("bench_upsert", list(columns), ("source", "sku"), last_seen_resolution=3600)
    prepared = [Row(key=(d["source"], d["sku"]), values=d) for d in data]

    def run() -> float:
        started = time.monotonic()
        for i in range(0, rows, batch):
            with conn, conn.cursor() as cur:
                upserter.write(cur, prepared[i : i + batch])
        return rows / (time.monotonic() - started)

    new_rate = run()
    unchanged_rate = run()
    conn.close()
    return {"copy": copy_rate, "reference": reference_rate, "upsert_new": new_rate,
            "upsert_unchanged": unchanged_rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--products", type=int, default=5000)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--api-products", type=int, default=1000)
    parser.add_argument("--dupefilter-urls", type=int, default=1_000_000)
    parser.add_argument("--latency", type=int, nargs="+", default=[0, 100],
                        help="page latencies (ms) to crawl at: 0 is CPU-bound, 100 is like a real site")
    parser.add_argument("--only", choices=["api-overhead"], default=None, help="run one part alone")
    args = parser.parse_args()

    found = backends.resolve(Settings({
        "REDIS_URL": os.environ.get("REDIS_URL", ""),
        "DATABASE_URL": os.environ.get("DATABASE_URL", ""),
        "DATA_DIR": tempfile.mkdtemp(prefix="scraper-bench-"),
    }))
    redis_url = with_redis_db(found.redis_url, 7)  # tests use 8-15
    redis.Redis.from_url(redis_url).flushdb()
    dsn = recreate_database(found.database_url)
    print(f"backends: Redis {'embedded' if found.embedded_redis else 'server'}, "
          f"Postgres {'embedded' if found.embedded_postgres else 'server'}", flush=True)

    print(f"\ncrawling {args.api_products} products (0 ms per page) through the whole pipeline, directly "
          f"and through the scraping-API stand-in (0 ms added) ...", flush=True)
    over = api_overhead(args.api_products, redis_url, dsn)
    for name, r in over.items():
        print(f"{name:8} {r['pages']:>6.0f} pages {r['pages_per_s']:>8.1f} pages/s {r['cpu_ms_per_page']:>7.2f} CPU ms/page")
    print(f"the API path costs {over['api']['cpu_ms_per_page'] - over['direct']['cpu_ms_per_page']:+.2f} CPU ms "
          f"per page in the crawler ({over['api']['cpu_ms_per_page'] / over['direct']['cpu_ms_per_page']:.2f}x)",
          flush=True)
    if args.only == "api-overhead":
        return

    for delay in args.latency:
        site, url = start_site(args.products, delay)
        try:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "DEMO_SITE_URL": url, "REDIS_URL": redis_url,
                   "DATABASE_URL": dsn, "SCHEDULER_IDLE_TIMEOUT": "0"}
            where = f"{url} ({args.products} products, {delay} ms per page)"
            print(f"\ncrawling {where} with plain Scrapy ...", flush=True)
            plain = crawl(env, PLAIN)
            print("crawling it again through the whole pipeline, without leases ...", flush=True)
            drop_tables(dsn)
            unleased = crawl(env, ["-s", "SCHEDULER_LEASE_TIMEOUT=0"])
            print("crawling it again through the whole pipeline ...", flush=True)
            drop_tables(dsn)
            full = crawl(env, [])
        finally:
            site.terminate()
            site.wait()
        print(f"{'':24}{'pages':>8}{'items':>8}{'pages/s':>10}{'CPU ms/page':>13}{'peak RSS MB':>13}")
        for name, r in (("plain Scrapy", plain), ("pipeline, no leases", unleased), ("whole pipeline", full)):
            print(f"{name:24}{r['pages']:>8.0f}{r['items']:>8.0f}{r['pages_per_s']:>10.1f}"
                  f"{r['cpu_ms_per_page']:>13.2f}{r['peak_rss_mb']:>13.0f}")
        print(f"ratio whole pipeline / plain Scrapy at {delay} ms per page: "
              f"{full['pages_per_s'] / plain['pages_per_s']:.2f}x pages/s, "
              f"{full['cpu_ms_per_page'] / plain['cpu_ms_per_page']:.2f}x CPU per page", flush=True)
        print(f"cost of at-least-once delivery at {delay} ms per page: leases / no leases "
              f"{full['pages_per_s'] / unleased['pages_per_s']:.2f}x pages/s, "
              f"{full['cpu_ms_per_page'] / unleased['cpu_ms_per_page']:.2f}x CPU per page", flush=True)

    print("\nkilling a worker that holds leases (lease timeout 10 s) and timing the redelivery ...", flush=True)
    red = redelivery(redis_url, dsn, lease=10.0)
    print(f"requests the killed worker held: {red['held']:.0f}; the first back in the queue after "
          f"{red['requeued_s']:.1f} s, all fetched again after {red['refetched_s']:.1f} s "
          f"(lease timeout {red['lease']:.0f} s)", flush=True)

    print(f"\ncrawling {args.api_products} products through the scraping-API stand-in "
          f"(+200 ms per page), 1, 2 and 4 workers sharing one queue ...", flush=True)
    scaling = api_scaling(args.api_products, redis_url, dsn)
    one = scaling[0][2]
    for workers, _pages, rate in scaling:
        print(f"{workers} worker(s): {rate:>8.1f} pages/s  ({rate / one:.2f}x one worker)")

    print(f"\nupserting {args.rows} rows in batches of {args.batch} ...", flush=True)
    up = upsert_bench(dsn, args.rows, args.batch)
    print(f"{'plain COPY (bulk-load limit)':40}{up['copy']:>10.0f} rows/s")
    print(f"{'COPY to staging + one INSERT..SELECT':40}{up['reference']:>10.0f} rows/s  "
          f"({up['reference'] / up['copy']:.2f}x COPY)")
    for label, name in (("ours, new rows", "upsert_new"), ("ours, same rows again (unchanged)", "upsert_unchanged")):
        print(f"{label:40}{up[name]:>10.0f} rows/s  ({up[name] / up['copy']:.2f}x COPY, "
              f"{up[name] / up['reference']:.2f}x the one-statement upsert)")

    print(f"\ndupefilter memory, set vs Bloom filter, {args.dupefilter_urls:,} URLs ...", flush=True)
    import dupefilter_memory

    dupefilter_memory.main(["--urls", str(args.dupefilter_urls)])


if __name__ == "__main__":
    main()
