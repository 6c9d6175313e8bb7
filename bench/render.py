"""The price of a browser: rendered pages against plain HTTP fetching of the same products.

Three measurements, each a real crawl through the whole pipeline (a private Redis, a fresh
Postgres database named ``bench_render``, the demo shop on loopback):

* **throughput**: one node crawls the shop's server-rendered pages (the ``demo`` spider, plain
  HTTP) and then the JavaScript-only section of the same catalog (``demo_js``, every page rendered
  by Chromium): pages/s and CPU seconds per page (the node and its browser together);
* **memory**: one node renders ``--rss-pages`` product pages (2,000 by default); the resident
  memory of the node alone and of the node with its browser (PSS, so pages shared between
  Chromium's processes count once) after 200 pages and at the end;
* **fleet**: two nodes crawl a JavaScript-only section of 500 products, one of them killed with
  SIGKILL part way and started again: products stored, duplicates.

Usage: ``DATABASE_URL=postgresql://... .venv/bin/python bench/render.py [--skip-rss]``; prints one
JSON document (the figures of docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import private_redis  # noqa: E402

from scraper.demo_site import Catalog, DemoSite  # noqa: E402

SECRET = "bench-render-secret-0123456789"
DB = "bench_render"


def fresh_database(admin: str) -> str:
    conn = psycopg2.connect(admin)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {DB}")
    conn.close()
    parts = urlsplit(admin)
    return urlunsplit((parts.scheme, parts.netloc, f"/{DB}", parts.query, ""))


def crawl_env(redis_url: str, dsn: str, site: DemoSite, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(
        REDIS_URL=redis_url,
        DATABASE_URL=dsn,
        SCHEDULER_SECRET=SECRET,
        DEMO_SITE_URL=site.url,
        FETCH_ALLOW_NETWORKS="127.0.0.1/32",
        POLITENESS_SLOW_START_RATE="0",
        SCHEDULER_IDLE_TIMEOUT="2",
        QUALITY_FAIL_EXIT="0",
        METRICS_ENABLED="false",
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


def start(env: dict[str, str], spider: str) -> tuple[subprocess.Popen, Any]:
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "scrapy", "crawl", spider], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log
    )
    return proc, log


def finish(proc: subprocess.Popen, log: Any, timeout: float = 3600) -> str:
    proc.wait(timeout=timeout)
    log.seek(0)
    text = log.read()
    if proc.returncode != 0:
        sys.stderr.write(text[-4000:])
        raise SystemExit(f"render bench: a crawl exited {proc.returncode}")
    return text


def tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds of a process and every descendant still alive."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def memory(pid: int) -> dict[str, float]:
    """MiB: the node's own RSS, and the PSS of the node with its browser and driver."""
    node = psutil.Process(pid)
    pss = 0
    for p in [node, *node.children(recursive=True)]:
        try:
            pss += p.memory_full_info().pss
        except psutil.Error:
            pass
    return {"node_rss_mib": node.memory_info().rss / 2**20, "node_and_browser_pss_mib": pss / 2**20}


def rendered_products(site: DemoSite) -> int:
    return sum(n for path, n in site.stats()["requests"].items() if path.startswith("/js/p/"))


def stored(dsn: str, spider: str) -> tuple[int, int]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT count(*), count(DISTINCT sku) FROM products WHERE source = %s", (spider,))
            rows, skus = cur.fetchone()
    finally:
        conn.close()
    return rows, skus


