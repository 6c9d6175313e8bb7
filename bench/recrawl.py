"""Recrawl only what changed: 14 simulated days of a shop whose product pages change at mixed rates.

The demo shop with a change clock (scraper/demo_site/changes.py: 3 % of products change daily, a
quarter about weekly, half about monthly, the rest never; ``--without-lastmod`` of them have no
``lastmod`` in the sitemap). Day 0 is a full crawl; each later day the shop moves on a day and a
revisit run (``scrapy crawl demo_sitemap --due``) runs with its clock that many days ahead
(faketime). Per day: product-page requests (a 304 counts: through a scraping API each one is
billed), the changes of the day, and the changes captured (the stored price is the day's price
after the run). Against it, what a full daily recrawl makes: one request per product page per day.
Also checked: rows updated = changes captured (no row updated that did not change), 0 rows
marked gone (the shop removed nothing).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg2

from scraper.demo_site import Catalog, DemoSite
from scraper.demo_site.changes import ChangeClock

ROOT = Path(__file__).resolve().parent.parent
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
_PRODUCT = re.compile(r"/p/(\d+)\.html")


def _query(dsn: str, sql: str) -> list[tuple]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()
    finally:
        conn.close()


def _crawl(env: dict[str, str], day: int) -> None:
    run_env = dict(env)
    args = [sys.executable, "-m", "scrapy", "crawl", "demo_sitemap"]
    if day:
        run_env.update(FAKETIME=f"+{24 * day}h", DONT_FAKE_MONOTONIC="1", LD_PRELOAD=LIBFAKETIME)
        args.append("--due")
    done = subprocess.run(args, cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or "Traceback" in done.stderr:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"recrawl bench: the crawl of day {day} failed (exit {done.returncode})")


def measure(env: dict[str, str], dsn: str, products: int, days: int, without_lastmod: float) -> dict[str, Any]:
    if not shutil.which("faketime"):
        raise SystemExit("recrawl bench: faketime is missing (make tools installs it)")
    catalog = Catalog(products=products)
    clock = ChangeClock(catalog, start=datetime.now(UTC), without_lastmod=without_lastmod)
    valid = [p for p in catalog.valid_products() if p.price is not None]
    by_sku = {p.sku: p for p in valid}
    per_day = []
    with DemoSite(catalog, changes=clock) as site:
        run_env = {
            **env,
            "DEMO_SITE_URL": site.url,
            "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
            "SCHEDULER_IDLE_TIMEOUT": "1",
            "METRICS_ENABLED": "false",
            "QUALITY_FAIL_EXIT": "0",
        }
        for day in range(days + 1):
            changed = set(site.set_day(day)) & set(by_sku[p.sku].id for p in valid) if day else set()
            site.reset_stats()
            _crawl(run_env, day)
            stats = site.stats()
            requested = {int(m[1]) for t in stats["requests"] if (m := _PRODUCT.search(t))}
            requests = sum(n for t, n in stats["requests"].items() if _PRODUCT.search(t))
            stored = dict(_query(dsn, "SELECT sku, price FROM products"))
            captured = {
                pid
                for pid in changed
                if stored.get(catalog.product(pid).sku) == clock.serve(catalog.product(pid)).product.price
            }
            unhinted = {pid for pid in changed if pid in clock.no_lastmod}
            updated = _query(
                dsn,
                "SELECT count(*) FROM item_changes WHERE kind = 'update' AND run_id = (SELECT max(run_id) FROM crawl_runs)",
            )[0][0]
            per_day.append(
                {
                    "day": day,
                    "requests": requests,
                    "pages_requested": len(requested),
                    "not_modified": stats["not_modified"],
                    "changes": len(changed),
                    "captured": len(captured),
                    "changes_without_lastmod": len(unhinted),
                    "captured_without_lastmod": len(unhinted & captured),
                    "rows_updated": updated,
                }
            )
            print(
                f"{day:>4}{requests:>10}{stats['not_modified']:>6}{len(changed):>9}{len(captured):>10}"
                f"{len(unhinted & captured):>6}/{len(unhinted):<4}{updated:>9}",
                flush=True,
            )
    gone = _query(dsn, "SELECT count(*) FROM products WHERE gone_at IS NOT NULL")[0][0]
    later = per_day[1:]
    requests = sum(d["requests"] for d in later)
    changes = sum(d["changes"] for d in later)
    captured = sum(d["captured"] for d in later)
    full = len(valid) * days  # a full daily recrawl: every product page, every day
    return {
        "products": len(valid),
        "days": days,
        "without_lastmod": without_lastmod,
        "requests": requests,
        "full_recrawl_requests": full,
        "request_share": requests / full,
        "changes": changes,
        "captured": captured,
        "captured_share": captured / changes if changes else 1.0,
        "captured_without_lastmod": sum(d["captured_without_lastmod"] for d in later),
        "changes_without_lastmod": sum(d["changes_without_lastmod"] for d in later),
        "requests_per_change": requests / captured if captured else float("inf"),
        "full_requests_per_change": full / changes if changes else float("inf"),
        "rows_updated": sum(d["rows_updated"] for d in later),
        "rows_gone": gone,
        "per_day": per_day,
    }


HEADER = f"{'day':>4}{'requests':>10}{'304s':>6}{'changes':>9}{'captured':>10}{'no lastmod':>11}{'updated':>9}"
