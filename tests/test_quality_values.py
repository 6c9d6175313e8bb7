"""The guard holds on values as it holds on coverage: a run whose values move implausibly stores
none of them, a healthy run's few big moves are written once it is judged, a rise of rejects
from none holds the gone-marks, and every node of a broken run exits non-zero.

Real crawls of the demo shop (two nodes where the fleet matters), checked row by row in
Postgres against the rows of the healthy runs before.
"""

from __future__ import annotations

import functools
import re
import threading
from decimal import Decimal
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from support.crawls import crawl_env, run_scrapy, run_scrapy_many

from scraper.demo_site import Catalog, DemoSite

PRODUCTS = 60
COLUMNS = "sku, title, brand, price, currency, url, gone_at IS NOT NULL"


def rows(query: Any) -> dict[str, tuple[Any, ...]]:
    return {r[0]: r for r in query(f"SELECT {COLUMNS} FROM products ORDER BY sku")}


def crawl(env: dict[str, str], workers: int = 1) -> list[Any]:
    results = run_scrapy_many(env, *[("crawl", "demo")] * workers)
    for result in results:
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return results


def healthy(clean: Any, site: DemoSite, **extra: str) -> tuple[dict[str, str], dict[str, tuple[Any, ...]]]:
    """Two healthy runs (the baseline): the crawl's environment and the rows they stored."""
    env = crawl_env(clean, DEMO_SITE_URL=site.url, QUALITY_GUARD_POLL="0.2", **extra)
    for result in crawl(env) + crawl(env):
        assert result.returncode == 0, result.stderr[-3000:]
    return env, rows(clean.query)


def check(query: Any, run_id: int, name: str, subject: str) -> tuple[Any, ...]:
    found = query(
        'SELECT passed, observed, note FROM run_checks WHERE run_id = %s AND "check" = %s AND subject = %s',
        (run_id, name, subject),
    )
    assert len(found) == 1, (
        name,
        subject,
        query('SELECT "check", subject FROM run_checks WHERE run_id = %s', (run_id,)),
    )
    return found[0]


def test_a_bundle_price_on_half_the_pages_stores_no_tripled_price_and_every_node_exits_3(clean) -> None:
    catalog = Catalog(products=PRODUCTS, broken=False)
    with DemoSite(catalog, delay_ms=10) as site:
        env, good = healthy(clean, site, CONCURRENT_REQUESTS="4")
        assert len(good) == len(catalog.valid_products())

        site.break_layout(0.5, parts=("bundle",))
        results = crawl({**env, "QUALITY_FAIL_EXIT": "1"}, workers=2)
        # Both nodes of the broken run say it with their exit status, not only the one that checks.
        assert [r.returncode for r in results] == [3, 3], [r.stderr[-2000:] for r in results]
        # Row by row, no tripled price: every stored row is as the healthy runs left it.
        assert rows(clean.query) == good
        assert clean.query("SELECT count(*) FROM item_changes WHERE run_id = 3 AND changes ? 'price'")[0][0] == 0, (
            "a tripled price reached the history"
        )
        held = clean.query(
            "SELECT key->>0, changes->'price' FROM held_changes WHERE run_id = 3 AND kind = 'value' ORDER BY 1"
        )
        assert len(held) >= PRODUCTS // 4, held
        for sku, (old, new) in held:
            assert Decimal(str(new)) == Decimal(str(old)) * 3, (sku, old, new)
        passed, observed, note = check(clean.query, 3, "price_pairs", "ProductItem.price")
        assert passed is False and "waiting for this verdict" in note, note
        passed, observed, _ = check(clean.query, 3, "held_values", "ProductItem.price")
        assert passed is False and int(observed) == len(held)

        # The shop reverts its template: nothing waits, nothing changes, the run is ok.
        site.break_layout(0.0)
        (result,) = crawl({**env, "QUALITY_FAIL_EXIT": "1"})
        assert result.returncode == 0, result.stderr[-3000:]
        assert rows(clean.query) == good
        assert clean.query("SELECT count(*) FROM held_changes WHERE run_id = 4")[0][0] == 0


def test_a_few_big_moves_in_a_healthy_run_wait_then_are_written(clean) -> None:
    catalog = Catalog(products=PRODUCTS, broken=False)
    with DemoSite(catalog, delay_ms=5) as site:
        env, good = healthy(clean, site)
        # A pack price on a few pages (under QUALITY_PRICE_JUMPS): a sale, not a break.
        site.break_layout(0.05, parts=("bundle",))
        (result,) = crawl({**env, "QUALITY_FAIL_EXIT": "1"})
        assert result.returncode == 0, result.stderr[-3000:]
        now = rows(clean.query)
        moved = {sku for sku in good if now[sku][3] != good[sku][3]}
        assert moved, "no price moved: the drill served no pack price"
        for sku in moved:
            assert now[sku][3] == good[sku][3] * 3
        # Written as the crawl's own changes, once the run was judged; nothing left held.
        assert clean.query("SELECT count(*) FROM held_changes WHERE run_id = 3")[0][0] == 0
        written = clean.query(
            "SELECT count(*) FROM item_changes WHERE run_id = 3 AND reason = 'crawl' AND changes ? 'price'"
        )[0][0]
        assert written == len(moved)
        passed, _, _ = check(clean.query, 3, "price_pairs", "ProductItem.price")
        assert passed is True
        # The live guard judged the moves over every known price, not over the changed rows alone.
        pairs = re.search(r"'values/pairs/ProductItem\.price': (\d+)", result.stderr)
        assert pairs and int(pairs.group(1)) >= len(good) - 2, result.stderr[-2000:]
        assert "Data quality broke" not in result.stderr