def throughput(redis_url: str, admin: str, products: int) -> dict[str, Any]:
    import redis

    out: dict[str, Any] = {}
    catalog = Catalog(products=products)
    for spider in ("demo", "demo_js"):
        redis.Redis.from_url(redis_url).flushdb()
        dsn = fresh_database(admin)
        with DemoSite(catalog) as site:
            started = time.monotonic()
            proc, log = start(crawl_env(redis_url, dsn, site), spider)
            watched = psutil.Process(proc.pid)
            cpu = 0.0
            while proc.poll() is None:
                cpu = max(cpu, tree_cpu(watched))  # read before the browser exits with the node
                time.sleep(0.2)
            took = time.monotonic() - started
            text = finish(proc, log)
            pages = len(catalog.pages()) if spider == "demo" else len(site.js.products) + 2
            rows, _ = stored(dsn, spider)
        out[spider] = {
            "pages": pages,
            "items_stored": rows,
            "seconds": round(took, 1),
            "pages_per_s": round(pages / took, 2),
            "cpu_s_per_page": round(cpu / pages, 4),
            "log_tail": "" if rows else text[-500:],
        }
    out["rendered_vs_plain_pages_per_s"] = round(out["demo_js"]["pages_per_s"] / out["demo"]["pages_per_s"], 3)
    out["rendered_vs_plain_cpu_per_page"] = round(out["demo_js"]["cpu_s_per_page"] / out["demo"]["cpu_s_per_page"], 1)
    return out


def rss(redis_url: str, admin: str, pages: int) -> dict[str, Any]:
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    dsn = fresh_database(admin)
    products = pages + pages // 30 + 60  # the catalog's odd products are not in the section
    catalog = Catalog(products=products)
    samples: dict[str, Any] = {}
    with DemoSite(catalog) as site:
        target = min(pages, len(site.js.products))
        proc, log = start(crawl_env(redis_url, dsn, site), "demo_js")
        marks = [200, target - 20]
        while proc.poll() is None and marks:
            done = rendered_products(site)
            if done >= marks[0]:
                samples[str(marks.pop(0))] = {"pages": done, **memory(proc.pid)}
            time.sleep(0.2)
        finish(proc, log)
        rows, _ = stored(dsn, "demo_js")
    first, last = samples.get("200"), samples.get(str(target - 20))
    growth = {}
    if first and last:
        for key in ("node_rss_mib", "node_and_browser_pss_mib"):
            growth[key.replace("_mib", "_growth")] = round(last[key] / first[key] - 1, 3)
    return {"rendered_products": target, "stored": rows, "samples": samples, **growth}


def fleet(redis_url: str, admin: str, products: int) -> dict[str, Any]:
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    dsn = fresh_database(admin)
    with DemoSite(Catalog(products=products)) as site:
        env = crawl_env(redis_url, dsn, site, SCHEDULER_LEASE_TIMEOUT="15")
        started = time.monotonic()
        nodes = [start(env, "demo_js"), start(env, "demo_js")]
        total = len(site.js.products)
        while rendered_products(site) < total * 0.4:
            time.sleep(0.1)
        os.kill(nodes[0][0].pid, signal.SIGKILL)  # a node dies mid-crawl, its browser with it
        nodes[0][0].wait()
        nodes.append(start(env, "demo_js"))  # and is replaced
        for proc, log in nodes[1:]:
            finish(proc, log)
        took = time.monotonic() - started
        skus = site.js.skus()
    rows, distinct = stored(dsn, "demo_js")
    return {
        "products": len(skus),
        "stored_rows": rows,
        "stored_skus": distinct,
        "duplicates": rows - distinct,
        "seconds": round(took, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--products", type=int, default=220, help="catalog of the throughput runs (220)")
    parser.add_argument("--rss-pages", type=int, default=2000, help="product pages rendered for memory (2000)")
    parser.add_argument("--fleet-products", type=int, default=516, help="catalog of the fleet run (516: 500 JS)")
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--skip-fleet", action="store_true")
    args = parser.parse_args()
    admin = os.environ.get("DATABASE_URL")
    if not admin:
        raise SystemExit("render bench: set DATABASE_URL (a Postgres it may create the database bench_render on)")
    own = private_redis()
    if own is None:
        raise SystemExit("render bench: redis-server is needed (make tools)")
    server, redis_url = own
    try:
        result: dict[str, Any] = {"throughput": throughput(redis_url, admin, args.products)}
        print(json.dumps(result, indent=2), file=sys.stderr, flush=True)
        if not args.skip_fleet:
            result["fleet"] = fleet(redis_url, admin, args.fleet_products)
            print(json.dumps(result["fleet"], indent=2), file=sys.stderr, flush=True)
        if not args.skip_rss:
            result["memory"] = rss(redis_url, admin, args.rss_pages)
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
