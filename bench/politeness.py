"""Politeness that adapts: what a fleet reaches against a site's limit it never announces.

The demo shop answers 429 past a hidden number of requests per second (any 1-second window,
all clients together); the fleet declares nothing. Figures per fleet size: pages stored of the
shop's valid products, the share of requests answered 429, pages/s over the whole crawl, and the
rate the fleet settled at (the median of the requests the shop accepted per second, the first
three seconds left out: the limit is not known yet then).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg2

from scraper.demo_site import Catalog, DemoSite

ROOT = Path(__file__).resolve().parent.parent


def measure(env: dict[str, str], dsn: str, limit: float, products: int, workers: int) -> dict[str, Any]:
    catalog = Catalog(products=products)
    with DemoSite(catalog) as site:
        site.limit_rate(limit)
        run_env = {
            **env,
            "DEMO_SITE_URL": site.url,
            "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
            "CONCURRENT_REQUESTS": "8",
            "SCHEDULER_IDLE_TIMEOUT": "3",
            "METRICS_ENABLED": "false",
            "QUALITY_FAIL_EXIT": "0",
        }
        started = time.monotonic()
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "scrapy", "crawl", "demo"],
                cwd=ROOT,
                env=run_env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(workers)
        ]
        logs = [p.communicate(timeout=1800)[1] for p in procs]
        took = time.monotonic() - started
        for proc, log in zip(procs, logs):
            if proc.returncode != 0:
                sys.stderr.write(log[-4000:])
                raise SystemExit("politeness bench: a crawl failed")
        stats = site.stats()
        accepted = sorted(site.arrivals())
    per_second = Counter(int(t - accepted[0]) for t in accepted) if accepted else Counter()
    seconds = range(3, max(per_second, default=0))  # the last, partial second left out too
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT count(DISTINCT sku) FROM products")
            stored = cur.fetchone()[0]
    finally:
        conn.close()
    requests = stats["total"]
    return {
        "workers": workers,
        "limit": limit,
        "pages": len(catalog.pages()),
        "valid_products": len(catalog.valid_products()),
        "stored": stored,
        "requests": requests,
        "throttled": stats["throttled"],
        "throttled_share": stats["throttled"] / requests if requests else 0.0,
        "pages_per_s": len(catalog.pages()) / took,
        "settled_rate": statistics.median(per_second[s] for s in seconds) if seconds else 0.0,
    }
