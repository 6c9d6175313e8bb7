"""The live quality guard with two workers: a broken run holds, and its held changes are applied,
discarded or reverted, each checked row by row against the table and in the history.

The demo shop redesigns half its product pages (prices and brands under new classes). A run of
two workers on it must leave every stored row as it was; `--discard` leaves the table and the
history as if the run never happened; `--apply` leaves them as a run that did not hold
(`QUALITY_ON_BREAK=continue`) would have; `--revert` undoes an applied run.
"""

from __future__ import annotations

import re
from typing import Any

from support.crawls import crawl_env, run_scrapy, run_scrapy_many

from scraper.demo_site import Catalog, DemoSite

PRODUCTS = 40
COLUMNS = "sku, title, brand, price, currency, url, category, availability, released_at, gone_at IS NOT NULL"


def rows(query: Any) -> list[tuple[Any, ...]]:
    return query(f"SELECT {COLUMNS} FROM products ORDER BY sku")


def changes(query: Any, run_id: int | None = None) -> list[tuple[Any, ...]]:
    where = "" if run_id is None else f"WHERE run_id = {int(run_id)}"
    return query(
        f"SELECT item_table, key::text, kind, reason, run_id, changes::text FROM item_changes {where} ORDER BY id"
    )


def crawl(env: dict[str, str], workers: int = 1) -> list[str]:
    results = run_scrapy_many(env, *[("crawl", "demo")] * workers)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return [r.stderr for r in results]


def runs(env: dict[str, str], *args: str) -> str:
    result = run_scrapy(env, "runs", "demo", *args)
    assert result.returncode == 0, (result.stdout, result.stderr[-3000:])
    return result.stdout


def test_a_broken_run_of_two_workers_holds_then_discard_apply_and_revert(clean) -> None:
    with DemoSite(Catalog(products=PRODUCTS), delay_ms=20) as site:
        # Repair off: with it, run 3's break is repaired and run 4 (below) has nothing to hold;
        # what a repair does to a broken run is test_repair_crawl's subject.
        env = crawl_env(
            clean, DEMO_SITE_URL=site.url, CONCURRENT_REQUESTS="4", QUALITY_GUARD_POLL="0.2", REPAIR_ENABLED="false"
        )
        crawl(env)
        crawl(env)
        good = rows(clean.query)
        assert len(good) >= 30 and all(r[2] for r in good) and not any(r[-1] for r in good)
        history_good = changes(clean.query)

        site.break_layout(0.5)
        logs = crawl(env, workers=2)
        # Every node holds: the break is said by the one that saw it and by the other, which learnt it.
        assert any("seen by this node" in log for log in logs), [log[-2000:] for log in logs]
        assert all("Data quality broke in this run" in log for log in logs), [log[-2000:] for log in logs]
        # Row by row, nothing a stored row holds changed: no brand blanked, no price lost, nothing gone.
        assert rows(clean.query) == good
        held = dict(clean.query("SELECT kind, count(*) FROM held_changes WHERE run_id = 3 GROUP BY kind"))
        # An item missing its brand after the guard saw the break is held whole ("item"); one
        # before, its blank waits and is held as a value: which comes first is the fleet's timing.
        assert held.get("item", 0) + held.get("value", 0) > 0 and held.get("gone", 0) > 0, held
        report = runs(env, "--report", "3")
        assert "DEGRADED" in report.splitlines()[0] and "Held by run 3 (its quality broke)" in report, report
        assert "--apply 3" in report

        # --discard: the table and the history as if run 3 had never held anything.
        before_discard = changes(clean.query)
        assert "held change(s) dropped" in runs(env, "--discard", "3")
        assert clean.query("SELECT count(*) FROM held_changes")[0][0] == 0
        assert rows(clean.query) == good and changes(clean.query) == before_discard

        # Run 4, broken the same way, holds again; --apply writes what it held.
        crawl(env)
        assert rows(clean.query) == good
        applied = runs(env, "--apply", "4")
        assert "row(s) written" in applied, applied
        after_apply = rows(clean.query)
        assert after_apply != good
        blanked = {r[0] for r in after_apply if not r[2]}
        gone = {r[0] for r in after_apply if r[-1]}
        assert blanked and gone, (blanked, gone)
        assert clean.query("SELECT count(*) FROM item_changes WHERE run_id = 4 AND reason = 'apply'")[0][0] > 0
        assert clean.query("SELECT count(*) FROM held_changes")[0][0] == 0

        # --revert 4: every row as before run 4, and the undo recorded in the history.
        reverted = runs(env, "--revert", "4")
        assert "reverted:" in reverted, reverted
        assert rows(clean.query) == good
        assert clean.query("SELECT count(*) FROM item_changes WHERE run_id = 4 AND reason = 'revert'")[0][0] > 0
        again = run_scrapy(env, "runs", "demo", "--revert", "4")
        assert again.returncode == 1 and "reverted already" in again.stderr

        # What --apply wrote is what a run that does not hold writes (QUALITY_ON_BREAK=continue).
        crawl({**env, "QUALITY_ON_BREAK": "continue"})
        assert rows(clean.query) == after_apply
        assert clean.query("SELECT count(*) FROM held_changes")[0][0] == 0
        assert history_good == changes(clean.query)[: len(history_good)]


