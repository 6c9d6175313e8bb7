"""Processing apart from fetching (``PROCESSING=decoupled``): fetchers hand responses to a Redis
Stream, ``scrapy process`` workers run the callbacks and the pipeline. Real Redis, Postgres and
demo site; processes killed with SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
import zlib
from pathlib import Path

import pytest
from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler
from support.crawls import ROOT, assert_each_product_stored_or_rejected_once, crawl_env, project_with_spider, scrapy_cmd
from support.processes import wait_for
from support.queue import queue_depth

from scraper.demo_site import Catalog, DemoSite
from scraper.processing import entry
from scraper.processing.backpressure import StreamBackpressureMiddleware
from scraper.processing.scheduler import StreamScheduler
from scraper.processing.stream import GROUP, ResponseStream
from scraper.queue import keys
from scraper.scraping_api.standin import StandIn
from scraper.spiders.demo import DemoSpider


class Proc:
    """A scrapy command as a process whose log goes to a file (a pipe nobody reads would stall it)."""

    def __init__(self, env: dict[str, str], *args: str, cwd: Path = ROOT) -> None:
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            scrapy_cmd(*args), cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=self.log, text=True
        )

    def finish(self, timeout: float = 240) -> str:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.seek(0)
        text = self.log.read()
        self.log.close()
        return text


def start_processors(env: dict[str, str], spider: str, redis, count: int = 1, cwd: Path = ROOT) -> list[Proc]:
    """Processors, once a fetcher has joined the run: one that started first would find an empty
    stream and no fetcher, and close after SCHEDULER_IDLE_TIMEOUT (1 s in these tests)."""
    wait_for(lambda: redis.hlen(f"{{{spider}}}:nodes") > 0, timeout=120, step=0.05)
    return [Proc(env, "process", spider, cwd=cwd) for _ in range(count)]


def assert_all_done(clean, spider: str = "demo") -> None:
    redis = clean.redis()
    stream = f"{{{spider}}}:responses"
    assert redis.xlen(stream) == 0
    assert redis.xpending(stream, GROUP)["pending"] == 0
    assert queue_depth(redis, f"{{{spider}}}:requests") == 0
    assert redis.zcard(f"{{{spider}}}:lease_deadlines") == 0 and redis.hlen(f"{{{spider}}}:leased") == 0
    assert redis.llen(f"{{{spider}}}:dead") == 0


# Product pages take 0.1 s of blocking work in the callback: a processor always has some in hand.
SLOW_SPIDER = """
import time

from scraper.spiders.demo import DemoSpider


class SlowSpider(DemoSpider):
    name = "slowproc"

    def parse_product(self, response):
        time.sleep(0.1)
        yield from super().parse_product(response)
