"""A revisit run that works is reported as working: daily `scrapy crawl SPIDER --due` runs are
judged by what each meant to visit and against earlier revisit runs, not against full runs.

Day after day of real revisit runs of the demo shop (its change clock moves prices and answers
304 for what did not change), with the exit status for a degraded run on (QUALITY_FAIL_EXIT).
"""

from __future__ import annotations

from datetime import UTC, datetime

from support.crawls import crawl_env, run_scrapy
from test_revisits import on_day

from scraper.demo_site import Catalog, DemoSite
from scraper.demo_site.changes import ChangeClock
from scraper.revisit.schedule import DAY


def test_daily_revisit_runs_of_both_spiders_end_ok_and_exit_0(clean) -> None:
    catalog = Catalog(products=150)
    clock = ChangeClock(catalog, start=datetime.now(UTC))
    with DemoSite(catalog, changes=clock) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, METRICS_ENABLED="false", REVISIT_INITIAL_INTERVAL=str(2 * DAY))
        env.pop("QUALITY_FAIL_EXIT")  # a degraded run exits 3, as a user's cron job sees it
        outcomes = {}
        for spider, days in (("demo_sitemap", range(0, 7)), ("demo", range(0, 5))):
            for day in days:
                site.set_day(day)
                result = run_scrapy(on_day(env, day), "crawl", spider, *(["--due"] if day else []), timeout=240)
                assert "Traceback" not in result.stderr, result.stderr[-4000:]
                run_id = int(clean.query("SELECT max(run_id) FROM run_quality WHERE spider = %s", (spider,))[0][0])
                outcomes[(spider, day)] = clean.query(
                    "SELECT outcome FROM run_quality WHERE spider = %s AND run_id = %s", (spider, run_id)
                )[0][0]
                failed = clean.query(
                    'SELECT "check", subject, expected, observed, note FROM run_checks '
                    "WHERE spider = %s AND run_id = %s AND passed = false",
                    (spider, run_id),
                )
                assert result.returncode == 0 and not failed, (spider, day, failed, result.stderr[-3000:])
        assert set(outcomes.values()) == {"ok"}, outcomes
        # Revisit runs were compared with revisit runs: their items check says what they meant to see.
        notes = [
            r[0]
            for r in clean.query(
                "SELECT note FROM run_checks WHERE \"check\" = 'items_stored' AND note LIKE 'revisit run:%%'"
            )
        ]
        assert len(notes) >= 6, notes
