"""Page states at scale: a crawl node's memory and time to its first request, against the number
of pages its spider knows (``bench/run.py --only page_states``, or this file alone).

The ``pages`` rows are synthetic, made by Postgres itself (``generate_series``, nothing crawled):
each one a product page of the spider with a validator, a content hash, one item key and a
history, not due for a day (as most of a large site is on any run), in a database the bench
recreates. The node is a revisit run (``scrapy crawl demo --due``) of a small demo shop; the
bench measures, from the process' start, the time until the shop sees its first request, and the
node's peak RSS (``VmHWM``) at that moment and a few seconds on (the due set and the cache at
work). Each size is measured with this checkout's code ("after") and, side by side in the same
run, with another checkout's (``--before``: a ``git worktree`` of an earlier commit), the table
growing from one size to the next.

    .venv/bin/python bench/page_states.py --sizes 10000,1000000,10000000 --before /tmp/wt-47
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg2  # noqa: E402
from procs import cpu_seconds, private_redis  # noqa: E402

from scraper.demo_site import Catalog, DemoSite  # noqa: E402
from scraper.revisit import store  # noqa: E402

# One synthetic product page per i: 20 bytes of key as a fingerprint has, a URL on the site that
# the site does not serve, one item key, a history of three visits, due a day on or later.
_SYNTHETIC = """
INSERT INTO pages (spider, page, url, kind, callback, etag, last_modified, content_hash, items,
                   fetched_at, changed_at, interval_seconds, next_due, lastmod, visits, changes,
                   not_modified, hint_misses)
SELECT %(spider)s, substring(sha256(('synthetic:' || i)::bytea) from 1 for 20),
       rtrim(%(site)s, '/') || '/synthetic/p/' || i || '.html', 'items', 'parse_product',
       '"' || md5(i::text) || '"', to_char(now() - interval '3 days', 'Dy, DD Mon YYYY HH24:MI:SS "GMT"'),
       md5('content:' || i),
       jsonb_build_array(jsonb_build_array('products', jsonb_build_array(%(spider)s, 'SYN-' || lpad(i::text, 9, '0')))),
       now() - interval '1 day', now() - interval '3 days', 172800,
       now() + interval '1 day' + (i %% 86400) * interval '1 second', NULL, 3, 1, 1, 0
FROM generate_series(%(start)s, %(stop)s - 1) AS i
"""


def add_synthetic_pages(dsn: str, spider: str, site: str, start: int, stop: int, chunk: int = 1_000_000) -> float:
    """Synthetic rows ``start`` to ``stop - 1`` of *spider*'s pages (the table made if missing);
    returns the seconds it took."""
    began = time.monotonic()
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            store.ensure(cur)
        for low in range(start, stop, chunk):
            with conn, conn.cursor() as cur:
                cur.execute(_SYNTHETIC, {"spider": spider, "site": site, "start": low, "stop": min(stop, low + chunk)})
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE pages")
    finally:
        conn.close()
    return time.monotonic() - began


def _status(pid: int) -> dict[str, int]:
    found = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    name, value = line.split(":", 1)
                    found[name] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return found


def node_start(
    args: list[str],
    env: dict[str, str],
    cwd: Path,
    site: DemoSite,
    linger: float = 3.0,
    timeout: float = 600,
    watch: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run a crawl node to its end; its seconds (wall and CPU) from start to the site's first
    request, and its peak RSS then and *linger* seconds on (*watch*: called every 10 ms meanwhile)."""
    site.reset_stats()
    began = time.monotonic()
    # The log to a file, not a pipe: a pipe nobody reads until the end fills and stops the node.
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    first = at_first = cpu_first = None
    peak = 0
    try:
        while proc.poll() is None and time.monotonic() - began < timeout:
            status = _status(proc.pid)
            peak = max(peak, status.get("VmHWM", 0))
            arrivals = site.arrivals()
            if first is None and arrivals:
                first = arrivals[0] - began
                at_first = status.get("VmHWM", 0)
                # CPU time says what the node did before it asked, whatever else the machine runs.
                cpu_first = cpu_seconds(proc.pid)
            if watch is not None:
                watch()
            elif first is not None and time.monotonic() - began >= first + linger:
                break
            time.sleep(0.01)
        proc.wait(timeout=timeout)
        log.seek(0)
        stderr = log.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0 or "Traceback" in stderr:
        raise RuntimeError(f"the crawl failed (exit {proc.returncode}): {stderr[-3000:]}")
    return {
        "first_request_s": first,
        "cpu_at_first_request_s": cpu_first,
        "hwm_at_first_request_bytes": at_first,
        "hwm_bytes": peak,
        "seconds": time.monotonic() - began,
        "stderr": stderr,
    }