def test_rejects_rising_from_none_hold_the_gone_marks_and_no_blank_is_ever_written(clean) -> None:
    # Earlier runs had no reject at all; the new template moves the price (required: those items
    # are rejected) and the brand (optional) on half the pages.
    catalog = Catalog(products=PRODUCTS, broken=False)
    with DemoSite(catalog, delay_ms=10) as site:
        env, good = healthy(clean, site, CONCURRENT_REQUESTS="2")
        assert clean.query("SELECT count(*) FROM rejects")[0][0] == 0
        site.break_layout(0.5)
        results = crawl({**env, "QUALITY_FAIL_EXIT": "1"}, workers=2)
        assert [r.returncode for r in results] == [3, 3], [r.stderr[-2000:] for r in results]
        logs = "".join(r.stderr for r in results)
        assert re.search(r"Data quality broke in this run .*items rejected for [^;]*\bprice ", logs), logs[-3000:]
        # No live row marked gone, no value blanked, not even for a moment: the history of run 3
        # holds no brand going empty and no gone.
        assert rows(clean.query) == good
        assert clean.query("SELECT count(*) FROM item_changes WHERE run_id = 3")[0][0] == 0
        held = dict(clean.query("SELECT kind, count(*) FROM held_changes WHERE run_id = 3 GROUP BY kind"))
        assert held.get("gone", 0) > 0, held


def test_report_checks_held_values_and_apply_refuses_what_would_fail(clean) -> None:
    # The same redesign loses the brand (a coverage break: those items are held whole) and shows
    # pack prices: the held items carry tripled prices the report must name.
    catalog = Catalog(products=PRODUCTS, broken=False)
    with DemoSite(catalog, delay_ms=5) as site:
        env, good = healthy(clean, site)
        site.break_layout(0.6, parts=("bundle", "brand"))
        crawl(env)
        assert rows(clean.query) == good
        report = run_scrapy(env, "runs", "demo", "--report", "3")
        assert report.returncode == 0, report.stderr[-2000:]
        assert "would fail: ProductItem.price" in report.stdout, report.stdout
        refused = run_scrapy(env, "runs", "demo", "--apply", "3")
        assert refused.returncode == 1 and "fail its checks" in refused.stderr, (refused.stdout, refused.stderr)
        assert rows(clean.query) == good  # refused: nothing written
        forced = run_scrapy(env, "runs", "demo", "--apply", "3", "--force")
        assert forced.returncode == 0 and "warning: writing values that fail" in forced.stdout, forced.stdout
        assert any(rows(clean.query)[sku][3] == good[sku][3] * 3 for sku in good)


def test_a_first_run_that_stored_nothing_is_degraded(clean, tmp_path) -> None:
    # A shop whose products exist only after its script runs: the page has no link a spider
    # written for plain HTML can follow.
    (tmp_path / "index.html").write_text(
        "<html><body><div id='app'></div><script src='/app.js'></script></body></html>", encoding="utf-8"
    )
    (tmp_path / "robots.txt").write_text("User-agent: *\nAllow: /\n", encoding="utf-8")
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        env = crawl_env(clean, DEMO_SITE_URL=url)
        env.pop("QUALITY_FAIL_EXIT")
        (result,) = crawl(env)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 3, result.stderr[-3000:]
    assert "DEGRADED" in result.stderr and "the run stored no item" in result.stderr, result.stderr[-3000:]
    passed, observed, _ = check(clean.query, 1, "items_stored", "")
    assert passed is False and observed == "0"


def test_a_value_the_cleaner_cannot_read_is_said_checked_and_held(clean) -> None:
    catalog = Catalog(products=PRODUCTS, broken=False)
    with DemoSite(catalog, delay_ms=5) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, QUALITY_GUARD_POLL="0.2")
        # First run: every release date reads "Published on ...": said, and a failed check.
        site.break_layout(1.0, parts=("published",))
        (first,) = crawl(env)
        said = re.search(r"Unreadable: ProductItem\.released_at could not be read in (\d+) item\(s\)", first.stderr)
        assert said and int(said.group(1)) >= PRODUCTS // 2, first.stderr[-3000:]
        passed, observed, _ = check(clean.query, 1, "unreadable", "ProductItem.released_at")
        assert passed is False and float(observed.rstrip("%")) > 50
        assert clean.query("SELECT outcome FROM run_quality WHERE run_id = 1")[0][0] == "degraded"

        # Two healthy runs, then half the dates unreadable: the guard holds like missing coverage.
        site.break_layout(0.0)
        crawl(env)
        crawl(env)
        good = rows(clean.query)
        dates = dict(clean.query("SELECT sku, released_at FROM products"))
        site.break_layout(0.5, parts=("published",))
        (broken,) = crawl(env)
        assert "Data quality broke in this run" in broken.stderr and "ProductItem.released_at" in broken.stderr
        assert rows(clean.query) == good and dict(clean.query("SELECT sku, released_at FROM products")) == dates
        assert clean.query("SELECT count(*) FROM held_changes WHERE run_id = 4")[0][0] > 0
