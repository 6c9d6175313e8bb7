"""Runs: a crash, a kill or a Ctrl-C at any moment never turns the next run into a no-op."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

from support.crawls import (
    ROOT,
    assert_each_page_once,
    assert_each_product_stored_or_rejected_once,
    crawl_env,
    project_with_spider,
    run_scrapy,
    scrapy_cmd,
)
from support.processes import start_crawl, wait_for
from support.queue import queue_depth
from support.stats import stat

from scraper.backends.redis_client import get_redis
from scraper.demo_site import Catalog, DemoSite
from scraper.queue import keys
from scraper.runs import record
from scraper.runs.nodes import NodeRegistry
from scraper.runs.state import RunState

NODE_TTL = "3"


def outcomes(log: str) -> dict[str, float]:
    return {o: stat(log, f"postgres/{o}") for o in ("inserted", "updated", "unchanged")}


def rerun(env: dict[str, str]) -> str:
    result = run_scrapy(env, "crawl", "demo")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr


def test_a_killed_worker_never_makes_the_next_run_a_no_op(clean) -> None:
    catalog = Catalog(products=70)
    valid = len(catalog.valid_products())
    with DemoSite(catalog, delay_ms=40) as site:
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            CONCURRENT_REQUESTS="6",
            SCHEDULER_LEASE_TIMEOUT="2",
            SCHEDULER_IDLE_TIMEOUT="2",
            RUNS_NODE_TTL=NODE_TTL,
        )
        repriced: set[str] = set()
        for round, pause in enumerate((0.0, float(NODE_TTL) + 1)):
            site.reset_stats()
            workers = [start_crawl(env) for _ in range(2)]
            wait_for(lambda: site.stats()["total"] > 35, timeout=60, step=0.05)
            workers[0].proc.send_signal(signal.SIGKILL)
            survivor = workers[1].communicate(timeout=120)[1]
            workers[0].communicate(timeout=10)
            assert "Spider closed (finished)" in survivor, survivor[-3000:]
            assert f"Run {round * 2 + 1} of demo finished on every node" in survivor, survivor[-3000:]
            assert_each_product_stored_or_rejected_once(clean.query, catalog)

            # The shop changes 5 prices; the spider runs again at once (the dead worker's last
            # heartbeat is still fresh), then after the node TTL.
            ids = site.reprice(5 * (round + 1))
            changed = {catalog.product(i).sku for i in ids} - repriced
            repriced |= changed
            time.sleep(pause)
            before = clean.query("SELECT now()")[0][0]
            log = rerun(env)
            assert f"starting run {round * 2 + 2} of demo" in log, log[-3000:]
            assert outcomes(log) == {"inserted": 0, "updated": 5, "unchanged": valid - 5}, outcomes(log)
            assert {
                sku for (sku,) in clean.query("SELECT sku FROM products WHERE updated_at > %s", (before,))
            } == changed
    runs = clean.query("SELECT run_id, state, items_updated, items_new FROM crawl_runs ORDER BY run_id")
    assert [(r, s) for r, s, _, _ in runs] == [(1, "finished"), (2, "finished"), (3, "finished"), (4, "finished")]
    assert runs[1][2] == runs[3][2] == 5
    # `scrapy runs` shows the same, newest first; the killed worker counts as a node seen.
    shown = run_scrapy(env, "runs", "demo", "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(r["run_id"], r["state"], r["items_updated"]) for r in rows] == [
        (4, "finished", 5),
        (3, "finished", 0),
        (2, "finished", 5),
        (1, "finished", 0),
    ]
    assert rows[3]["nodes_seen"] == 2 and rows[0]["items_unchanged"] == valid - 5 and rows[0]["pages"] > valid


class Logged:
    """A crawl whose log can be read while it runs."""

    def __init__(self, env: dict[str, str], path: Path, *args: str) -> None:
        self.path = path
        self.proc = subprocess.Popen(
            scrapy_cmd("crawl", "demo", *args), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=path.open("w")
        )

    def text(self) -> str:
        return self.path.read_text()

    def finish(self, timeout: float = 120) -> str:
        self.proc.wait(timeout=timeout)
        return self.text()


def test_ctrl_c_at_each_stage_then_run_again(clean, tmp_path: Path) -> None:
    catalog = Catalog(products=50)
    pages = sorted(catalog.pages())
    with DemoSite(catalog, delay_ms=30) as site:
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            CONCURRENT_REQUESTS_PER_DOMAIN="2",
            SCHEDULER_IDLE_TIMEOUT="3",
            SCHEDULER_LEASE_TIMEOUT="3",
            RUNS_NODE_TTL=NODE_TTL,
            POSTGRES_FLUSH_INTERVAL="2",
            POSTGRES_BATCH_SIZE="10000",
        )
        served = lambda: sum(n for p, n in site.stats()["requests"].items() if p != "/robots.txt")  # noqa: E731
        stages = {
            "fetching": lambda c: served() >= 15,
            "idle wait": lambda c: "Shared queue empty; closing in" in c.text(),
            # Every page fetched, the last items still wait for the writer's next flush.
            "final flush": lambda c: served() >= len(pages),
        }
        for number, (stage, reached) in enumerate(stages.items()):
            clean.redis().flushdb()
            clean.query("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
            site.reset_stats()
            first = Logged(env, tmp_path / f"{number}-first.log")
            wait_for(lambda reached=reached, first=first: reached(first), timeout=60, step=0.02)
            first.proc.send_signal(signal.SIGINT)
            log = first.finish()
            assert first.proc.returncode == 0 and "Spider closed (shutdown)" in log, log[-3000:]
            queued = queue_depth(clean.redis(), "{demo}:requests")
            fetched_first = {p for p, n in site.stats()["requests"].items() if p != "/robots.txt"}
            site.reset_stats()
            second = rerun(env)
            counts = {p: n for p, n in site.stats()["requests"].items() if p != "/robots.txt"}
            if stage == "fetching":
                assert queued > 0, log[-3000:]
                assert f"resuming run 1 of demo ({queued:,} queued)" in second, second[-3000:]
                # The two runs together fetched each page once.
                assert not set(counts) & fetched_first and sorted(set(counts) | fetched_first) == pages
            else:
                assert queued == 0 and "Run 1 of demo finished on every node" in log, log[-3000:]
                assert "starting run 2 of demo" in second, second[-3000:]
                assert_each_page_once(counts, catalog)  # run 2: the aliases run 1 learnt apply
            assert f"Run {1 if stage == 'fetching' else 2} of demo finished on every node" in second
            assert_each_product_stored_or_rejected_once(clean.query, catalog)


def test_a_silent_node_of_another_host_holds_the_next_run_until_the_node_ttl(clean, site: DemoSite) -> None:
    # A run whose only node lives on another machine and has just gone quiet: it may still
    # queue more (join it) or be dead (its run is finished once it stays silent for the TTL).
    server = clean.redis()
    server.hset("{demo}:run", mapping={"id": 7, "state": "running", "started": time.time() - 30})
    server.hset("{demo}:nodes", "elsewhere:4242:abcdef", time.time())
    server.hset("{demo}:nodes:info", "elsewhere:4242:abcdef", '{"host": "elsewhere/boot/1", "pid": 4242}')
    server.sadd("{demo}:dupefilter", "stale fingerprint of run 7")
    log = rerun(crawl_env(clean, DEMO_SITE_URL=site.url, RUNS_NODE_TTL="8"))
    assert re.search(r"Waiting for run 7 of demo: 1 live node \(elsewhere:4242;", log), log[-3000:]
    assert "starting run 8 of demo" in log
    assert "Run 7 of demo had finished" in log
    assert site.stats()["requests"].get("/") == 1
    assert_each_product_stored_or_rejected_once(clean.query, site.catalog)
    assert clean.query("SELECT run_id, state FROM crawl_runs ORDER BY run_id") == [(7, "finished"), (8, "finished")]


def test_fresh_discards_a_stopped_run_and_says_what_it_drops(clean, site: DemoSite) -> None:
    env = crawl_env(clean, DEMO_SITE_URL=site.url)
    seeded = run_scrapy(env, "seed", "demo", site.url + "c/audio/", site.url + "c/lighting/")
    assert seeded.returncode == 0, seeded.stderr[-2000:]
    clean.redis().hset("{demo}:run", mapping={"id": 3, "state": "stopped", "started": time.time() - 60})
    clean.redis().sadd("{demo}:dupefilter", "fingerprint of run 3")
    result = run_scrapy(env, "crawl", "demo", "--fresh")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Discarded run 3 of demo (--fresh): 2 queued or leased requests dropped" in result.stderr
    assert "starting run 4 of demo" in result.stderr
    assert site.stats()["requests"].get("/") == 1
    assert_each_product_stored_or_rejected_once(clean.query, site.catalog)
    assert clean.query("SELECT run_id, state, finish_reason FROM crawl_runs ORDER BY run_id") == [
        (3, "finished", "discarded"),
        (4, "finished", "finished"),
    ]


SLOW_TO_CLOSE = """
import os
import time