def test_apply_and_revert_refuse_what_they_cannot_do(clean) -> None:
    env = crawl_env(clean)
    both = run_scrapy(env, "runs", "demo", "--apply", "1", "--discard", "1")
    assert both.returncode == 2 and "one spider and one run" in both.stderr
    nothing = run_scrapy(env, "runs", "demo", "--apply", "7")
    assert nothing.returncode == 0 and "holds no changes" in nothing.stdout


def test_prices_are_compared_item_by_item_and_a_shrunk_run_marks_its_rows_gone(clean) -> None:
    with DemoSite(Catalog(products=PRODUCTS)) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, QUALITY_ON_BREAK="continue")
        crawl(env)
        # Stored prices 1000x off (what a misread thousands separator does): the next run reads
        # them right, and item by item every known price jumped.
        clean.query("UPDATE products SET price = price * 1000, content_hash = md5(sku)")
        crawl(env)
        ((passed, note),) = clean.query(
            "SELECT passed, note FROM run_checks WHERE run_id = 2 "
            "AND \"check\" = 'price_pairs' AND subject = 'ProductItem.price'"
        )
        # (One product is free: 0 stays 0.)
        assert passed is False and note.startswith("35 of 36 prices"), note
        assert "ProductItem.price" in clean.query("SELECT affected FROM run_quality WHERE run_id = 2")[0][0]
        # A category gone on purpose is no break: its rows are marked gone.
        removed = site.remove(8)
        crawl(env)
        gone = clean.query("SELECT count(*) FROM products WHERE gone_at IS NOT NULL")[0][0]
        assert gone == len(removed) == 8
        assert not clean.query("SELECT 1 FROM held_changes")


def test_a_spike_of_rejects_holds_the_gone_marks_of_their_live_rows(clean) -> None:
    # Only the price moves in the new layout: the items of those pages are rejected (price is
    # required), no optional field's coverage moves, and the rejects alone must break the run.
    with DemoSite(Catalog(products=PRODUCTS), delay_ms=10) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, QUALITY_GUARD_POLL="0.2", CONCURRENT_REQUESTS="2")
        crawl(env)
        crawl(env)
        good = rows(clean.query)
        site.break_layout(0.5, parts=("price",))
        (log,) = crawl(env)
        said = re.search(r"Data quality broke in this run \(seen by this node\): items rejected for (.*); holding", log)
        assert said and "price " in said.group(1), log[-3000:]
        assert rows(clean.query) == good  # no row the site still serves marked gone
        held = clean.query("SELECT count(*) FROM held_changes WHERE run_id = 3 AND kind = 'gone'")[0][0]
        rejected = clean.query("SELECT count(DISTINCT url) FROM rejects WHERE reasons LIKE 'price%%'")[0][0]
        assert held > 0 and held <= rejected, (held, rejected)
        ((passed, expected),) = clean.query(
            "SELECT passed, expected FROM run_checks WHERE run_id = 3 "
            "AND \"check\" = 'guard' AND subject = 'rejects/price'"
        )
        assert passed is False and expected.startswith("<= "), expected


def test_a_broken_decoupled_run_holds_what_its_processors_saw(clean) -> None:
    # PROCESSING=decoupled: the processors store the items and their guard sees the break; the
    # run (its fetcher's gone-marking, the report, the exit status) must act on it as a node's.
    from test_decoupled import Proc, start_processors

    with DemoSite(Catalog(products=PRODUCTS), delay_ms=20) as site:
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            CONCURRENT_REQUESTS="4",
            QUALITY_GUARD_POLL="0.2",
            REPAIR_ENABLED="false",
            PROCESSING="decoupled",
            METRICS_ENABLED="false",
        )
        redis = clean.redis()

        def run() -> list[str]:
            fetcher = Proc(env, "crawl", "demo")
            [processor] = start_processors(env, "demo", redis)
            logs = [fetcher.finish(), processor.finish()]
            for log in logs:
                assert "Traceback" not in log, log[-3000:]
            return logs

        run()
        run()
        good = rows(clean.query)
        assert len(good) >= 30 and all(r[2] for r in good) and not any(r[-1] for r in good)
        site.break_layout(0.5)
        fetcher_log, processor_log = run()
        assert rows(clean.query) == good  # nothing blanked, nothing marked gone
        held = dict(clean.query("SELECT kind, count(*) FROM held_changes WHERE run_id = 3 GROUP BY kind"))
        assert held.get("gone", 0) > 0, (held, fetcher_log[-3000:])
        assert "Data quality of run 3 of demo: DEGRADED" in fetcher_log, fetcher_log[-3000:]
