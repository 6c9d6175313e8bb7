"""Metrics: a real Prometheus scrapes real crawls; the exposition is valid; no port clashes; no secrets."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from support.binaries import ensure_binary
from support.crawls import crawl_env
from support.processes import fetch, free_port, prometheus_ready, start_crawl, wait_for
from support.stats import stat

from scraper.demo_site import Catalog, DemoSite
from scraper.scraping_api.standin import StandIn

CANARY = "Canary-metrics-5521"


@pytest.fixture
def slow_site():
    # Slow enough that a crawl lasts several seconds: long enough to be scraped while it runs.
    with DemoSite(Catalog(products=60), delay_ms=60) as site:
        yield site


def test_two_processes_expose_metrics_without_clashing(clean, slow_site: DemoSite, tmp_path: Path) -> None:
    base = free_port()
    env = crawl_env(
        clean,
        DEMO_SITE_URL=slow_site.url,
        METRICS_PORT=str(base),
        METRICS_PORT_RANGE="20",
        METRICS_FILE_SD_DIR=str(tmp_path),
        CONCURRENT_REQUESTS_PER_DOMAIN="2",
        SCHEDULER_IDLE_TIMEOUT="2",
    )
    procs = [start_crawl(env) for _ in range(2)]
    try:
        files = wait_for(lambda: sorted(tmp_path.glob("*.json")) if len(list(tmp_path.glob("*.json"))) == 2 else None)
        targets = [json.loads(f.read_text())[0] for f in files]
        addresses = sorted(t["targets"][0] for t in targets)
        assert len(set(addresses)) == 2 and all(a.startswith("127.0.0.1:") for a in addresses)
        assert len({t["labels"]["node"] for t in targets}) == 2
        for address in addresses:
            assert 'scraper_spider_open{spider="demo"} 1.0' in fetch(f"http://{address}/metrics")
    finally:
        outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    assert list(tmp_path.glob("*.json")) == []  # each process withdrew its target


def test_exposition_is_valid_and_holds_no_secret(clean, slow_site: DemoSite, tmp_path: Path) -> None:
    promtool = ensure_binary("promtool", "prometheus")
    port = free_port()
    database_url = (
        clean.database_url.replace("postgres@", f"postgres:{CANARY}@", 1)
        if "postgres@" in clean.database_url
        else clean.database_url.replace("postgres:@", f"postgres:{CANARY}@", 1)
    )
    api = StandIn(CANARY).start()  # the key is really used: pages go through the local API stand-in
    env = crawl_env(
        clean,
        DATABASE_URL=database_url,
        DEMO_SITE_URL=slow_site.url,
        METRICS_PORT=str(port),
        METRICS_PORT_RANGE="1",
        METRICS_FILE_SD_DIR=str(tmp_path),
        SCRAPING_API_KEY=CANARY,
        SCRAPING_API_URL=api.url,
        CONCURRENT_REQUESTS_PER_DOMAIN="2",
    )
    proc = start_crawl(env)
    try:
        wait_for(lambda: "scraper_pipeline_seconds_count{" in _try_fetch(port))  # an item was committed
        text = fetch(f"http://127.0.0.1:{port}/metrics")
    finally:
        _out, err = proc.communicate(timeout=120)
        api.stop()
    assert proc.returncode == 0, err[-2000:]
    assert CANARY not in text and CANARY not in err
    assert 'scraper_api_credits_total{spider="demo"} 0.0' not in text  # credits were spent and counted
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    for name in (
        "scraper_requests_total",
        "scraper_queue_depth",
        "scraper_dupefilter_size",
        "scraper_processing_pending_responses",
        "scraper_processing_max_pending_responses",
        "scraper_download_latency_seconds_bucket",
        "scraper_items_scraped_total",
        "scraper_storage_pending_rows",
        "scraper_pipeline_seconds_count",
    ):
        assert f"\n{name}{{" in text, name


def _try_fetch(port: int) -> str:
    try:
        return fetch(f"http://127.0.0.1:{port}/metrics")
    except OSError:
        return ""


def test_prometheus_scrapes_a_crawl_and_its_counters_equal_scrapy_stats(clean, tmp_path: Path) -> None:
    prometheus = ensure_binary("prometheus", "prometheus")
    targets = tmp_path / "targets"
    targets.mkdir()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: scraper\n"
        f"    file_sd_configs: [{{files: ['{targets}/*.json'], refresh_interval: 1s}}]\n"
    )
    prom_port = free_port()
    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    api = f"http://127.0.0.1:{prom_port}/api/v1"

    def query(expr: str) -> list:
        body = json.loads(fetch(f"{api}/query?query={urllib.parse.quote(expr)}"))
        assert body["status"] == "success", body
        return body["data"]["result"]

    # Prometheus applies newly discovered targets every 5 s: the crawl must outlast that.
    slow_site = DemoSite(Catalog(products=150), delay_ms=250).start()
    try:
        wait_for(lambda: prometheus_ready(prom_port), timeout=60)
        env = crawl_env(
            clean,
            DEMO_SITE_URL=slow_site.url,
            METRICS_PORT=str(free_port()),
            METRICS_PORT_RANGE="20",
            METRICS_FILE_SD_DIR=str(targets),
            METRICS_LINGER="4",
            CONCURRENT_REQUESTS_PER_DOMAIN="2",
            CONCURRENT_REQUESTS="2",
        )
        proc = start_crawl(env)
        # While the crawl runs, Prometheus finds it through the target file and scrapes it.
        try:
            # Over a range: once the crawl ends its target goes away and its series go stale.
            wait_for(lambda: query('max_over_time(scraper_spider_open{spider="demo"}[5m]) == 1'), timeout=60)
        except AssertionError:
            proc.proc.kill()
            log = proc.communicate(timeout=30)[1]
            raise AssertionError(
                f"Prometheus never saw the crawl running: {fetch(f'{api}/targets')[:1500]}\n{log[-2000:]}"
            ) from None
        _out, log = proc.communicate(timeout=180)
        assert proc.returncode == 0, log[-2000:]
        time.sleep(1.5)  # one more evaluation after the last scrape

        def last(expr: str) -> float:
            result = query(f"last_over_time({expr}[1m])")
            assert result, expr
            return sum(float(r["value"][1]) for r in result)

        assert last("scraper_requests_total") == stat(log, "downloader/request_count")
        assert last('scraper_responses_total{status_class="2xx"}') == stat(log, "downloader/response_status_count/200")
        assert last("scraper_items_scraped_total") == stat(log, "items/yielded")
        assert last('scraper_items_stored_total{outcome="inserted"}') == stat(log, "postgres/inserted")
        assert last('scraper_items_dropped_total{reason="rejected"}') == stat(log, "item_rejected_count")
        assert last("scraper_queue_dequeued_total") == stat(log, "scheduler/dequeued/redis")
        assert last("scraper_download_latency_seconds_count") == stat(log, "response_received_count")
        assert stat(log, "postgres/inserted") == len(slow_site.catalog.valid_products())
    finally:
        slow_site.stop()
        server.terminate()
        server.wait(timeout=30)