from scraper.spiders.demo import DemoSpider


class SlowToCloseSpider(DemoSpider):
    name = "slowclose"

    def closed(self, reason):
        # Runs first of the spider_closed handlers: this node has left its run and the
        # extensions' closing reports wait behind it.
        time.sleep(float(os.environ.get("SLOW_CLOSE", "0")))
"""


def test_the_last_node_out_judges_the_run_with_every_node_figures_however_close_they_leave(
    clean, tmp_path: Path
) -> None:
    # Node A leaves the run a moment before node B, and B, last out, finishes and judges it at
    # once: A's figures must be in Redis by then, not in A's closing report that comes later.
    project = project_with_spider(tmp_path, "slowclose", SLOW_TO_CLOSE)
    catalog = Catalog(products=40)
    # Slow enough that B, started once A has begun, joins A's run even on a loaded machine
    # (at 200 ms a page A once finished before B's start-up did).
    with DemoSite(catalog, delay_ms=500) as site:
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            PYTHONPATH=str(project),
            CONCURRENT_REQUESTS_PER_DOMAIN="2",
            RUNS_REPORT_INTERVAL="600",
            METRICS_ENABLED="false",
        )
        del env["QUALITY_FAIL_EXIT"]  # the default: a degraded run exits 3
        first = start_crawl({**env, "SCHEDULER_IDLE_TIMEOUT": "1", "SLOW_CLOSE": "6"}, spider="slowclose", cwd=project)
        wait_for(lambda: site.stats()["total"] >= 1, timeout=60, step=0.05)
        second = start_crawl({**env, "SCHEDULER_IDLE_TIMEOUT": "3"}, spider="slowclose", cwd=project)
        logs = [first.communicate(timeout=120)[1], second.communicate(timeout=120)[1]]
    assert "joining run 1 of slowclose" in logs[1], logs[1][-3000:]
    assert "run 1 goes on with 1 other live node" in logs[0], logs[0][-3000:]
    assert "Run 1 of slowclose finished on every node" in logs[1], logs[1][-3000:]
    for proc, log in zip((first, second), logs):
        assert proc.returncode == 0 and "Traceback" not in log, log[-3000:]
    stored = clean.query("SELECT count(*) FROM products")[0][0]
    assert stored == len(catalog.valid_products())
    [(new, nodes)] = clean.query("SELECT items_new, nodes_seen FROM crawl_runs WHERE spider = 'slowclose'")
    assert (new, nodes) == (stored, 2)
    [(figures,)] = clean.query("SELECT figures FROM run_quality WHERE spider = 'slowclose'")
    assert figures["items/stored"] == stored, figures


def test_a_finished_run_row_takes_no_older_view(clean) -> None:
    # Each node writes the run's row from what it saw; the last node out's finished row must not
    # be overwritten by one that left while the run went on and committed late, nor lose its
    # time and reason to one that read after the next run began.
    conn = record.connect(clean.database_url)
    try:
        started, ended = "1700000000", "1700000600"
        last_out = {"state": "finished", "started": started, "finished": ended, "reason": "finished"}
        record.upsert(conn, "rows", 1, last_out, {"postgres/inserted": 5}, 2)
        record.upsert(conn, "rows", 1, {"state": "running", "started": started}, {"postgres/inserted": 3}, 2)
        record.upsert(conn, "rows", 1, {"state": "finished", "reason": "shutdown"}, {"postgres/inserted": 5}, 2)
    finally:
        conn.close()
    [(state, finished, reason, new)] = clean.query(
        "SELECT state, extract(epoch FROM finished)::bigint, finish_reason, items_new FROM crawl_runs WHERE spider = 'rows'"
    )
    assert (state, finished, reason, new) == ("finished", int(ended), "finished", 5)


def test_the_finish_moves_the_item_claims_out_of_the_next_runs_way(clean) -> None:
    # The last node out finishes the run; a node waiting to begin starts the next at once and
    # drops the run keys. The claims gone-marking reads must be renamed by the finish itself,
    # or the next run's start deletes them before the last node reads them.
    server = get_redis(clean.redis_url)

    def run_state() -> RunState:
        return RunState(server, "fin", NodeRegistry(server, keys.nodes_key("fin"), ttl=60), keys.queue_key("fin"))

    last = run_state()
    seen = keys.items_seen_key("fin")
    assert last.begin([seen]).action == "start"
    server.hset(seen, "sku-1", "page")
    closing = f"{seen}:closing:test"
    assert last.leave("finished", [], None, {seen: closing}) == ("finished", 0)
    assert run_state().begin([seen]).action == "start"
    assert server.hgetall(closing) == {b"sku-1": b"page"} and not server.exists(seen)
    assert 0 < server.ttl(closing) <= 7 * 24 * 3600


def test_gone_marking_judges_how_much_the_run_fetched_by_every_node(clean) -> None:
    # The last node out may be one that joined late and fetched nothing: the run fetched the
    # site all the same (its other node did), and what left the site is marked gone.
    from scrapy.utils.test import get_crawler

    from scraper.node import gone

    server = get_redis(clean.redis_url)
    crawler = get_crawler(settings_dict={})
    crawler.stats.set_value("run/id", 4)
    figures = keys.run_figures_key("late", 4)
    server.hset(figures, "late-node", json.dumps({"response_received_count": 0}))
    assert gone._mostly_failed(crawler, server, "late")  # nothing fetched by anyone
    server.hset(figures, "other-node", json.dumps({"response_received_count": 120, "dead_letters/count": 2}))
    assert not gone._mostly_failed(crawler, server, "late")
    server.hset(figures, "other-node", json.dumps({"response_received_count": 120, "dead_letters/count": 130}))
    assert gone._mostly_failed(crawler, server, "late")  # most of what the run asked for failed
