"""Benchmarks, in one run, as ratios: `make bench` (or `.venv/bin/python bench/run.py`).

Each figure is printed and written to ``bench/results.json`` (name, value, unit and the
comparison it belongs to), so that successive runs can be compared.

* api-overhead: the scraping-API path's own CPU per page (the demo shop through the local
  stand-in at 0 ms vs directly).
* P1: the demo shop (5,000 products) crawled by plain Scrapy (memory scheduler, no item
  pipelines), by the whole pipeline without leases, and by the whole pipeline (leases and
  metrics on), with pages served instantly (CPU-bound) and at 100 ms per page; pages/s, CPU per
  page of the crawler alone and of the crawler plus Redis plus the Postgres backends it used
  (from /proc), peak RSS; ``--repeat`` times, plain Scrapy and the whole pipeline back to back in
  each run (each in turn first), and the median of the per-run ratios.
* redelivery: a worker with ``CONCURRENT_REQUESTS=8`` is SIGKILLed in a 300-product crawl at
  100 ms per page and another started: how many leases it held, how soon they came back, and
  how many pages were fetched twice by the end; with the lease cap and without.
* P3: scale-out that measures coordination: 1, 4 and 8 workers each at
  ``CONCURRENT_REQUESTS=4`` against the site at 200 ms per page, directly and through the
  stand-in; the steady rate once every worker has joined, and the CPU used meanwhile.
* P5: Redis bytes per queued and per leased request; a ``PRODUCTS`` (100,000) product crawl
  with the crawler's RSS every 10 s, and its growth after the first 10k pages.
* upsert: our batched upsert, without and with its history, against a plain COPY and the
  one-statement bulk upsert (COPY to a staging table), without and with history; ``--batch``
  sizes, ``--upsert-repeat`` times each in turn, ``--upsert-before`` an earlier upsert.py beside.
* dupefilter: Redis memory per URL, set vs Bloom filter (see ``bench/dupefilter_memory.py``).
* cluster: one Redis vs a local 3-master Redis Cluster: bytes per queued request, per seen URL
  and per lease, claims/s and pops/s with one and several client processes, Redis CPU per
  1,000 of each (see ``bench/cluster.py``).
* decoupled: ``PROCESSING=decoupled`` (1 fetcher + 1 processor) against 1 and 2 in-process
  crawlers, pages served instantly: pages/s, and CPU seconds of every process (see
  ``bench/decoupled.py``).
* reprocess: ``scrapy reprocess`` pages/s against the live crawl's, pages served instantly and at
  100 ms per page (see ``bench/reprocess.py``).
* page_states: a revisit run's time to its first request and peak RSS against the pages its
  spider knows (synthetic rows, 10k and 1M by default), beside an earlier checkout's
  (``--page-states-before``; see ``bench/page_states.py``).
* frontier_scale: Redis bytes per queued request and per seen URL (set, Bloom filter), and a
  crawl node's start, peak RSS and pages/s, against the URLs queued in its frontier (generated,
  10k and 1M by default; see ``bench/frontier_scale.py``).

Redis: a redis-server of the bench's own when this machine has one (so that its CPU is the
crawl's alone), else REDIS_URL (database 7) or the embedded one. Postgres: DATABASE_URL or the
embedded one, in a database ``scraper_bench`` (``BENCH_DATABASE``) that it recreates (only for
parts that crawl or upsert). ``--only`` runs some parts, and keeps the other parts' figures of
earlier runs in the results file.
"""

from __future__ import annotations

import argparse
import compileall
import hashlib
import io
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg2  # noqa: E402
import redis  # noqa: E402
from procs import PostgresWatch, cpu_seconds, private_redis, redis_pid, rss_bytes  # noqa: E402
from results import Results  # noqa: E402
from scrapy.settings import Settings  # noqa: E402

from scraper import backends  # noqa: E402
from scraper.queue import keys  # noqa: E402

# The bench site listens on loopback, which crawl nodes refuse to fetch unless allowed.
os.environ.setdefault("FETCH_ALLOW_NETWORKS", "127.0.0.0/8")
# Its crawls share a Redis, which requires a fleet secret to sign queue entries with.
os.environ.setdefault("SCHEDULER_SECRET", "bench-fleet-secret-0123456789")

# Recreated (DROP … WITH (FORCE)) by each run: two benches sharing a server need a name each.
BENCH_DB = os.environ.get("BENCH_DATABASE") or "scraper_bench"

PLAIN = [
    "-s",
    "SCHEDULER=scrapy.core.scheduler.Scheduler",
    "-s",
    "DUPEFILTER_CLASS=scrapy.dupefilters.RFPDupeFilter",
    "-s",
    "ITEM_PIPELINES={}",
    "-s",
    "ADDONS={}",
    "-s",
    "EXTENSIONS={}",
    "-s",
    "SPIDER_MIDDLEWARES={}",
    "-s",
    "DOWNLOAD_HANDLERS={}",
    "-s",
    "STATS_CLASS=scrapy.statscollectors.MemoryStatsCollector",
]


def start_site(products: int, delay_ms: int = 0) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scraper.demo_site",
            "--port",
            "0",
            "--products",
            str(products),
            "--delay-ms",
            str(delay_ms),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    match = re.search(r"(http://\S+/)", line)
    if not match:
        proc.kill()
        raise SystemExit(f"demo site did not start: {line!r}")
    return proc, match.group(1)


def site_pages(url: str) -> int:
    with urllib.request.urlopen(url + "_admin/catalog", timeout=10) as answer:
        summary = json.load(answer)
    return int(summary.get("pages") or summary.get("page_count") or 0)


def start_standin(key: str, delay_ms: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scraper.scraping_api.standin", "--port", str(port), "--delay-ms", str(delay_ms)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
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


def api_overhead(products: int, redis_url: str, dsn: str) -> dict[str, dict[str, float]]:
    """The crawler's CPU per page fetching directly vs through the stand-in, at 0 ms latency."""
    site, url = start_site(products)
    key = "bench-key-overhead"
    api, api_url = start_standin(key, 0)
    try:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DEMO_SITE_URL": url,
            "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
            "REDIS_URL": redis_url,
            "DATABASE_URL": dsn,
            "SCHEDULER_IDLE_TIMEOUT": "0",
            "METRICS_ENABLED": "false",
        }
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