def _crawl_env(redis_url: str, dsn: str, site: DemoSite, root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}}
    env.update(
        REDIS_URL=redis_url,
        DATABASE_URL=dsn,
        DEMO_SITE_URL=site.url,
        PYTHONPATH=str(root),
        FETCH_ALLOW_NETWORKS="127.0.0.0/8",
        SCHEDULER_IDLE_TIMEOUT="1",
        SCHEDULER_SECRET=os.environ.get("SCHEDULER_SECRET", "bench-fleet-secret-0123456789"),
        METRICS_ENABLED="false",
        QUALITY_FAIL_EXIT="0",
        POLITENESS_SLOW_START_RATE="0",
    )
    return env


def _database(base: str, name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    admin = psycopg2.connect(base)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {name}")
    admin.close()
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


def measure(
    dsn_base: str,
    sizes: list[int],
    before: Path | None,
    before_max: int,
    products: int = 200,
    repeat: int = 3,
    database: str = "scraper_bench_pages",
) -> dict[str, Any]:
    """Each size: the synthetic rows added, then *repeat* runs of each variant, in turn (each
    first in turn: the machine's speed drifts); the medians of each figure."""
    import redis

    private = private_redis()
    if private is None:
        raise SystemExit("page_states bench: no redis-server on this machine")
    server, redis_url = private
    dsn = _database(dsn_base, database)
    variants = [("after", ROOT)] + ([("before", before)] if before is not None else [])
    rows: list[dict[str, Any]] = []
    cmd = [sys.executable, "-m", "scrapy", "crawl", "demo"]
    try:
        with DemoSite(Catalog(products=products)) as site:
            # The shop's own pages known first: every measured run is then the same revisit run
            # (its listings, no product due), whatever ran before it.
            node_start(cmd, _crawl_env(redis_url, dsn, site, ROOT), ROOT, site, linger=600)
            known = 0
            for size in sizes:
                generated = add_synthetic_pages(dsn, "demo", site.url, known, size)
                known = size
                print(f"{size:>12,} pages known (generated in {generated:.0f} s)", flush=True)
                runs: dict[str, list[dict[str, Any]]] = {}
                for turn in range(repeat):
                    for name, root in variants[turn % len(variants) :] + variants[: turn % len(variants)]:
                        if name == "before" and size > before_max:
                            continue
                        redis.Redis.from_url(redis_url).flushdb()
                        found = node_start([*cmd, "--due"], _crawl_env(redis_url, dsn, site, root), root, site)
                        found.pop("stderr")
                        runs.setdefault(name, []).append(found)
                for name, _ in variants:
                    if name not in runs:
                        print(f"{'':>12} {name:<7} not run (its memory grows with the pages: --before-max)")
                        continue
                    row = _medians(runs[name])
                    row.update(variant=name, pages_known=size, runs=runs[name])
                    rows.append(row)
                    print(
                        f"{'':>12} {name:<7} first request {row['first_request_s']:6.2f} s "
                        f"({min(r['first_request_s'] for r in runs[name]):.2f}-"
                        f"{max(r['first_request_s'] for r in runs[name]):.2f}), "
                        f"{row['cpu_at_first_request_s']:6.2f} s of CPU; peak RSS "
                        f"{row['hwm_at_first_request_bytes'] / 2**20:7.1f} MB then, "
                        f"{row['hwm_bytes'] / 2**20:7.1f} MB 3 s on",
                        flush=True,
                    )
    finally:
        server.terminate()
        server.wait()
    return {"products": products, "repeat": repeat, "rows": rows}


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("first_request_s", "cpu_at_first_request_s", "hwm_at_first_request_bytes", "hwm_bytes")
    return {key: statistics.median(r[key] for r in runs) for key in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,1000000", help="pages known, comma-separated, ascending")
    parser.add_argument("--before", type=Path, help="a checkout of an earlier commit, measured side by side")
    parser.add_argument(
        "--before-max", type=int, default=1_000_000, help="largest size the earlier checkout is run at (its RSS)"
    )
    parser.add_argument("--products", type=int, default=200, help="the demo shop's size")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each variant at each size (medians)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    opts = parser.parse_args()
    dsn = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
    sizes = [int(s) for s in opts.sizes.split(",")]
    result = measure(dsn, sizes, opts.before, opts.before_max, opts.products, opts.repeat)
    if opts.json:
        opts.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
