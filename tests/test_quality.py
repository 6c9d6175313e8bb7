"""Data quality: real runs of the demo spider against the demo shop, good and broken.

A good run passes every check; a run against the broken layout fails coverage and the
item-count check with the fields named, in the log, in Postgres, in `scrapy runs --report`, in
the metrics and in the exit status when asked; a run that stops early is never compared with
nor compared against.
"""

from __future__ import annotations

import json
import re
import socket

from support.crawls import crawl_env, run_scrapy
from support.errors import check_one_line_error
from support.processes import fetch, start_crawl, wait_for

from scraper.demo_site import Catalog, DemoSite

PRODUCTS = 40


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def checks(query, run_id: int) -> dict[tuple[str, str], tuple[bool | None, str, str]]:
    rows = query(
        'SELECT "check", subject, passed, note, observed FROM run_checks WHERE spider = %s AND run_id = %s',
        ("demo", run_id),
    )
    return {(check, subject): (passed, note, observed) for check, subject, passed, note, observed in rows}


def crawl_run(env: dict[str, str], *args: str, expect_status: int = 0) -> str:
    result = run_scrapy(env, "crawl", "demo", *args)
    assert result.returncode == expect_status, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr


def metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_good_runs_pass_and_a_broken_layout_fails_with_the_fields_named(clean) -> None:
    # The guard's own behaviour on a layout that stays broken: no repair reads it (see test_repair_*).
    with DemoSite(Catalog(products=PRODUCTS)) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, REPAIR_ENABLED="false")
        first = crawl_run(env)
        assert "Data quality of run 1 of demo: OK" in first, first[-3000:]
        second = crawl_run(env)
        assert "Data quality of run 2 of demo: OK (0 of" in second and "compared with run 1)" in second
        got = checks(clean.query, 2)
        assert not [k for k, (passed, *_) in got.items() if passed is False], got
        # Every run-over-run figure was compared, not skipped.
        for check in (
            "items_stored",
            "pages_per_item",
            "error_responses",
            "blocked_responses",
            "empty_responses",
            "gone",
        ):
            assert got[(check, "")][0] is True, (check, got)
        assert got[("coverage", "ProductItem.brand")][0] is True and got[("rejects", "price")][0] is True
        assert got[("price_pairs", "ProductItem.price")][0] is True
        assert got[("price_pairs", "ProductItem.price")][1].startswith("0 of ")

        # The shop redesigns half its product pages: prices and brands move to new classes.
        rows_before = clean.query("SELECT sku, brand, price, gone_at FROM products ORDER BY sku")
        site.break_layout(0.5)
        # Degraded is exit 3 by default.
        default_exit = crawl_env(clean, DEMO_SITE_URL=site.url, REPAIR_ENABLED="false")
        del default_exit["QUALITY_FAIL_EXIT"]
        broken = crawl_run(default_exit, expect_status=3)
        assert "Data quality of run 3 of demo: DEGRADED" in broken, broken[-3000:]
        assert "Data quality broke in this run (seen by this node): field coverage ProductItem." in broken
        assert "nothing is marked gone" in broken
        got = checks(clean.query, 3)
        failed = {k for k, (passed, *_) in got.items() if passed is False}
        assert {("items_stored", ""), ("guard", "ProductItem.brand"), ("rejects", "price")} <= failed, got
        # The guard held: no stored brand blanked, no row the site still serves marked gone.
        rows_after = clean.query("SELECT sku, brand, price, gone_at FROM products ORDER BY sku")
        assert [(sku, brand) for sku, brand, _, _ in rows_after] == [(sku, brand) for sku, brand, _, _ in rows_before]
        assert all(brand for _, brand, _, _ in rows_after) and not [r for r in rows_after if r[3] is not None]
        held = clean.query("SELECT count(*) FROM held_changes WHERE run_id = 3 AND kind = 'item'")[0][0]
        assert held > 0 and not clean.query("SELECT 1 FROM rejects WHERE reasons LIKE '%%held%%'")
        # What was blanked before the guard had seen enough items was written back, and the history
        # says both: each blank of run 3 has its restoration.
        blanked = clean.query(
            "SELECT key::text FROM item_changes WHERE run_id = 3 AND reason = 'crawl' "
            "AND changes->'brand'->1 = 'null'::jsonb ORDER BY 1"
        )
        restored = clean.query(
            "SELECT key::text FROM item_changes WHERE run_id = 3 AND reason = 'guard' AND changes ? 'brand' ORDER BY 1"
        )
        assert blanked == restored and len(blanked) <= 10, (blanked, restored)
        assert (
            "more rejects for price +" in got[("items_stored", "")][1]
            and "held for brand " in got[("items_stored", "")][1]
        )
        # What the new layout did not touch is not flagged (with the broken items held, fewer
        # than QUALITY_MIN_ITEMS may be stored: then their coverage is skipped, not failed).
        assert got[("coverage", "ProductItem.title")][0] is not False
        assert got[("coverage", "ProductItem.released_at")][0] is not False
        assert ("guard", "ProductItem.title") not in got
        # Every price stored is right: compared item by item (here fewer than QUALITY_MIN_ITEMS
        # pairs: skipped), no false alarm.
        assert got[("price_pairs", "ProductItem.price")][0] is not False, got
        affected = clean.query("SELECT affected FROM run_quality WHERE run_id = 3")[0][0]
        assert "ProductItem.brand" in affected and "price" in affected, affected
        assert clean.query("SELECT run_id, outcome, baseline FROM run_quality ORDER BY run_id") == [
            (1, "ok", []),
            (2, "ok", [1]),
            (3, "degraded", [2, 1]),
        ]

        # The report on demand, and the outcome among the runs.
        shown = run_scrapy(env, "runs", "demo", "--report", "3")
        assert shown.returncode == 0, shown.stderr[-2000:]
        assert shown.stdout.startswith("Data quality of run 3 of demo: DEGRADED"), shown.stdout
        assert re.search(r"FAIL\s+guard ProductItem\.brand\s+expected >= 0\.95", shown.stdout), shown.stdout
        assert re.search(r"affected: .*ProductItem\.brand.*price", shown.stdout), shown.stdout
        listed = [json.loads(line) for line in run_scrapy(env, "runs", "demo", "--json").stdout.splitlines()]
        assert [(r["run_id"], r["quality"]) for r in listed] == [(3, "degraded"), (2, "ok"), (1, "ok")]

        # Still broken, watched while it runs: the coverage of the run so far under its
        # expectation, the last run degraded; and without QUALITY_FAIL_EXIT the exit status is 0.
        site.delay = 0.1
        port = free_port()
        crawl = start_crawl(
            crawl_env(
                clean,
                DEMO_SITE_URL=site.url,
                REPAIR_ENABLED="false",
                CONCURRENT_REQUESTS="1",
                QUALITY_FAIL_EXIT="0",
                RUNS_REPORT_INTERVAL="0.2",
                METRICS_PORT=str(port),
                METRICS_PORT_RANGE="1",
            )
        )

        def scraped() -> str | None:
            try:
                text = fetch(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                return None
            items = metric(text, "scraper_field_coverage_items", item_type="ProductItem")
            return text if items and items >= 5 else None

        text = wait_for(scraped, timeout=60)
        coverage = metric(text, "scraper_field_coverage", item_type="ProductItem", field="brand")
        expected = metric(text, "scraper_field_coverage_expected", item_type="ProductItem", field="brand")
        assert coverage is not None and expected == 0.95 and coverage < expected, text
        assert metric(text, "scraper_field_coverage", field="title") == 1.0
        assert metric(text, "scraper_quality_last_run_degraded", spider="demo", run="3") == 1.0
        assert metric(text, "scraper_quality_last_run_failed_checks", spider="demo") >= 3

        def guard_broken() -> str | None:
            try:
                text = fetch(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                return None
            return text if metric(text, "scraper_quality_guard_broken", spider="demo") == 1.0 else None

        text = wait_for(guard_broken, timeout=60)
        assert metric(text, "scraper_quality_held_items_total", spider="demo") >= 0
        log = crawl.communicate(timeout=120)[1]
        assert crawl.returncode == 0 and "Data quality of run 4 of demo: DEGRADED" in log, log[-3000:]

        # QUALITY_ON_BREAK=stop: the spider closes at the break, no more pages fetched, exit 3.
        site.delay = 0.05
        stopped = crawl_run(
            crawl_env(
                clean,
                DEMO_SITE_URL=site.url,
                CONCURRENT_REQUESTS="2",
                QUALITY_ON_BREAK="stop",
                QUALITY_FAIL_EXIT="1",
                REPAIR_ENABLED="false",
            ),
            expect_status=3,
        )
        assert "stopping the spider (QUALITY_ON_BREAK=stop)" in stopped, stopped[-3000:]
        assert "'finish_reason': 'quality_break'" in stopped, stopped[-3000:]
        pages = int(re.search(r"'response_received_count': (\d+)", stopped).group(1))
        assert pages < 40, pages  # a whole run fetches 54


def test_a_run_that_stops_early_is_not_compared(clean) -> None:
    with DemoSite(Catalog(products=PRODUCTS)) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url)
        crawl_run(env)
        stopped = crawl_run(env, "-s", "CLOSESPIDER_PAGECOUNT=5")
        assert "Run 2 of demo stopped" in stopped, stopped[-3000:]
        assert "Data quality of run 2 of demo: not checked yet (stopped)" in stopped, stopped[-3000:]
        # Discard it: the next run is compared with run 1 alone, never with the stopped one.
        result = run_scrapy(env, "crawl", "demo", "--fresh")
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Data quality of run 3 of demo: OK (0 of" in result.stderr, result.stderr[-3000:]
    assert clean.query("SELECT run_id, outcome, baseline FROM run_quality ORDER BY run_id") == [
        (1, "ok", []),
        (3, "ok", [1]),
    ]
    assert clean.query("SELECT finish_reason FROM crawl_runs WHERE run_id = 2") == [("discarded",)]
    shown = run_scrapy(env, "runs", "demo", "--report", "2")
    assert shown.returncode == 1 and "run 2 of demo has no data-quality report" in shown.stderr


def test_demo_drill_ends_with_the_failed_checks(clean) -> None:
    env = crawl_env(clean)
    env.pop("SCHEDULER_IDLE_TIMEOUT")
    port = str(free_port())
    good = run_scrapy(env, "demo", "--products", str(PRODUCTS), "--port", port)
    assert good.returncode == 0, good.stderr[-3000:]
    assert "demo: Data quality of run 1 of demo: OK" in good.stdout, good.stdout
    drill = run_scrapy(env, "demo", "--products", str(PRODUCTS), "--port", port, "--break-layout")
    assert drill.returncode == 0, drill.stderr[-3000:]
    tail = drill.stdout[drill.stdout.index("Data quality of run 2") :]
    assert "DEGRADED" in tail.splitlines()[0], tail
    assert re.search(r"failed: .*items_stored.*guard ProductItem\.brand", tail), tail
    assert "more rejects for price" in tail


def test_a_bad_quality_setting_fails_at_start_by_name(services) -> None:
    env = crawl_env(services, QUALITY_ITEMS_DROP="2")
    line = check_one_line_error(run_scrapy(env, "crawl", "demo"), "QUALITY_ITEMS_DROP")
    assert "at most 1" in line
    env = crawl_env(services, QUALITY_BASELINE_RUNS="none")
    check_one_line_error(run_scrapy(env, "crawl", "demo"), "QUALITY_BASELINE_RUNS")