def crawl(
    env: dict[str, str],
    extra: list[str],
    dsn: str | None = None,
    redis_server: Any = None,
    rss_every: float = 0.0,
    site_url: str | None = None,
) -> dict[str, Any]:
    """One crawl as its own process: pages, pages/s, CPU per page of the crawler alone and of
    the crawler plus the Redis server and the Postgres backends it used (from /proc), peak RSS;
    with *rss_every*, the crawler's RSS every that many seconds with the pages fetched by then."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    watch = PostgresWatch(dsn) if dsn else None
    redis_cpu0 = cpu_seconds(redis_pid(redis_server)) if redis_server is not None else None
    started = time.monotonic()
    samples: list[tuple[float, float, int]] = []
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "scrapy", "crawl", "demo", "-s", "LOG_LEVEL=INFO", *extra],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )
        peak = 0
        next_sample = started + rss_every
        while proc.poll() is None:
            rss = rss_bytes(proc.pid) or 0
            peak = max(peak, rss)
            if watch is not None:
                watch.poll([proc.pid])
            if rss_every and time.monotonic() >= next_sample and rss:
                next_sample += rss_every
                pages = sum(site_counts(site_url).values()) if site_url else 0
                samples.append((time.monotonic() - started, float(pages), rss))
            time.sleep(0.1 if not rss_every else 0.5)
        log.seek(0)
        stderr = log.read()
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    redis_cpu = (cpu_seconds(redis_pid(redis_server)) - redis_cpu0) if redis_server is not None else 0.0
    pg_cpu = watch.backends_cpu() if watch else 0.0
    pg_background = watch.background_cpu() if watch else 0.0
    if watch:
        watch.close()
    if proc.returncode != 0:
        sys.stderr.write(stderr[-4000:])
        raise SystemExit("crawl failed")
    stat = lambda name: float(re.search(rf"'{name}': ([\d.]+)", stderr).group(1))  # noqa: E731
    pages = stat("response_received_count")
    elapsed = stat("elapsed_time_seconds")
    items = re.search(r"'item_scraped_count': (\d+)", stderr)
    crawler_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {
        "pages": pages,
        "items": float(items.group(1)) if items else 0.0,
        "elapsed": elapsed,
        "wall": wall,
        "pages_per_s": pages / elapsed,
        "cpu_ms_per_page": 1000 * crawler_cpu / pages,
        "redis_ms_per_page": 1000 * redis_cpu / pages,
        "postgres_ms_per_page": 1000 * (pg_cpu + pg_background) / pages,
        "all_cpu_ms_per_page": 1000 * (crawler_cpu + redis_cpu + pg_cpu + pg_background) / pages,
        "peak_rss_mb": peak / 2**20,
        "rss_samples": samples,
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


def redelivery(
    redis_url: str, dsn: str, lease: float, products: int = 300, extra_env: dict[str, str] | None = None
) -> dict[str, float]:
    """Kill a lone worker mid-crawl, start another; time the return of the dead one's requests
    and count the pages fetched more than once by the end of the crawl (the redelivery waste)."""
    server = redis.Redis.from_url(redis_url)
    server.flushdb()
    drop_tables(dsn)
    site, url = start_site(products, 100)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DEMO_SITE_URL": url,
        "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
        "REDIS_URL": redis_url,
        "DATABASE_URL": dsn,
        "SCHEDULER_IDLE_TIMEOUT": "3",
        "SCHEDULER_LEASE_TIMEOUT": str(lease),
        "CONCURRENT_REQUESTS": "8",
        "METRICS_ENABLED": "false",
        **(extra_env or {}),
    }
    command = [sys.executable, "-m", "scrapy", "crawl", "demo"]
    victim = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    successor = None
    try:
        while sum(site_counts(url).values()) < 150:  # well into the product pages
            time.sleep(0.1)
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        victim.wait()
        lease_keys = keys.lease_keys("demo")
        held = {
            lease_id: json.loads(value.split(b"|", 1)[1])["url"]
            for lease_id, value in server.hgetall(lease_keys["leased"]).items()
        }
        # A redelivered request is leased again under the same id, with a new deadline.
        deadlines = {lease_id: server.zscore(lease_keys["deadlines"], lease_id) for lease_id in held}
        fetched = site_counts(url)
        paths = ["/" + u.split("/", 3)[3] for u in held.values()]
        successor = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        requeued = refetched = None
        while refetched is None and time.monotonic() - killed < lease + 120:
            time.sleep(0.05)
            if requeued is None and any(server.zscore(lease_keys["deadlines"], i) != d for i, d in deadlines.items()):
                requeued = time.monotonic() - killed
            counts = site_counts(url)
            if requeued is not None and all(counts.get(p, 0) > fetched.get(p, 0) for p in paths):
                refetched = time.monotonic() - killed
        successor.wait(timeout=300)
        final = site_counts(url)
    finally:
        for proc in (victim, successor, site):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait()
    if requeued is None or refetched is None:
        raise SystemExit("the killed worker's requests were not redelivered")
    # Pages the dead worker had fetched whose work was lost with it: fetched again.
    redundant = sum(c - 1 for path, c in final.items() if c > 1 and path != "/robots.txt")
    # A product page is /c/<category>/p/<id>.html as listings link it, or its canonical /p/<id>.html.
    products_redundant = sum(c - 1 for path, c in final.items() if c > 1 and "/p/" in path)
    return {
        "held": float(len(held)),
        "requeued_s": requeued,
        "refetched_s": refetched,
        "lease": lease,
        "redundant": float(redundant),
        "redundant_products": float(products_redundant),
        "held_fetched": float(sum(1 for p in paths if fetched.get(p, 0) > 0)),
    }


def redis_memory(redis_url: str, count: int = 10_000) -> dict[str, float]:
    """Redis bytes per queued request and per leased one: *count* demo requests queued through
    the scheduler's own staging (claim and queue, one script each), then all leased."""
    import scrapy
    from dupefilter_memory import used_memory

    from scraper.queue.dupefilter import SeenSet, SharedDupeFilter
    from scraper.queue.leases import Leases
    from scraper.queue.queues import PriorityQueue
    from scraper.spiders.demo import DemoSpider

    server = redis.Redis.from_url(redis_url)
    server.flushdb()
    spider = DemoSpider()
    queue = PriorityQueue(server, spider, "bench:requests")
    seen = SharedDupeFilter(server, "bench:seen", None, store=SeenSet(server, "bench:seen"))
    base, _ = used_memory(server)
    seen_only = base
    for start in range(0, count, 1000):
        for i in range(start, min(count, start + 1000)):
            request = scrapy.Request(f"http://127.0.0.1:8765/p/{i}.html", callback=spider.parse_product)
            queue.stage(request, seen, hashlib.sha1(request.url.encode()).hexdigest())
        queue.flush_staged()
    queued, _ = used_memory(server)
    seen_bytes = server.memory_usage("bench:seen", samples=0) or 0
    seen_only = queued - seen_bytes
    leases = Leases(server, "bench", "bench:requests", "bench:dead", ttl=60)
    while leases.take(500):
        pass
    leased, _ = used_memory(server)
    server.flushdb()
    return {
        "queued_bytes": (seen_only - base) / count,
        "leased_bytes": (leased - seen_bytes - base) / count,
        "seen_bytes": seen_bytes / count,
    }


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


