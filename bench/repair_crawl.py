"""Self-healing extraction in real crawls: for each kind of redesign, what a spider left untouched
stores, and how many of the value changes the second run after the change captures.

Per kind, a fresh database and the demo shop (``--products`` products): two healthy runs of the
README's ``demo`` spider (the stored values a repair learns from), then the redesign together
with a price change on ``--changes`` products (``churn``: 60 % of them), the break run, and the
run after it. Counted, row by row against what the shop served:

* **wrong**: stored prices (or currencies) that the shop never showed for that product;
* **captured**: changed products whose stored price is the new one after the second run;
* **repairs**: repairs recorded (the control must have none), and what they read with.

The redesigned pages lose their JSON-LD, except in ``jsonld-only`` (where it is all that is
left): it would give the price away on every page. Needs ``DATABASE_URL`` (a server where the
bench may create databases) and ``REDIS_URL``.

    .venv/bin/python bench/repair_crawl.py [--products 300] [--changes 20] [--kinds rename,decoy]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import zlib
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scraper.demo_site import Catalog, DemoSite, layout  # noqa: E402
from scraper.demo_site.catalog import Product  # noqa: E402

_JSONLD = re.compile(r'<script type="application/ld\+json">.*?</script>', re.S)
_BOX = re.compile(r'<p class="price-box">Price: <span class="price">(.*?)</span></p>\n')


def _chance(product: Product, part: str, share: float) -> bool:
    return zlib.crc32(f"{part}:{product.id}".encode()) % 1000 < share * 1000


def _rename(text: str, product: Product) -> str:
    return text.replace('class="price"', 'class="amount"')


def _wrap(text: str, product: Product) -> str:
    return _BOX.sub(
        r'<div class="pricing"><div class="price-wrap"><p class="cost">Price: <span>\1</span></p></div></div>\n', text
    )


def _move(text: str, product: Product) -> str:
    box = _BOX.search(text)
    text = _BOX.sub("", text)
    return text.replace("</h1>", f'</h1>\n<div class="buy"><b class="now">{box.group(1)}</b></div>', 1) if box else text


def _facts(text: str, product: Product) -> str:
    rows = "<dt>Weight</dt><dd>1 kg</dd>" if product.id % 3 else ""
    return _BOX.sub(rf'<table class="facts"><tr><th>Price</th><td>\1</td></tr>{rows}</table>\n', text)


def _attribute(text: str, product: Product) -> str:
    return _BOX.sub(f'<button class="add-to-cart" data-price="{product.jsonld_price}">Add to cart</button>\n', text)


def _microdata(text: str, product: Product) -> str:
    return _BOX.sub(
        f'<div class="offer"><meta itemprop="price" content="{product.jsonld_price}">'
        '<span class="call">Ask for our price</span></div>\n',
        text,
    )


def _jsonld_only(text: str, product: Product) -> str:
    return _BOX.sub("", text)


def _half(text: str, product: Product) -> str:
    return _facts(text, product) if _chance(product, "rollout", 0.5) else _rename(text, product)


def _decoy(catalog: Catalog):
    others = [p for p in catalog.valid_products() if p.price is not None]

    def change(text: str, product: Product) -> str:
        picks = [o for o in others if o.id != product.id][product.id % 7 : product.id % 7 + 3]
        block = "".join(
            f'<li><a href="/p/{o.id}.html">{o.title}</a> <span class="price">{o.price_display}</span></li>'
            for o in picks
        )
        return _rename(text, product).replace(
            '<p class="price-box">', f'<ul class="related">{block}</ul>\n<p class="price-box">', 1
        )

    return change


def kinds(catalog: Catalog) -> dict[str, tuple[Any, float, bool]]:
    """Name -> (the page change, the share of pages it reaches, whether churn goes with it)."""
    return {
        "control": (None, 0.0, False),
        "rename": (_rename, 1.0, False),
        "wrapper": (_wrap, 1.0, False),
        "moved": (_move, 1.0, False),
        "dl-to-table": (_facts, 1.0, False),
        "related-decoy": (_decoy(catalog), 1.0, False),
        "attribute": (_attribute, 1.0, False),
        "microdata": (_microdata, 1.0, False),
        "jsonld-only": (_jsonld_only, 1.0, False),
        "partial-rollout": (_half, 1.0, False),
        "half-the-pages": (_rename, 0.5, False),
        "churn-60%": (_rename, 1.0, True),
    }


def _database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    admin = psycopg2.connect(dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    return urlunsplit(parts._replace(path=f"/{name}"))


def _query(dsn: str, sql: str) -> list[tuple]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()
    finally:
        conn.close()


def _crawl(env: dict[str, str], healthy: bool = False) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if os.environ.get("REPAIR_BENCH_LOGS"):
        _crawl.n = getattr(_crawl, "n", 0) + 1
        Path(os.environ["REPAIR_BENCH_LOGS"], f"crawl-{_crawl.n}.log").write_text(done.stderr)
    if "Traceback" in done.stderr or (healthy and done.returncode != 0):
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit("repair bench: a crawl raised")
    return done.returncode


def served(site: DemoSite) -> dict[str, tuple[Decimal, str]]:
    return {p.sku: (p.price, p.currency) for p in site._renderer.catalog.valid_products() if p.price is not None}


def measure(dsn: str, redis_url: str, name: str, products: int, changes: int) -> dict[str, Any]:
    catalog = Catalog(products=products, broken=False)
    change, share, churn = kinds(catalog)[name]
    if change is not None:
        keep_jsonld = name == "jsonld-only"
        layout.define(f"bench-{name}", lambda text, p: change(text if keep_jsonld else _JSONLD.sub("", text), p))
    database = _database(dsn, "bench_repair")
    redis.Redis.from_url(redis_url).flushdb()
    with DemoSite(catalog, delay_ms=2) as site:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DATABASE_URL": database,
            "REDIS_URL": redis_url,
            "DEMO_SITE_URL": site.url,
            "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
            "POLITENESS_SLOW_START_RATE": "0",
            "SCHEDULER_IDLE_TIMEOUT": "1",
            "METRICS_ENABLED": "false",
            "QUALITY_FAIL_EXIT": "1",
            "QUALITY_GUARD_POLL": "0.2",
            "REPAIR_POLL": "0.5",
            "SCHEDULER_SECRET": os.environ.get("SCHEDULER_SECRET") or "bench-fleet-secret-0123456789",
        }
        for _ in range(2):
            _crawl(env, healthy=True)
        before = served(site)
        shown: dict[str, set[tuple[Decimal, str]]] = {sku: {v} for sku, v in before.items()}
        changed = set(site.reprice(int(0.6 * products) if churn else changes))
        after = served(site)
        for sku, v in after.items():
            shown.setdefault(sku, set()).add(v)
        changed_skus = {sku for sku in after if after[sku][0] != before.get(sku, (None,))[0]}
        if change is not None:
            site.break_layout(share, parts=(f"bench-{name}",))
        started = time.monotonic()
        exits = [_crawl(env), _crawl(env)]
        seconds = time.monotonic() - started
    rows = _query(database, "SELECT sku, price, currency FROM products")
    wrong = sum(1 for sku, price, currency in rows if (price, currency) not in shown.get(sku, set()))
    now = {sku: price for sku, price, _ in rows}
    captured = sum(1 for sku in changed_skus if now.get(sku) == after[sku][0])
    repairs = _query(database, "SELECT status, rules FROM repairs ORDER BY id")
    return {
        "kind": name,
        "exits": exits,
        "wrong": wrong,
        "changes": len(changed_skus),
        "captured": captured,
        "repairs": [(s, r) for s, r in repairs],
        "seconds": seconds,
        "repriced": len(changed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=300)
    parser.add_argument("--changes", type=int, default=20, help="products repriced with the redesign (churn: 60 %%)")
    parser.add_argument("--kinds", default="", help="comma-separated kinds (default: all)")
    args = parser.parse_args()
    dsn = os.environ.get("DATABASE_URL") or sys.exit("repair bench: DATABASE_URL is not set")
    redis_url = os.environ.get("REDIS_URL") or sys.exit("repair bench: REDIS_URL is not set")
    names = [k for k in args.kinds.split(",") if k] or list(kinds(Catalog(products=10, broken=False)))
    print(f"{'kind':<16}{'exit':>8}{'wrong':>7}{'captured':>12}  repairs", flush=True)
    for name in names:
        r = measure(dsn, redis_url, name, args.products, args.changes)
        rules = "; ".join(f"{s}: {' | '.join(rs) or '-'}" for s, rs in r["repairs"]) or "none"
        print(
            f"{name:<16}{'/'.join(map(str, r['exits'])):>8}{r['wrong']:>7}{r['captured']:>6}/{r['changes']:<5}  {rules}",
            flush=True,
        )


if __name__ == "__main__":
    main()
