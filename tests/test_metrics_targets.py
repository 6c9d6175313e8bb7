"""A metrics target file never outlives its process, so Prometheus never sums the dead with the live."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.parse
from pathlib import Path

from support.binaries import ensure_binary
from support.crawls import crawl_env, run_scrapy
from support.processes import fetch, free_port, start_crawl, wait_for
from support.processes import prometheus_ready as _ready
from support.stats import stat

from scraper.demo_site import Catalog, DemoSite


def test_a_killed_crawls_target_is_swept_and_prometheus_sums_only_the_live(clean, tmp_path: Path) -> None:
    prometheus = ensure_binary("prometheus", "prometheus")
    targets = tmp_path / "targets"
    targets.mkdir()
    base = free_port()
    with DemoSite(Catalog(products=40), delay_ms=60) as site:
        env = crawl_env(
            clean,
            DEMO_SITE_URL=site.url,
            METRICS_PORT=str(base),
            METRICS_PORT_RANGE="20",
            METRICS_FILE_SD_DIR=str(targets),
            CONCURRENT_REQUESTS_PER_DOMAIN="2",
            SCHEDULER_LEASE_TIMEOUT="3",
        )  # the killed crawl's leases come back soon
        # Other commands announce nothing.
        assert run_scrapy(env, "queue", "demo", "--json", "--interval", "0.1").returncode == 0
        assert list(targets.glob("*.json")) == []

        victim = start_crawl(env)
        [dead_file] = wait_for(lambda: list(targets.glob("*.json")), timeout=60)
        victim.proc.send_signal(signal.SIGKILL)
        victim.communicate(timeout=10)
        assert dead_file.exists()  # nothing of the killed process ran to remove it

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
        try:
            wait_for(lambda: _ready(prom_port), timeout=60)
            # The next crawl finds the dead one's port free: a target file left behind would make
            # Prometheus scrape it twice, under two node labels, if it took that port.
            live = start_crawl({**env, "METRICS_LINGER": "8"})
            wait_for(lambda: not dead_file.exists(), timeout=60)
            _out, log = live.communicate(timeout=180)
            assert live.returncode == 0, log[-2000:]
            # Nor does it take that port: Prometheus may scrape a removed target a few seconds more.
            assert f"127.0.0.1:{base}/metrics" not in log and "Metrics at http://127.0.0.1:" in log
            assert "Removed 1 metrics target file(s) of processes that are gone" in log
            time.sleep(1.5)  # one more evaluation after the last scrape

            def last(expr: str) -> float:
                url = f"http://127.0.0.1:{prom_port}/api/v1/query?query=" + urllib.parse.quote(
                    f"last_over_time({expr}[2m])"
                )
                result = json.loads(fetch(url))["data"]["result"]
                assert result, expr
                return sum(float(r["value"][1]) for r in result)

            assert last("scraper_requests_total") == stat(log, "downloader/request_count")
            assert last("scraper_items_scraped_total") == stat(log, "items/yielded")
            assert list(targets.glob("*.json")) == []
            # The run, as an info metric: the live crawl resumed the killed one's run.
            # (A new one if the kill came before the killed crawl queued anything.)
            resumed = "resuming run 1 of demo" in log
            assert resumed or "starting run 2 of demo" in log, log[-3000:]
            assert last(f'scraper_run_info{{run="{1 if resumed else 2}",state="finished"}}') == 1
            assert last("scraper_run_nodes") == (2 if resumed else 1)
        finally:
            server.terminate()
            server.wait(timeout=30)