# COPY's text format: \N is NULL; backslash, tab, newline and CR are escaped; NUL cannot be
# stored in Postgres text at all and is dropped.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\x00": ""})


def copy_line(values: list[Any]) -> str:
    return "\t".join(
        ["\\N" if v is None else (v if type(v) is str else str(v)).translate(_COPY_ESCAPES) for v in values]
    )


def _backend_cpu(conn: Any) -> float | None:
    """CPU seconds of *conn*'s Postgres backend so far, when it runs on this machine."""
    try:
        fields = Path(f"/proc/{conn.get_backend_pid()}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load_upsert(path: Path) -> Any:
    """An earlier upsert.py (``git show REV:scraper/storage/upsert.py``), importable beside ours."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("scraper.storage._upsert_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def upsert_bench(
    dsn: str, rows: int, batch: int, repeat: int = 1, before: Path | None = None
) -> dict[str, dict[str, float]]:
    """Rows/s of each way to write *rows* products, *repeat* times each way in turn (medians),
    each into a table made anew: a plain COPY, the textbook bulk upsert (COPY to a staging
    table, one INSERT … SELECT … ON CONFLICT for every row, with and without its history), and
    ours in batches of *batch* rows, one transaction each, new rows then the same rows again
    (unchanged): without history, and with it as the writer runs it (history kept in
    ``item_changes`` in the same transaction). For ours, also CPU per row of this process and
    of its Postgres backend; with *before*, an earlier upsert.py measured the same way."""
    from scraper.storage import history
    from scraper.storage import upsert as ours

    columns = {
        "source": "text",
        "sku": "text",
        "title": "text",
        "price": "numeric(14,2)",
        "currency": "text",
        "url": "text",
        "brand": "text",
        "description": "text",
    }
    data = [
        {
            "source": "bench",
            "sku": f"SKU-{i:08d}",
            "title": f"Product {i}",
            "price": Decimal(i % 5000) / 7,
            "currency": "EUR",
            "url": f"http://shop.example/p/{i}",
            "brand": f"Brand {i % 97}",
            "description": "A fine product, " * 4,
        }
        for i in range(rows)
    ]
    for d in data:
        d["price"] = d["price"].quantize(Decimal("0.01"))
    cols_sql = ", ".join(f"{c} {t}" for c, t in columns.items())
    names = ", ".join(columns)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in ("source", "sku"))
    entry = "jsonb_build_object(" + ", ".join(f"'{c}', jsonb_build_array(NULL, m.{c})" for c in columns) + ")"
    context = history.Context("bench", 1, "crawl")
    conn = psycopg2.connect(dsn)

    def fresh() -> None:
        with conn, conn.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS bench_copy, bench_reference, bench_upsert, item_changes")
            cur.execute(f"CREATE TABLE bench_copy ({cols_sql}, PRIMARY KEY (source, sku))")
            cur.execute(f"CREATE TABLE bench_reference ({cols_sql}, PRIMARY KEY (source, sku))")
            cur.execute(
                f"CREATE TABLE bench_upsert ({cols_sql}, content_hash text NOT NULL,"
                " first_seen timestamptz NOT NULL DEFAULT now(), last_seen timestamptz NOT NULL DEFAULT now(),"
                " updated_at timestamptz NOT NULL DEFAULT now(), gone_at timestamptz, spider text,"
                " PRIMARY KEY (source, sku))"
            )
            history.ensure(cur)

    def text() -> io.StringIO:
        return io.StringIO("".join(copy_line([d[c] for c in columns]) + "\n" for d in data))

    def copy() -> float:
        # The bulk-load limit: one COPY of every row into an indexed table, no conflict handling.
        fresh()
        started = time.monotonic()
        with conn, conn.cursor() as cur:
            cur.copy_expert(f"COPY bench_copy ({names}) FROM STDIN", text())
        return rows / (time.monotonic() - started)

    def reference(with_history: bool) -> float:
        # The textbook bulk upsert, in one statement for all rows; with history, the same
        # statement also writes each insert's entry (its columns as [null, value]).
        fresh()
        started = time.monotonic()
        with conn, conn.cursor() as cur:
            cur.execute("CREATE TEMP TABLE bench_stage (LIKE bench_reference) ON COMMIT DROP")
            cur.copy_expert(f"COPY bench_stage ({names}) FROM STDIN", text())
            merge = (
                f"INSERT INTO bench_reference ({names}) SELECT {names} FROM bench_stage"
                f" ON CONFLICT (source, sku) DO UPDATE SET {updates}"
            )
            if with_history:
                merge = (
                    f"WITH m AS ({merge} RETURNING {names}, (xmax = 0) AS inserted)"
                    " INSERT INTO item_changes (item_table, key, kind, reason, spider, run_id, changes)"
                    f" SELECT 'bench_reference', jsonb_build_array(m.source, m.sku), 'insert', 'crawl', 'bench', 1,"
                    f" {entry} FROM m WHERE m.inserted"
                )
            cur.execute(merge)
        return rows / (time.monotonic() - started)

    def batched(module: Any, with_history: bool) -> dict[str, float]:
        # A connection of its own: each module version numbers its prepared statements anew.
        nonlocal conn
        conn.close()
        conn = psycopg2.connect(dsn)
        fresh()
        upserter = module.TableUpserter(
            "bench_upsert",
            list(columns),
            ("source", "sku"),
            last_seen_resolution=3600,
            spider="bench" if with_history else None,
            track=with_history,
            sql_history=with_history,
        )
        out = {}
        for run in ("new", "unchanged"):
            prepared = [module.Row(key=(d["source"], d["sku"]), values=d) for d in data]
            cpu, backend, started = time.process_time(), _backend_cpu(conn), time.monotonic()
            for i in range(0, rows, batch):
                with conn, conn.cursor() as cur:
                    result = upserter.write(cur, prepared[i : i + batch], context=context if with_history else None)
                    if with_history and result.changes:
                        history.record(cur, "bench_upsert", result.changes, context)
            out[run] = rows / (time.monotonic() - started)
            out[f"{run}_client_us"] = (time.process_time() - cpu) / rows * 1e6
            after = _backend_cpu(conn)
            if backend is not None and after is not None:
                out[f"{run}_backend_us"] = (after - backend) / rows * 1e6
        return out

    ways: dict[str, Any] = {
        "copy": copy,
        "reference": lambda: reference(False),
        "reference_history": lambda: reference(True),
        "upsert": lambda: batched(ours, False),
        "upsert_history": lambda: batched(ours, True),
    }
    if before is not None:
        earlier = _load_upsert(before)
        ways["before"] = lambda: batched(earlier, False)
        ways["before_history"] = lambda: batched(earlier, True)
    runs: dict[str, list[Any]] = {name: [] for name in ways}
    for n in range(repeat):
        # In turn, each first in one run or another: this machine's speed drifts within minutes.
        order = list(ways) if n % 2 == 0 else list(reversed(ways))
        for name in order:
            runs[name].append(ways[name]())
    conn.close()
    out: dict[str, dict[str, float]] = {}
    for name, measured in runs.items():
        if isinstance(measured[0], dict):
            out[name] = {
                k: statistics.median(m[k] for m in measured) for k in measured[0] if all(k in m for m in measured)
            }
            out[name]["runs_new"] = [round(m["new"]) for m in measured]  # type: ignore[assignment]
        else:
            out[name] = {"rate": statistics.median(measured), "runs": [round(m) for m in measured]}  # type: ignore[dict-item]
    return out


PARTS = (
    "api-overhead",
    "p1",
    "redelivery",
    "p3",
    "p5",
    "upsert",
    "dupefilter",
    "cluster",
    "decoupled",
    "reprocess",
    "politeness",
    "recrawl",
    "page_states",
    "frontier_scale",
)
#: Parts that bring their own Redis (or use only it) and need no Postgres.
REDIS_ONLY = {"dupefilter", "cluster"}


def upsert_part(args: Any, res: Results, dsn: str) -> None:
    for batch in args.batch:
        print(
            f"\nupserting {args.rows} rows in batches of {batch}, each way {args.upsert_repeat} times in turn ...",
            flush=True,
        )
        up = upsert_bench(dsn, args.rows, batch, args.upsert_repeat, args.upsert_before)
        copy, reference, with_history = up["copy"]["rate"], up["reference"]["rate"], up["reference_history"]["rate"]
        print(f"{'plain COPY (bulk-load limit)':44}{copy:>10.0f} rows/s  runs {up['copy']['runs']}")
        print(
            f"{'COPY to staging + one INSERT..SELECT':44}{reference:>10.0f} rows/s  "
            f"({reference / copy:.2f}x COPY)  runs {up['reference']['runs']}"
        )
        print(
            f"{'the same, writing its history too':44}{with_history:>10.0f} rows/s  "
            f"({with_history / copy:.2f}x COPY)  runs {up['reference_history']['runs']}"
        )
        res.add("upsert", f"COPY to staging + INSERT..SELECT, batches of {batch} / plain COPY", reference / copy, "x")
        for way, label in (
            ("upsert", "ours"),
            ("upsert_history", "ours with history"),
            ("before", "before"),
            ("before_history", "before, with history"),
        ):
            if way not in up:
                continue
            figures = up[way]
            for run in ("new", "unchanged"):
                rate = figures[run]
                cpu = f"  CPU/row {figures[f'{run}_client_us']:.1f} + {figures.get(f'{run}_backend_us', float('nan')):.1f} us"
                print(
                    f"{f'{label}, {run} rows':44}{rate:>10.0f} rows/s  ({rate / copy:.2f}x COPY, "
                    f"{rate / reference:.2f}x the one-statement upsert, {rate / with_history:.2f}x with history)"
                    + cpu
                    + (f"  runs {figures['runs_new']}" if run == "new" else "")
                )
                detail = {
                    "rows_per_s": round(rate),
                    "batch": batch,
                    "client_cpu_us_per_row": round(figures[f"{run}_client_us"], 2),
                    "reference_rows_per_s": round(reference),
                }
                if f"{run}_backend_us" in figures:
                    detail["backend_cpu_us_per_row"] = round(figures[f"{run}_backend_us"], 2)
                name = "ours, same rows again (unchanged)" if run == "unchanged" else "ours, new rows"
                name = name.replace("ours", label)
                suffix = "" if batch == 1000 else f", batches of {batch}"
                res.add("upsert", f"{name}{suffix} / plain COPY", rate / copy, "x", **detail)
                res.add("upsert", f"{name}{suffix} / COPY-to-staging upsert", rate / reference, "x", **detail)


def p1(args: Any, res: Results, redis_url: str, server: Any, dsn: str) -> None:
    for delay in args.latency:
        site, url = start_site(args.products, delay)
        try:
            env = {
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "DEMO_SITE_URL": url,
                "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
                "REDIS_URL": redis_url,
                "DATABASE_URL": dsn,
                "SCHEDULER_IDLE_TIMEOUT": "0",
            }
            where = f"{url} ({args.products} products, {delay} ms per page)"
            runs = []
            variants = {
                "plain": ("with plain Scrapy", PLAIN),
                "full": ("through the whole pipeline (leases on, metrics on)", []),
                "unleased": ("through the whole pipeline, without leases", ["-s", "SCHEDULER_LEASE_TIMEOUT=0"]),
            }
            for attempt in range(args.repeat):
                # This machine's speed drifts within minutes: plain Scrapy and the whole pipeline
                # are crawled back to back in every run, in turn first and second.
                order = ["plain", "full", "unleased"] if attempt % 2 == 0 else ["unleased", "full", "plain"]
                got: dict[str, dict[str, Any]] = {}
                for name in order:
                    label, extra = variants[name]
                    print(f"\ncrawling {where} {label} ...", flush=True)
                    drop_tables(dsn)
                    got[name] = crawl(env, extra, dsn, server)
                runs.append((got["plain"], got["unleased"], got["full"]))
        finally:
            site.terminate()
            site.wait()
        ratios: list[tuple[float, float, float]] = []
        for attempt, (plain, unleased, full) in enumerate(runs, 1):
            print(
                f"{'':24}{'pages':>7}{'items':>7}{'pages/s':>9}{'crawler ms':>11}{'Redis ms':>9}{'PG ms':>7}"
                f"{'all ms':>8}{'RSS MB':>8}   (CPU per page)"
            )
            for name, r in (("plain Scrapy", plain), ("pipeline, no leases", unleased), ("whole pipeline", full)):
                print(
                    f"{name:24}{r['pages']:>7.0f}{r['items']:>7.0f}{r['pages_per_s']:>9.1f}{r['cpu_ms_per_page']:>11.2f}"
                    f"{r['redis_ms_per_page']:>9.2f}{r['postgres_ms_per_page']:>7.2f}{r['all_cpu_ms_per_page']:>8.2f}"
                    f"{r['peak_rss_mb']:>8.0f}"
                )
            cmp = f"P1 at {delay} ms per page"
            tag = {"run": attempt}
            for name, r in (("plain", plain), ("no_leases", unleased), ("pipeline", full)):
                res.add(cmp, f"{name} pages/s", r["pages_per_s"], "pages/s", **tag)
                res.add(cmp, f"{name} crawler CPU per page", r["cpu_ms_per_page"], "ms", **tag)
                res.add(cmp, f"{name} crawler+Redis+Postgres CPU per page", r["all_cpu_ms_per_page"], "ms", **tag)
                res.add(cmp, f"{name} peak RSS", r["peak_rss_mb"], "MB", **tag)
            speed = res.add(cmp, "pipeline / plain pages/s", full["pages_per_s"] / plain["pages_per_s"], "x", **tag)
            cpu = res.add(
                cmp,
                "pipeline / plain crawler CPU per page",
                full["cpu_ms_per_page"] / plain["cpu_ms_per_page"],
                "x",
                **tag,
            )
            cpu_all = res.add(
                cmp,
                "pipeline / plain CPU per page, crawler+Redis+Postgres",
                full["all_cpu_ms_per_page"] / plain["all_cpu_ms_per_page"],
                "x",
                **tag,
            )
            lease_speed = res.add(
                cmp, "leases / no leases pages/s", full["pages_per_s"] / unleased["pages_per_s"], "x", **tag
            )
            print(
                f"ratio whole pipeline / plain Scrapy at {delay} ms per page: {speed:.2f}x pages/s (goal >= 0.9), "
                f"{cpu:.2f}x crawler CPU per page, {cpu_all:.2f}x with Redis and Postgres (goal <= 1.1); "
                f"leases / no leases {lease_speed:.2f}x pages/s",
                flush=True,
            )
            ratios.append((speed, cpu, cpu_all))
        if len(ratios) > 1:
            # This machine's speed drifts by 10-20 % within minutes: each run's ratio compares
            # crawls made a minute apart, and their median is the figure to compare.
            speed, cpu, cpu_all = (statistics.median(r[i] for r in ratios) for i in range(3))
            res.add(cmp, "median pipeline / plain pages/s", speed, "x", runs=len(ratios))
            res.add(cmp, "median pipeline / plain crawler CPU per page", cpu, "x", runs=len(ratios))
            res.add(cmp, "median pipeline / plain CPU per page, crawler+Redis+Postgres", cpu_all, "x", runs=len(ratios))
            print(
                f"median of {len(ratios)} runs at {delay} ms per page: {speed:.2f}x pages/s (goal >= 0.9), "
                f"{cpu:.2f}x crawler CPU per page, {cpu_all:.2f}x with Redis and Postgres (goal <= 1.1)",
                flush=True,
            )


def redelivery_part(res: Results, redis_url: str, dsn: str) -> None:
    for label, extra in (
        ("lease cap (default, 2 x CONCURRENT_REQUESTS)", {}),
        ("no lease cap (SCHEDULER_MAX_LEASES=0)", {"SCHEDULER_MAX_LEASES": "0"}),
    ):
        print(f"\nkilling a worker (CONCURRENT_REQUESTS=8, 300 products, 100 ms per page), {label} ...", flush=True)
        red = redelivery(redis_url, dsn, lease=10.0, extra_env=extra)
        print(
            f"leases the killed worker held: {red['held']:.0f} ({red['held_fetched']:.0f} already fetched); "
            f"first back in the queue after {red['requeued_s']:.1f} s, all fetched again after "
            f"{red['refetched_s']:.1f} s (lease timeout {red['lease']:.0f} s); pages fetched twice by the end: "
            f"{red['redundant']:.0f} ({red['redundant_products']:.0f} product pages; goal <= 16)",
            flush=True,
        )
        cmp = "redelivery per killed worker"
        res.add(cmp, "leases held at the kill", red["held"], "requests", variant=label)
        res.add(cmp, "redundant fetches", red["redundant"], "pages", variant=label)
        res.add(cmp, "redundant product-page fetches", red["redundant_products"], "pages", variant=label)
        res.add(cmp, "all refetched after", red["refetched_s"], "s", variant=label)


def p3(args: Any, res: Results, redis_url: str, dsn: str, server: Any) -> None:
    from scaleout import scale

    for route in ("direct", "api"):
        delay = 200
        site, url = start_site(args.scale_products, 0 if route == "api" else delay)
        pages = site_pages(url)
        api = None
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DEMO_SITE_URL": url,
            "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
            "REDIS_URL": redis_url,
            "DATABASE_URL": dsn,
            "SCHEDULER_IDLE_TIMEOUT": "3",
            "CONCURRENT_REQUESTS": str(args.scale_concurrency),
            "METRICS_ENABLED": "false",
        }
        if route == "api":
            api, api_url = start_standin("bench-key", delay)
            env.update({"SCRAPING_API_KEY": "bench-key", "SCRAPING_API_URL": api_url})
        others = [redis_pid(server)] + ([api.pid] if api else [])
        try:
            print(
                f"\nscale-out {route}: {args.scale_products} products ({pages} pages), {delay} ms per page, "
                f"CONCURRENT_REQUESTS={args.scale_concurrency} per worker ...",
                flush=True,
            )
            one = None
            for workers in args.scale_workers:
                drop_tables(dsn)
                r = scale(workers, env, site, url, pages, redis_url, others)
                one = one or r["pages_per_s"]
                ideal = workers * args.scale_concurrency * 1000 / delay
                print(
                    f"  {workers} worker(s): {r['pages_per_s']:7.1f} pages/s ({r['pages_per_s'] / one:.2f}x one; "
                    f"ideal {ideal:.0f}), CPU {r['cpu_cores_used']:.2f} of {r['cpus']} cores "
                    f"over {r['window_s']:.1f} s",
                    flush=True,
                )
                cmp = f"P3 scale-out {route}"
                res.add(cmp, f"{workers} workers pages/s", r["pages_per_s"], "pages/s")
                res.add(cmp, f"{workers} workers / one", r["pages_per_s"] / one, "x")
                res.add(cmp, f"{workers} workers CPU used", r["cpu_cores_used"], "cores", of=r["cpus"])
        finally:
            for proc in (site, api):
                if proc is not None:
                    proc.terminate()
                    proc.wait()


def p5(args: Any, res: Results, redis_url: str, dsn: str, server: Any) -> None:
    print("\nRedis memory per queued and per leased request (10,000 demo requests) ...", flush=True)
    mem = redis_memory(redis_url)
    print(
        f"queued: {mem['queued_bytes']:.0f} bytes per request (+{mem['seen_bytes']:.0f} in the seen-set); "
        f"leased: {mem['leased_bytes']:.0f} bytes per request",
        flush=True,
    )
    res.add("P5 memory", "Redis per queued request", mem["queued_bytes"], "bytes")
    res.add("P5 memory", "Redis per seen URL (set)", mem["seen_bytes"], "bytes")
    res.add("P5 memory", "Redis per leased request", mem["leased_bytes"], "bytes")
    print(
        f"\ncrawling {args.p5_products} products (pages served instantly), the crawler's RSS every 10 s ...", flush=True
    )
    server.flushdb()
    drop_tables(dsn)
    site, url = start_site(args.p5_products, 0)
    try:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DEMO_SITE_URL": url,
            "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
            "REDIS_URL": redis_url,
            "DATABASE_URL": dsn,
            "SCHEDULER_IDLE_TIMEOUT": "0",
        }
        r = crawl(env, [], dsn, server, rss_every=10.0, site_url=url)
    finally:
        site.terminate()
        site.wait()
    samples = r["rss_samples"]
    for t, pages, rss in samples:
        print(f"  {t:6.0f} s {pages:>8.0f} pages  RSS {rss / 2**20:6.1f} MB")
    after = [(p, rss) for _, p, rss in samples if p >= 10_000]
    base = after[0][1] if after else None
    growth = (max(rss for _, rss in after) - base) / base if base else float("nan")
    print(
        f"{r['pages']:.0f} pages at {r['pages_per_s']:.0f} pages/s; RSS growth after the first 10k pages: "
        f"{100 * growth:+.1f} % (goal <= 10 %)",
        flush=True,
    )
    res.add("P5 memory", "pages crawled", r["pages"], "pages")
    res.add("P5 memory", "RSS at 10k pages", (base or 0) / 2**20, "MB")
    res.add("P5 memory", "peak RSS", r["peak_rss_mb"], "MB")
    res.add(
        "P5 memory",
        "RSS growth after the first 10k pages",
        100 * growth,
        "%",
        samples=[[round(t), int(p), round(rss / 2**20, 1)] for t, p, rss in samples],
    )


def decoupled_part(args: Any, res: Results, redis_url: str, server: Any, dsn: str) -> None:
    import decoupled

    site, url = start_site(args.decoupled_products, 0)
    try:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DEMO_SITE_URL": url,
            "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
            "REDIS_URL": redis_url,
            "DATABASE_URL": dsn,
            "SCHEDULER_IDLE_TIMEOUT": "0",
            "METRICS_ENABLED": "false",
        }
        print(f"\ndecoupled vs in-process: {args.decoupled_products} products, pages served instantly ...", flush=True)
        print(f"{'':40}{'pages':>7}{'items':>7}{'pages/s':>9}{'crawl CPU s':>12}{'all CPU s':>10}{'pages/CPU s':>12}")
        one = None
        for name, commands, extra, done_when in decoupled.VARIANTS:
            server.flushdb()
            drop_tables(dsn)
            r = decoupled.run({**env, **extra}, commands, dsn, server, done_when)
            one = one or r
            per_cpu = r["pages"] / r["all_cpu_s"]
            print(
                f"{name:40}{r['pages']:>7.0f}{r['items']:>7.0f}{r['pages_per_s']:>9.1f}{r['crawl_cpu_s']:>12.1f}"
                f"{r['all_cpu_s']:>10.1f}{per_cpu:>12.1f}",
                flush=True,
            )
            cmp = "decoupled vs in-process"
            res.add(cmp, f"{name} pages/s", r["pages_per_s"], "pages/s", pages=r["pages"], items=r["items"])
            res.add(cmp, f"{name} CPU seconds, crawl processes", r["crawl_cpu_s"], "s")
            res.add(cmp, f"{name} CPU seconds, with Redis and Postgres", r["all_cpu_s"], "s")
            res.add(cmp, f"{name} pages per CPU second (all)", per_cpu, "pages/s")
            res.add(cmp, f"{name} / 1 in-process crawler pages/s", r["pages_per_s"] / one["pages_per_s"], "x")
    finally:
        site.terminate()
        site.wait()


def reprocess_part(args: Any, res: Results, redis_url: str, server: Any, dsn: str) -> None:
    import reprocess

    site, url = start_site(args.decoupled_products, 0)
    slow, slow_url = start_site(args.decoupled_products, 100)
    try:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "REDIS_URL": redis_url,
            "DATABASE_URL": dsn,
            "SCHEDULER_IDLE_TIMEOUT": "0",
            "METRICS_ENABLED": "false",
        }
        print(f"\nreprocess vs the live crawl: {args.decoupled_products} products, archive on ...", flush=True)

        def fresh() -> None:
            server.flushdb()
            drop_tables(dsn)

        r = reprocess.measure(env, url, slow_url, fresh)
    finally:
        for proc in (site, slow):
            proc.terminate()
            proc.wait()
    cmp = "reprocess vs live crawl"
    for name, key in (
        ("live crawl, pages served instantly", "live_pages_per_s"),
        ("live crawl, 100 ms per page", "live_100ms_pages_per_s"),
        ("reprocess", "reprocess_pages_per_s"),
    ):
        print(f"{name:40}{r[key]:>9.0f} pages/s", flush=True)
        res.add(cmp, f"{name} pages/s", r[key], "pages/s", pages=r["pages"])
    for name, key in (("pages served instantly", "live_pages_per_s"), ("100 ms per page", "live_100ms_pages_per_s")):
        ratio = res.add(cmp, f"reprocess / live crawl ({name})", r["reprocess_pages_per_s"] / r[key], "x")
        print(f"reprocess / live crawl, {name}: {ratio:.1f}x (aim >= 5x)", flush=True)


def politeness_part(args: Any, res: Results, redis_url: str, server: Any, dsn: str) -> None:
    import politeness  # bench/politeness.py

    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": redis_url, "DATABASE_URL": dsn}
    cmp = "adaptive politeness, hidden limit"
    print(
        f"\ncrawling {args.politeness_products} products against a hidden limit of {args.politeness_limit:g} "
        f"requests/s, nothing declared ...",
        flush=True,
    )
    print(
        f"{'workers':>8}{'pages':>7}{'stored':>8}{'requests':>10}{'429s':>7}{'429 %':>7}{'pages/s':>9}"
        f"{'settled req/s':>15}",
        flush=True,
    )
    for workers in args.politeness_workers:
        server.flushdb()
        drop_tables(dsn)
        r = politeness.measure(env, dsn, args.politeness_limit, args.politeness_products, workers)
        print(
            f"{workers:>8}{r['pages']:>7}{r['stored']:>5}/{r['valid_products']:<3}{r['requests']:>9}"
            f"{r['throttled']:>7}{100 * r['throttled_share']:>6.1f}%{r['pages_per_s']:>9.1f}{r['settled_rate']:>15.1f}",
            flush=True,
        )
        res.add(cmp, f"{workers} workers: 429s / requests", r["throttled_share"], "x", **r)
        res.add(cmp, f"{workers} workers: settled rate / limit", r["settled_rate"] / args.politeness_limit, "x")
    if not args.politeness_short_runs:
        return
    # The first seconds decide the 429s of a short crawl: the same crawl run again and again, as
    # each run's share varies (a mean would hide the bad runs).
    short, workers = args.politeness_short_products, 2
    print(
        f"\nshort crawl, {workers} workers, {short} products, {args.politeness_short_runs} runs, nothing declared ...",
        flush=True,
    )
    print(f"{'run':>8}{'pages':>7}{'stored':>8}{'requests':>10}{'429s':>7}{'429 %':>7}{'pages/s':>9}", flush=True)
    shares = []
    for run in range(1, args.politeness_short_runs + 1):
        server.flushdb()
        drop_tables(dsn)
        r = politeness.measure(env, dsn, args.politeness_limit, short, workers)
        shares.append(r["throttled_share"])
        print(
            f"{run:>8}{r['pages']:>7}{r['stored']:>5}/{r['valid_products']:<3}{r['requests']:>9}"
            f"{r['throttled']:>7}{100 * r['throttled_share']:>6.1f}%{r['pages_per_s']:>9.1f}",
            flush=True,
        )
        res.add(cmp, "short crawl: 429s / requests", r["throttled_share"], "x", run=run, **r)
    print(f"worst run: {100 * max(shares):.1f} % answered 429 (aim <= 5 % in every run)", flush=True)
    res.add(cmp, "short crawl: worst run's 429s / requests", max(shares), "x", runs=len(shares))


def recrawl_part(args: Any, res: Results, redis_url: str, server: Any, dsn: str) -> None:
    import recrawl  # bench/recrawl.py

    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": redis_url, "DATABASE_URL": dsn}
    cmp = "revisit runs against a full daily recrawl"
    print(
        f"\n{args.recrawl_days} simulated days of {args.recrawl_products} products changing at mixed rates "
        f"({100 * args.recrawl_without_lastmod:g} % without lastmod): day 0 full, then a revisit run a day ...",
        flush=True,
    )
    print(recrawl.HEADER, flush=True)
    server.flushdb()
    drop_tables(dsn)
    r = recrawl.measure(env, dsn, args.recrawl_products, args.recrawl_days, args.recrawl_without_lastmod)
    print(
        f"product-page requests: {r['requests']:,} of a full recrawl's {r['full_recrawl_requests']:,} "
        f"({100 * r['request_share']:.1f} %, aim <= 30 %); changes captured within their day: "
        f"{r['captured']:,} of {r['changes']:,} ({100 * r['captured_share']:.1f} %, aim >= 95 %; without lastmod: "
        f"{r['captured_without_lastmod']} of {r['changes_without_lastmod']}); requests per change "
        f"{r['requests_per_change']:.2f} (full recrawl {r['full_requests_per_change']:.1f}); rows updated "
        f"{r['rows_updated']:,}, marked gone {r['rows_gone']}",
        flush=True,
    )
    res.add(cmp, "product-page requests / full daily recrawl's", r["request_share"], "x", **r)
    res.add(cmp, "changes captured within their day", r["captured_share"], "x")
    res.add(cmp, "product-page requests per change", r["requests_per_change"], "requests")


def page_states_part(args: Any, res: Results, dsn: str) -> None:
    import page_states  # bench/page_states.py

    sizes = [int(n) for n in args.page_states_sizes.split(",")]
    print(f"\na revisit run's start, knowing {', '.join(f'{n:,}' for n in sizes)} synthetic pages ...", flush=True)
    r = page_states.measure(dsn, sizes, args.page_states_before, args.page_states_before_max, repeat=args.repeat)
    cmp = "a crawl node's start against the pages its spider knows"
    for row in r["rows"]:
        name = f"{row['variant']}, {row['pages_known']:,} pages known"
        res.add(cmp, f"{name}: time to first request", row["first_request_s"], "s")
        res.add(cmp, f"{name}: CPU to first request", row["cpu_at_first_request_s"], "s")
        res.add(cmp, f"{name}: peak RSS at first request", row["hwm_at_first_request_bytes"] / 2**20, "MB")
    after = [row for row in r["rows"] if row["variant"] == "after"]
    if len(after) > 1:
        for key, what in (
            ("first_request_s", "time to first request"),
            ("cpu_at_first_request_s", "CPU to first request"),
            ("hwm_at_first_request_bytes", "peak RSS"),
        ):
            growth = after[-1][key] / after[0][key]
            print(f"{what}: {growth:.2f}x from {sizes[0]:,} to {sizes[-1]:,} pages (aim <= 1.1x)", flush=True)
            res.add(cmp, f"{what}, {sizes[-1]:,} / {sizes[0]:,} pages known", growth, "x")


def frontier_scale_part(args: Any, res: Results, dsn: str) -> None:
    import frontier_scale  # bench/frontier_scale.py

    sizes = [int(n) for n in args.frontier_scale_sizes.split(",")]
    print(f"\nthe frontier at {', '.join(f'{n:,}' for n in sizes)} queued URLs ...", flush=True)
    r = frontier_scale.measure(dsn, sizes, args.frontier_scale_pages, repeat=args.repeat)
    print(frontier_scale.table(r), flush=True)
    cmp = "the shared frontier against the URLs queued"
    for row in r["rows"]:
        size, m = f"{row['size']:,} queued", row["memory"]
        res.add(cmp, f"{size}: Redis used_memory per queued request", m["used_memory_per_request"], "B")
        res.add(cmp, f"{size}: Redis used_memory per seen URL, set", m["set_used_memory_per_seen"], "B")
        res.add(cmp, f"{size}: Redis MEMORY USAGE per seen URL, bloom", m["bloom_memory_usage_per_seen"], "B")
        for backend, n in row["nodes"].items():
            res.add(cmp, f"{size}, {backend}: node's time to first request", n["first_request_s"], "s")
            res.add(cmp, f"{size}, {backend}: node's peak RSS", n["hwm_bytes"] / 2**20, "MB")
            res.add(cmp, f"{size}, {backend}: node's pages/s", n["pages_per_s"], "pages/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--products", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3, help="P1 crawls per latency, to show the noise")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, nargs="+", default=[1000], help="upsert batch sizes")
    parser.add_argument("--upsert-repeat", type=int, default=1, help="each way of upserting, in turn (medians)")
    parser.add_argument(
        "--upsert-before", type=Path, help="an earlier scraper/storage/upsert.py, measured beside ours (same run)"
    )
    parser.add_argument("--api-products", type=int, default=1000)
    parser.add_argument("--scale-products", type=int, default=1500)
    parser.add_argument("--scale-workers", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--scale-concurrency", type=int, default=4)
    parser.add_argument("--p5-products", type=int, default=int(os.environ.get("PRODUCTS", "100000")))
    parser.add_argument("--dupefilter-urls", type=int, default=1_000_000)
    parser.add_argument("--cluster-memory", type=int, default=60_000, help="requests queued to measure memory")
    parser.add_argument("--cluster-ops", type=int, default=20_000, help="requests each client claims and pops")
    parser.add_argument("--cluster-clients", type=int, default=3, help="client processes of the parallel run")
    parser.add_argument("--cluster-replicas", type=int, default=0, help="replicas per master of the local cluster")
    parser.add_argument(
        "--latency",
        type=int,
        nargs="+",
        default=[0, 100],
        help="page latencies (ms) to crawl at: 0 is CPU-bound, 100 is like a real site",
    )
    parser.add_argument("--decoupled-products", type=int, default=2000)
    parser.add_argument("--politeness-products", type=int, default=500)
    parser.add_argument("--recrawl-products", type=int, default=1500)
    parser.add_argument("--recrawl-days", type=int, default=14)
    parser.add_argument("--recrawl-without-lastmod", type=float, default=0.05)
    parser.add_argument("--politeness-limit", type=float, default=20.0, help="the site's hidden requests/s")
    parser.add_argument("--politeness-workers", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--politeness-short-products", type=int, default=260, help="~300 requests")
    parser.add_argument("--politeness-short-runs", type=int, default=5, help="0: no short crawls")
    parser.add_argument("--page-states-sizes", default="10000,1000000", help="pages known, ascending")
    parser.add_argument("--page-states-before", type=Path, help="a checkout of an earlier commit, run side by side")
    parser.add_argument("--page-states-before-max", type=int, default=1_000_000, help="its largest size (its RSS)")
    parser.add_argument("--frontier-scale-sizes", default="10000,1000000", help="URLs queued, ascending")
    parser.add_argument("--frontier-scale-pages", type=int, default=1000, help="pages each crawl node fetches")
    parser.add_argument("--only", choices=PARTS, nargs="+", default=list(PARTS), help="run these parts alone")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results.json")
    args = parser.parse_args()
    # Every crawl imports the project's modules (plain Scrapy's too: settings, spiders). With
    # PYTHONDONTWRITEBYTECODE set, as on some machines, each would compile them again at start,
    # a cost per crawl, not per page, that an installed project does not pay: compiled once here.
    compileall.compile_dir(str(ROOT / "scraper"), quiet=1)

    need_postgres = bool(set(args.only) - REDIS_ONLY)
    found = backends.resolve(
        Settings(
            {
                "REDIS_URL": os.environ.get("REDIS_URL", ""),
                "DATABASE_URL": os.environ.get("DATABASE_URL", ""),
                "DATA_DIR": tempfile.mkdtemp(prefix="scraper-bench-"),
            }
        ),
        need_postgres=need_postgres,
    )
    # A Redis of the bench's own when this machine has redis-server: its CPU is then the
    # crawl's alone (a shared server also works for others meanwhile).
    own = private_redis()
    redis_url = own[1] if own else with_redis_db(found.redis_url, 7)  # tests use 8-15
    server = redis.Redis.from_url(redis_url)
    server.flushdb()
    dsn = recreate_database(found.database_url) if need_postgres else ""
    res = Results(args.results, keep_earlier=set(args.only) != set(PARTS))
    res.run["backends"] = {
        "redis": "private redis-server" if own else ("embedded" if found.embedded_redis else "server"),
        "postgres": ("embedded" if found.embedded_postgres else "server") if need_postgres else "none",
    }
    print(
        f"backends: Redis {res.run['backends']['redis']}, Postgres {res.run['backends']['postgres']}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    try:
        run_parts(args, res, redis_url, server, dsn)
    finally:
        res.run["load_average_at_end"] = list(os.getloadavg())
        res.save()
        if own:
            own[0].terminate()
            own[0].wait()
    print(f"\nfigures written to {args.results}")


def run_parts(args: Any, res: Results, redis_url: str, server: Any, dsn: str) -> None:
    if "api-overhead" in args.only:
        print(
            f"\ncrawling {args.api_products} products (0 ms per page) through the whole pipeline, directly "
            f"and through the scraping-API stand-in (0 ms added) ...",
            flush=True,
        )
        over = api_overhead(args.api_products, redis_url, dsn)
        for name, r in over.items():
            print(
                f"{name:8} {r['pages']:>6.0f} pages {r['pages_per_s']:>8.1f} pages/s {r['cpu_ms_per_page']:>7.2f} "
                f"CPU ms/page"
            )
        extra = over["api"]["cpu_ms_per_page"] - over["direct"]["cpu_ms_per_page"]
        print(
            f"the API path costs {extra:+.2f} CPU ms per page in the crawler "
            f"({over['api']['cpu_ms_per_page'] / over['direct']['cpu_ms_per_page']:.2f}x)",
            flush=True,
        )
        res.add("scraping-API path", "extra crawler CPU per page", extra, "ms")
    if "p1" in args.only:
        p1(args, res, redis_url, server, dsn)
    if "recrawl" in args.only:
        recrawl_part(args, res, redis_url, server, dsn)
    if "page_states" in args.only:
        page_states_part(args, res, dsn)
    if "frontier_scale" in args.only:
        frontier_scale_part(args, res, dsn)
    if "politeness" in args.only:
        politeness_part(args, res, redis_url, server, dsn)
    if "redelivery" in args.only:
        redelivery_part(res, redis_url, dsn)
    if "p3" in args.only:
        p3(args, res, redis_url, dsn, server)
    if "p5" in args.only:
        p5(args, res, redis_url, dsn, server)
    if "upsert" in args.only:
        upsert_part(args, res, dsn)
    if "decoupled" in args.only:
        decoupled_part(args, res, redis_url, server, dsn)
    if "reprocess" in args.only:
        reprocess_part(args, res, redis_url, server, dsn)
    if "dupefilter" in args.only:
        print(f"\ndupefilter memory, set vs Bloom filter, {args.dupefilter_urls:,} URLs ...", flush=True)
        import dupefilter_memory

        figures = dupefilter_memory.main(["--urls", str(args.dupefilter_urls)])
        if isinstance(figures, dict):
            for key, value in figures.items():
                if isinstance(value, (int, float)):
                    res.add("dupefilter memory", key, value, "")
    if "cluster" in args.only:
        import cluster

        cluster.run(res, args.cluster_memory, args.cluster_ops, args.cluster_clients, args.cluster_replicas)


if __name__ == "__main__":
    main()