"""


def test_two_fetchers_two_processors_one_killed_mid_batch(clean, tmp_path: Path) -> None:
    project = project_with_spider(tmp_path, "slowproc", SLOW_SPIDER)
    catalog = Catalog(products=120)
    with DemoSite(catalog, delay_ms=20) as site:
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            PYTHONPATH=str(project),
            PROCESSING="decoupled",
            PROCESSING_CLAIM_IDLE="2",
            CONCURRENT_REQUESTS="4",
            SCHEDULER_IDLE_TIMEOUT="3",
            METRICS_ENABLED="false",
        )
        fetchers = [Proc(env, "crawl", "slowproc", cwd=project) for _ in range(2)]
        redis = clean.redis()
        processors = start_processors(env, "slowproc", redis, count=2, cwd=project)
        victim = processors[0]

        def victim_holds_entries() -> int:
            if not redis.exists("{slowproc}:responses"):
                return 0
            try:
                consumers = redis.xpending("{slowproc}:responses", GROUP)["consumers"]
            except Exception:
                return 0
            held = sum(int(c["pending"]) for c in consumers if f":{victim.proc.pid}:".encode() in c["name"])
            stored = (
                clean.query("SELECT to_regclass('products') IS NOT NULL")[0][0]
                and clean.query("SELECT count(*) FROM products")[0][0]
            )
            return held if held >= 2 and stored >= 5 else 0

        held = wait_for(victim_holds_entries, timeout=120, step=0.02)
        victim.proc.send_signal(signal.SIGKILL)
        logs = [p.finish() for p in fetchers + processors[1:]]
        victim.finish(timeout=10)
        counts = site.stats()["requests"]
    assert victim.proc.returncode == -signal.SIGKILL
    for log in logs:
        assert "Spider closed (finished)" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    assert held >= 2
    assert "Took over" in logs[-1], logs[-1][-3000:]  # the survivor claimed the victim's entries
    # Every page fetched once: a processor's death costs no refetch, its entries are processed again.
    pages = {p: n for p, n in counts.items() if p != "/robots.txt"}
    assert sorted(pages) == sorted(catalog.pages())
    assert max(pages.values()) == 1
    assert_each_product_stored_or_rejected_once(clean.query, catalog)
    assert_all_done(clean, "slowproc")
    # The victim's consumer was dropped once it held nothing; the survivor left the group as it closed.
    assert clean.redis().xinfo_consumers("{slowproc}:responses", GROUP) == []
    # The run's figures have the processors' items in them (the victim's last ones are counted
    # by the survivor that processed its entries again, as unchanged); the 2 fetchers and the
    # survivor reported, the victim if it got to acknowledge anything before its death.
    [(state, new, unchanged, nodes)] = clean.query(
        "SELECT state, items_new, items_unchanged, nodes_seen FROM crawl_runs WHERE spider = 'slowproc'"
    )
    stored = clean.query("SELECT count(*) FROM products")[0][0]
    assert state == "finished" and 0 < new <= stored <= new + unchanged and nodes >= 3


def test_fetchers_hold_downloads_while_the_stream_is_full_and_no_secret_enters_it(clean, tmp_path: Path) -> None:
    project = project_with_spider(tmp_path, "slowproc", SLOW_SPIDER)
    key = "canary-" + "k3y" * 4
    limit, concurrency = 10, 4
    catalog = Catalog(products=60)
    with DemoSite(catalog) as site, StandIn(key) as api:
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            PYTHONPATH=str(project),
            PROCESSING="decoupled",
            PROCESSING_MAX_PENDING=str(limit),
            CONCURRENT_REQUESTS=str(concurrency),
            SCRAPING_API_KEY=key,
            SCRAPING_API_URL=api.url,
            METRICS_ENABLED="false",
        )
        # One processor, slower than the fetcher: without the bound the stream would take every page.
        fetcher = Proc(env, "crawl", "slowproc", cwd=project)
        redis = clean.redis()
        [processor] = start_processors(env, "slowproc", redis, cwd=project)
        lengths, entries = [], []
        deadline = time.monotonic() + 240
        while fetcher.proc.poll() is None and time.monotonic() < deadline:
            lengths.append(redis.xlen("{slowproc}:responses"))
            if lengths[-1] >= limit and not entries:
                entries = redis.xrange("{slowproc}:responses")
            time.sleep(0.02)
        logs = [fetcher.finish(), processor.finish()]
    for log in logs:
        assert "Spider closed (finished)" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    assert "holding new downloads" in logs[0]
    # Full, but never more than the limit and the downloads that were under way when it filled.
    assert limit <= max(lengths) <= limit + concurrency, max(lengths)
    assert entries
    for _, fields in entries:
        text = fields[b"m"] + zlib.decompress(fields[b"b"])
        assert key.encode() not in text
        head = fields[b"m"].lower()
        for name in (b'"cookie"', b'"set-cookie"', b'"authorization"', b'"x-api-key"'):
            assert name not in head
        assert b"scraping_api" in head  # fetched through the API: its flag came along
    assert_each_product_stored_or_rejected_once(clean.query, catalog)
    assert_all_done(clean, "slowproc")


# --- the stream's consumer group, in process ----------------------------------------------------


def _processor(clean, consumer: str, **settings: str) -> StreamScheduler:
    crawler = get_crawler(
        DemoSpider,
        {
            "REDIS_URL": clean.redis_url,
            "PROCESSING": "decoupled",
            "PROCESSING_PROCESSOR": True,
            "PROCESSING_CLAIM_IDLE": "0.1",
            "DEMO_SITE_URL": "http://shop.test/",
            **settings,
        },
    )
    crawler.spider = crawler._create_spider()
    scheduler = StreamScheduler.from_crawler(crawler)
    scheduler.open(crawler.spider)
    scheduler._loop.stop()  # no reactor runs here: each step below is called by hand
    scheduler.stream.consumer = consumer
    return scheduler


def _add_product_page(clean, number: int) -> None:
    spider = DemoSpider()
    request = Request(
        f"http://shop.test/p/{number}.html",
        callback=spider.parse_product,
        headers={"Authorization": "Basic c2VjcmV0", "Cookie": "session=secret"},
    )
    response = HtmlResponse(
        request.url,
        body=b"<html><h1 class=title>Kettle</h1></html>",
        request=request,
        headers={"Set-Cookie": "session=secret", "Content-Type": "text/html"},
    )
    ResponseStream(clean.redis(), "demo").add(entry.encode(request, response, spider, 1, {}))


def test_an_entry_delivered_max_deliveries_times_becomes_a_dead_letter(clean) -> None:
    _add_product_page(clean, 7)
    redis = clean.redis()
    # Three processors take the page in turn and die with it (never acknowledged, never renewed).
    for n in range(1, 4):
        scheduler = _processor(clean, f"dies-{n}", PROCESSING_MAX_DELIVERIES="3")
        request = scheduler.next_request()
        assert request is not None and request.url == "http://shop.test/p/7.html"
        assert request.callback.__name__ == "parse_product"
        response = scheduler.payloads[request.meta["_stream_entry"]].to_response(request)
        assert b"Kettle" in response.body and b"secret" not in bytes(str(response.headers), "utf-8")
        pending = redis.xpending_range("{demo}:responses", GROUP, min="-", max="+", count=10)
        assert [p["times_delivered"] for p in pending] == [n]
        time.sleep(0.15)  # past PROCESSING_CLAIM_IDLE
    # The fourth takes it over and sets it aside instead of processing it a fourth time.
    fourth = _processor(clean, "fourth", PROCESSING_MAX_DELIVERIES="3")
    assert fourth.next_request() is None
    letters = [l for _, l in fourth.dead_letters.entries()]
    assert len(letters) == 1
    assert letters[0]["url"] == "http://shop.test/p/7.html" and letters[0]["attempts"] == 3
    assert letters[0]["reason"].startswith("processing: delivered 3 times (PROCESSING_MAX_DELIVERIES=3)")
    assert b"secret" not in redis.lindex("{demo}:dead", 0)
    assert redis.xlen("{demo}:responses") == 0
    assert redis.xpending("{demo}:responses", GROUP)["pending"] == 0


def test_an_unsigned_entry_is_set_aside_and_the_next_one_processed_once(clean) -> None:
    _add_product_page(clean, 1)
    stream = ResponseStream(clean.redis(), "demo")
    [(_, fields)] = clean.redis().xrange("{demo}:responses")
    stream.add({b"m": fields[b"m"].replace(b"/p/1.html", b"/p/9.html"), b"b": fields[b"b"], b"s": fields[b"s"]})
    _add_product_page(clean, 2)
    clean.redis().hset("{demo}:run", mapping={"id": 1, "state": "running"})  # the fetchers' run
    processor = _processor(clean, "only")
    got = [processor.next_request(), processor.next_request(), processor.next_request()]
    assert [r.url.rsplit("/", 1)[1] for r in got if r is not None] == ["1.html", "2.html"]
    letters = [l for _, l in processor.dead_letters.entries()]
    assert [l["reason"] for l in letters] == ["unsigned"]
    # Counted in the run's figures before the entry left the stream: it may be the run's last.
    reported = json.loads(clean.redis().hget(keys.run_figures_key("demo", 1), "process:only"))
    assert reported["dead_letters/count"] == 1


def test_a_closing_processor_gives_back_what_it_read_and_did_not_process(clean) -> None:
    for number in (1, 2):
        _add_product_page(clean, number)
    first = _processor(clean, "first")
    assert first.next_request().url.endswith("/p/1.html")  # both read, one handed to the engine
    first.stats.set_value("postgres/inserted", 1)  # what the engine did with it before the close
    first.close("shutdown")
    redis = clean.redis()
    assert redis.xlen("{demo}:responses") == 1  # the one handed out counts as done: the engine drained
    # ... and counted in the run's figures before it was acknowledged.
    reported = json.loads(redis.hget(keys.run_figures_key("demo", 1), "process:first"))
    assert reported["postgres/inserted"] == 1
    second = _processor(clean, "second")
    request = second.next_request()  # no longer new: taken over at once, not after the idle time
    assert request is not None and request.url.endswith("/p/2.html")
    pending = redis.xpending_range("{demo}:responses", GROUP, min="-", max="+", count=10)
    assert [(p["consumer"], p["times_delivered"]) for p in pending] == [(b"second", 1)]


def test_a_processor_late_to_renew_does_not_take_back_what_it_holds(clean) -> None:
    # A reactor busy past PROCESSING_CLAIM_IDLE: XAUTOCLAIM hands the processor its own entries
    # back. They are in hand: read again they would be processed twice at once, their rows
    # counted new twice.
    for number in (1, 2):
        _add_product_page(clean, number)
    slow = _processor(clean, "slow")
    handed = [slow.next_request(), slow.next_request()]
    assert [r.url.rsplit("/", 1)[1] for r in handed] == ["1.html", "2.html"]
    time.sleep(0.15)  # past PROCESSING_CLAIM_IDLE, never renewed
    assert slow.next_request() is None
    assert slow.stats.get_value("processing/claimed") is None
    assert slow.stats.get_value("processing/entries") == 2
    pending = clean.redis().xpending_range("{demo}:responses", GROUP, min="-", max="+", count=10)
    assert [p["times_delivered"] for p in pending] == [1, 1]  # taking back its own was no delivery
    # Another processor still takes them over when this one stays silent.
    time.sleep(0.15)
    other = _processor(clean, "other")
    assert other.next_request().url.endswith("/p/1.html")
    assert other.stats.get_value("processing/claimed") == 2


def test_the_fetchers_bound_counts_the_downloads_it_lets_through(clean) -> None:
    for number in range(3):
        _add_product_page(clean, number)
    crawler = get_crawler(
        DemoSpider,
        {
            "REDIS_URL": clean.redis_url,
            "PROCESSING": "decoupled",
            "PROCESSING_MAX_PENDING": "5",
            "DEMO_SITE_URL": "http://shop.test/",
        },
    )
    crawler.spider = crawler._create_spider()
    middleware = StreamBackpressureMiddleware.from_crawler(crawler)
    middleware.look_every = 3600  # one look at the stream for the whole test

    def let_through() -> bool:
        request = Request("http://shop.test/p/9.html", callback=crawler.spider.parse_product)
        step = middleware.process_request(request)
        try:
            step.send(None)
        except StopIteration:
            return True
        step.close()  # held: it waits for room
        return False

    # 3 in the stream, limit 5: two downloads may start before the next look, not more.
    assert [let_through() for _ in range(4)] == [True, True, False, False]
    assert crawler.stats.get_value("processing/backpressure_waits") == 2
    clean.redis().delete("{demo}:responses")  # the processors caught up
    middleware._looked_at = float("-inf")
    assert let_through()


@pytest.mark.parametrize(
    "name, value",
    [
        ("PROCESSING", "sideways"),
        ("PROCESSING_MAX_PENDING", "lots"),
        ("PROCESSING_CLAIM_IDLE", "0"),
        ("PROCESSING_MAX_DELIVERIES", "0"),
    ],
)
def test_a_bad_processing_setting_fails_at_start_naming_it(clean, name: str, value: str) -> None:
    # `scrapy process` is decoupled whatever PROCESSING says; its other settings it checks too.
    for command in ("crawl",) if name == "PROCESSING" else ("crawl", "process"):
        result = subprocess.run(
            scrapy_cmd(command, "demo"),
            cwd=ROOT,
            env=crawl_env(clean, **{name: value}),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2, result.stderr[-2000:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith(f"error: {name}:"), result.stderr[-2000:]
        assert "Traceback" not in result.stderr


def test_a_database_outage_pauses_processors_not_fetchers(clean, tmp_path: Path) -> None:
    from support.servers import StoppablePostgres

    postgres = StoppablePostgres(tmp_path / "pg")
    limit = 30
    catalog = Catalog(products=150)
    try:
        with DemoSite(catalog, delay_ms=20) as site:
            env = crawl_env(
                clean,
                DATABASE_URL=postgres.url,
                DEMO_SITE_URL=site.url,
                PROCESSING="decoupled",
                PROCESSING_MAX_PENDING=str(limit),
                PROCESSING_CLAIM_IDLE="2",
                CONCURRENT_REQUESTS="4",
                POSTGRES_RETRY_TIMEOUT="300",
                SCHEDULER_IDLE_TIMEOUT="5",
                METRICS_ENABLED="false",
            )
            fetcher = Proc(env, "crawl", "demo")
            redis = clean.redis()
            [processor] = start_processors(env, "demo", redis)
            wait_for(lambda: postgres.count("products") >= 15, timeout=120)
            postgres.stop()
            # The processor cannot commit, so it acknowledges nothing; the fetcher goes on until the
            # stream holds its bound.
            wait_for(lambda: redis.xlen("{demo}:responses") >= limit, timeout=120)
            time.sleep(3 * 2)  # past PROCESSING_CLAIM_IDLE several times over
            pending = redis.xpending_range("{demo}:responses", GROUP, min="-", max="+", count=1000)
            postgres.start()
            logs = [fetcher.finish(), processor.finish()]
        for log in logs:
            assert "Spider closed (finished)" in log, log[-3000:]
            assert "Traceback" not in log, log[-3000:]
        assert "holding new downloads" in logs[0]
        assert "Database unavailable" in logs[1]
        # Held by the paused processor all along, renewed: never taken over, never dead-lettered.
        assert pending and all(p["times_delivered"] == 1 for p in pending)
        assert "Took over" not in logs[1]
        assert_each_product_stored_or_rejected_once(postgres.query, catalog)
        assert_all_done(clean)
    finally:
        try:
            postgres.server.cleanup()
        except Exception:
            pass


def test_a_decoupled_run_marks_gone_what_its_processors_did_not_see(clean, site) -> None:
    env = crawl_env(clean, DEMO_SITE_URL=site.url, PROCESSING="decoupled", METRICS_ENABLED="false")
    redis = clean.redis()

    def run() -> str:
        fetcher = Proc(env, "crawl", "demo")
        [processor] = start_processors(env, "demo", redis)
        logs = [fetcher.finish(), processor.finish()]
        for log in logs:
            assert "Spider closed (finished)" in log and "Traceback" not in log, log[-3000:]
        return logs[0]

    run()
    removed = site.remove(3)
    skus = {site.catalog.with_removed(()).product(pid).sku for pid in removed}
    log = run()
    assert {sku for (sku,) in clean.query("SELECT sku FROM products WHERE gone_at IS NOT NULL")} == skus
    assert "3 row(s) not seen in it marked gone" in log


def test_a_decoupled_run_is_checked_with_its_processors_items(clean, site) -> None:
    # The processors store the items, the fetcher checks the run: with the items counted where
    # they are stored, two healthy runs are OK (exit 0), the second judged against the first.
    env = crawl_env(clean, DEMO_SITE_URL=site.url, PROCESSING="decoupled", METRICS_ENABLED="false")
    del env["QUALITY_FAIL_EXIT"]  # the default: a degraded run exits 3
    redis = clean.redis()
    for run_id in (1, 2):
        fetcher = Proc(env, "crawl", "demo")
        processors = start_processors(env, "demo", redis, count=2)
        logs = [fetcher.finish()] + [p.finish() for p in processors]
        assert fetcher.proc.returncode == 0, logs[0][-3000:]
        assert f"Data quality of run {run_id} of demo: OK" in logs[0], logs[0][-3000:]
        for log in logs[1:]:
            assert "Spider closed (finished)" in log and "Traceback" not in log, log[-3000:]
    assert "compared with run 1" in logs[0]
    stored = clean.query("SELECT count(*) FROM products")[0][0]
    rejected = clean.query("SELECT count(*) FROM rejects")[0][0]
    figures = dict(clean.query("SELECT run_id, figures FROM run_quality"))
    for run_id in (1, 2):
        assert figures[run_id]["items/stored"] == stored and figures[run_id]["items/rejected"] == rejected
        assert figures[run_id]["coverage/ProductItem/title"] == stored  # field coverage, from the processors
    # Pages (and robots.txt) counted once, by the fetcher: a processor's come from the stream.
    assert figures[1]["pages"] == len(site.catalog.pages()) + 1
